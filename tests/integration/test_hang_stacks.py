"""A hang fault's stacks, from the fault key to ``recoverctl events / timeline / stacks``, with real services.

The stacks are captured for real (``capture_stacks`` through faulthandler, so no ptrace rights are
needed) from scenario processes: three ranks blocked in all_reduce, the hung one in Event.wait. The
test writes them in a Fault to the fault key as an agent would; the coordinator consumes the key,
keeps the stacks in one bounded ``hang_stacks`` event, and recoverctl shows them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from recoverd import hangstacks, validate
from recoverd.agent.stacks import StackTarget, capture_stacks
from recoverd.records import encode, pb, ts_from_s

from .cluster import Cluster
from .ctl_schemas import check

pytestmark = pytest.mark.etcd

JOB = "job-stacks"
SCENARIO = Path(__file__).resolve().parents[1] / "fixtures" / "stacks" / "scenario.py"
SUMMARY = "3 ranks in all_reduce (0, 1, 3); rank 2 in Event.wait"


@pytest.fixture
def rank_like(tmp_path: Path) -> Iterator[dict[int, StackTarget]]:
    """Scenario processes as ranks 0-3, armed for faulthandler: rank 2 in Event.wait, the others in all_reduce."""
    procs = []
    targets = {}
    env = {**os.environ, "RECOVERD_STACK_DIR": str(tmp_path / "stacks")}
    for rank in range(4):
        name = "event_wait" if rank == 2 else "all_reduce"
        proc = subprocess.Popen(
            [sys.executable, str(SCENARIO), name, "--arm", str(rank)], stdout=subprocess.PIPE, text=True, env=env
        )
        procs.append(proc)
        assert proc.stdout is not None
        _, signum, path = proc.stdout.readline().split()
        targets[rank] = StackTarget(rank=rank, pid=proc.pid, stack_signal=int(signum), dump_path=path)
    time.sleep(0.3)
    yield targets
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


def _ctl(cluster: Cluster, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("RECOVERD_ETCD", "RECOVERD_PREFIX")}
    proc = subprocess.run(
        [sys.executable, "-m", "recoverd.cli.ctl", "--etcd", cluster.endpoint, "--prefix", cluster.prefix, *args],
        capture_output=True,
        text=True,
        timeout=15,
        env={**env, "GRPC_VERBOSITY": "ERROR"},
    )
    assert proc.returncode == 0, f"recoverctl {' '.join(args)} exited {proc.returncode}: {proc.stderr}"
    assert "Traceback" not in proc.stderr
    return proc.stdout


def _hang_fault(rank: int, stacks: list[pb.RankStack]) -> pb.Fault:
    return pb.Fault(
        fault_id=f"node0.r{rank}.hang.g0",
        rank=rank,
        node="node0",
        fault_type="1",
        source=pb.SOURCE_AGENT,
        generation=0,
        detected_at=ts_from_s(time.time()),
        detail="no progress for 30s",
        kind="hang",
        stacks=stacks,
    )


def _recovery_done(cluster: Cluster, after: int) -> pb.Recovery:
    def done() -> pb.Recovery | None:
        rec = cluster.view(JOB).recovery
        return rec if rec is not None and rec.recovery_id > after and rec.phase == pb.PHASE_DONE else None

    return cluster.wait_for(f"recovery {after + 1} to finish", done)


def test_hang_stacks_reach_events_timeline_and_stacks(cluster: Cluster, rank_like: dict[int, StackTarget]) -> None:
    cluster.coordinator()
    cluster.strategy()
    cluster.agent(JOB, strategies="recover-in-place,exit")
    cluster.wait_running(JOB, 4)
    run = cluster.view(JOB).run
    assert run is not None

    # The hung rank first, then its node's peers: what the agent's hang detector passes.
    targets = [rank_like[2], rank_like[0], rank_like[1], rank_like[3]]
    stacks = asyncio.run(capture_stacks(targets, py_spy=False))
    assert [(s.rank, s.where) for s in stacks] == [
        (2, "Event.wait"),
        (0, "all_reduce"),
        (1, "all_reduce"),
        (3, "all_reduce"),
    ]
    fault = _hang_fault(2, stacks)
    key = cluster.keys.fault(run, fault.fault_id)
    cluster.put(key, encode(fault))

    first = _recovery_done(cluster, 0)
    assert cluster.get(key) is None  # consumed
    assert [f.rank for f in first.faults] == [2] and not first.faults[0].stacks  # the record stays small
    (event,) = [e for e in cluster.events(JOB) if e.reason == hangstacks.REASON]
    assert event.source == "coordinator" and event.rank == 2 and event.node == "node0"
    assert event.message == f"stacks at rank 2's hang: {SUMMARY}"
    assert event.data["recovery"] == str(first.recovery_id) and event.data["fault_id"] == fault.fault_id

    # recoverctl events: the grouped summary on the event's line.
    (line,) = [ln for ln in _ctl(cluster, "events", JOB).splitlines() if ln.split()[2] == hangstacks.REASON]
    assert SUMMARY in line and "rank=2" in line and "node=node0" in line

    # recoverctl timeline: the summary under the recovery's header, and in --json.
    timeline = _ctl(cluster, "timeline", JOB).splitlines()
    assert timeline[1] == f"stacks at rank 2 on node0: {SUMMARY} (recoverctl stacks)"
    data = check("timeline", json.loads(_ctl(cluster, "timeline", JOB, "--json")))
    assert data["stacks"] == [{"fault_id": fault.fault_id, "rank": 2, "node": "node0", "summary": SUMMARY}]

    # recoverctl stacks: every stack in full, the hung rank first.
    text = _ctl(cluster, "stacks", JOB)
    lines = text.splitlines()
    assert lines[0].startswith(
        f"recovery {first.recovery_id}: hang of rank 2 on node0 ({fault.fault_id}), stacks taken "
    )
    assert lines[1] == f"  {SUMMARY}"
    heads = [ln for ln in lines if ln.startswith("--- ")]
    pids = {t.rank: t.pid for t in targets}
    assert heads == [
        f"--- rank 2  pid {pids[2]}  faulthandler  in Event.wait",
        f"--- rank 0  pid {pids[0]}  faulthandler  in all_reduce",
        f"--- rank 1  pid {pids[1]}  faulthandler  in all_reduce",
        f"--- rank 3  pid {pids[3]}  faulthandler  in all_reduce",
    ]
    assert text.count("distributed_c10d.py") >= 3 and "in wait_for_signal" in text
    only = _ctl(cluster, "stacks", JOB, "--rank", "0")
    assert [ln for ln in only.splitlines() if ln.startswith("--- ")] == [heads[1]]

    # A second hang with stacks far over the bounds: stored cut, and the first stays readable.
    pad = "\n" + '  File "/x.py", line 1 in pad\n' * 1500
    big = [pb.RankStack(rank=s.rank, pid=s.pid, tool=s.tool, text=s.text + pad) for s in stacks]
    assert sum(len(s.text) for s in big) > 2 * hangstacks.MAX_STACKS_BYTES
    raw = encode(_hang_fault(1, big))
    assert len(raw) < validate.MAX_VALUE_BYTES  # a larger fault is bad input, dropped: agents bound it first
    cluster.put(cluster.keys.fault(run, "node0.r1.hang.g0"), raw)
    second = _recovery_done(cluster, first.recovery_id)
    events = [e for e in cluster.events(JOB) if e.reason == hangstacks.REASON]
    assert len(events) == 2
    assert len(encode(events[1])) <= hangstacks.MAX_STACKS_BYTES + 2048
    latest = check("stacks", json.loads(_ctl(cluster, "stacks", JOB, "--json")))
    assert [(h["recovery"], h["rank"]) for h in latest] == [(second.recovery_id, 1)]
    assert all(len(s["text"].encode()) <= hangstacks.MAX_TEXT_BYTES for s in latest[0]["stacks"])
    assert all("[truncated:" in s["text"] for s in latest[0]["stacks"])
    assert latest[0]["summary"] == SUMMARY  # where comes from the whole text, before the cut
    earlier = json.loads(_ctl(cluster, "stacks", JOB, "--recovery", str(first.recovery_id), "--json"))
    assert [h["summary"] for h in earlier] == [SUMMARY]
    assert (
        _ctl(cluster, "stacks", JOB, "--recovery", "999").strip() == f"no stacks recorded for job {JOB} in recovery 999"
    )
