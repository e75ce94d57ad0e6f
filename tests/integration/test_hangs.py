"""Hangs end to end: real agents, real etcd, real rank processes that stop making progress.

A rank that reports progress (``taskd_client.heartbeat``) or prints a line matching the job's
``hang.log_pattern`` and then falls silent — SIGSTOPped, or deadlocked — becomes a ``hang`` fault
and is recovered by the ladder (recover-in-place here); its peers, including a slow one that keeps
stepping, are untouched. The timings are recorded in the events, not asserted: ``make bench``
measures them.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from recoverd import hangstacks
from recoverd.records import pb

from .cluster import Cluster

pytestmark = pytest.mark.etcd

#: The harness's fast phase deadlines (3 s to stop, 5 s to recover) escalate to `exit` on a loaded
#: machine; these tests check that only the hung rank is restarted, so they give the phases time.
PATIENT = ["--stop-timeout", "30", "--strategies-timeout", "30", "--recover-timeout", "60"]

#: A short start-up allowance and straggler window so the tests do not wait long; the learned
#: timeout is the default's (measured by ``make bench-hangs``).
POLICY = """
strategies: [recover-in-place, exit]
hang:
  startup: 3
  warmup_steps: 2
  straggler_window: 2
"""


def _policy(tmp_path: Path, text: str = POLICY) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return str(path)


def _log_has(cluster: Cluster, job: str, rank: int, text: str) -> bool:
    path = cluster.workdir / f"logs-{job}-node0" / f"rank{rank}.log"
    return path.exists() and text in path.read_text(errors="replace")


def _stacks_of(cluster: Cluster, job: str) -> hangstacks.HangStacks:
    """The hang_stacks event of the job's (first) hang."""
    return cluster.wait_for(
        "the hang's stacks",
        lambda: next(filter(None, map(hangstacks.from_event, cluster.events(job))), None),
    )


def _hang_recovered(cluster: Cluster, job: str, rank: int, old_pid: int) -> pb.Recovery:
    """Wait until ``rank`` (pid ``old_pid``) was recovered from a hang; return the recovery."""

    def done() -> pb.Recovery | None:
        view = cluster.view(job)
        rec = view.recovery
        ranks = view.ranks.get("node0")
        if rec is None or rec.phase != pb.PHASE_DONE or ranks is None:
            return None
        now = {r.rank: r for r in ranks.ranks}
        back = now[rank].state == pb.RANK_RUNNING and now[rank].pid != old_pid
        return rec if back else None

    return cluster.wait_for(f"rank {rank}'s hang to be recovered", done, timeout=60)


def test_a_sigstopped_rank_is_a_hang_recovered_in_place_its_slow_peer_is_not(cluster: Cluster, tmp_path: Path) -> None:
    cluster.coordinator(extra=PATIENT)
    cluster.strategy()
    worker = ["--steps", "100000", "--step-time", "0.1", "--heartbeat", "--slow-rank", "3", "--slow-factor", "10"]
    cluster.agent("job-hang", worker=worker, extra=["--policy", _policy(tmp_path)])
    before = cluster.wait_running("job-hang", 4)
    cluster.wait_for("rank 2 past warm-up", lambda: _log_has(cluster, "job-hang", 2, "rank 2 step 8"))
    # The slow rank is a straggler (an event, not a fault): 10 x its peers' step time for 2 s.
    straggler = cluster.wait_for(
        "rank 3 to be reported a straggler",
        lambda: next((e for e in cluster.events("job-hang") if e.reason == "straggler"), None),
        timeout=30,
    )
    assert straggler.rank == 3 and float(straggler.data["ratio"]) > 5

    stopped_at = time.time()
    os.kill(before[2].pid, signal.SIGSTOP)
    recovery = _hang_recovered(cluster, "job-hang", 2, before[2].pid)

    assert recovery.strategy == "recover-in-place"
    assert [(f.rank, f.kind) for f in recovery.faults] == [(2, "hang")]
    fault = recovery.faults[0]
    assert "made no progress" in fault.detail and "(process stopped)" in fault.detail
    detected_after = fault.detected_at.ToNanoseconds() / 1e9 - stopped_at
    print(f"SIGSTOP -> hang fault: {detected_after:.2f}s; detail: {fault.detail}")
    after = cluster.ranks("job-hang")
    for rank in (0, 1, 3):  # the slow rank 3 kept stepping: not a hang
        assert after[rank].pid == before[rank].pid and after[rank].restart_count == 0
    assert after[2].restart_count == 1
    assert all(e.rank == 3 for e in cluster.events("job-hang") if e.reason == "straggler")
    # Where each rank was when rank 2 was found hung: all four read (py-spy reads a stopped process).
    stacks = _stacks_of(cluster, "job-hang")
    assert stacks.stacks[0].rank == 2 and sorted(s.rank for s in stacks.stacks) == [0, 1, 2, 3]
    by_rank = {s.rank: s for s in stacks.stacks}
    assert all(by_rank[r].text and by_rank[r].where for r in (0, 1, 3)), stacks.stacks
    # py-spy reads a stopped process; without ptrace rights faulthandler cannot run in it, and says so.
    assert by_rank[2].text or "stopped" in by_rank[2].error, by_rank[2]
    print(f"stacks: {stacks.summary}")


def test_a_deadlocked_rank_is_a_hang(cluster: Cluster, tmp_path: Path) -> None:
    cluster.coordinator(extra=PATIENT)
    cluster.strategy()
    worker = ["--steps", "100000", "--step-time", "0.1", "--heartbeat", "--hang-rank", "1", "--fail-at", "15"]
    cluster.agent("job-deadlock", worker=worker, extra=["--policy", _policy(tmp_path)])
    before = cluster.wait_running("job-deadlock", 4)
    cluster.wait_for("rank 1 to deadlock", lambda: _log_has(cluster, "job-deadlock", 1, "deadlocking at step"), 30)
    recovery = _hang_recovered(cluster, "job-deadlock", 1, before[1].pid)
    assert [(f.rank, f.kind) for f in recovery.faults] == [(1, "hang")]
    assert "(process stopped)" not in recovery.faults[0].detail
    stacks = _stacks_of(cluster, "job-deadlock")
    assert {s.rank: s.where for s in stacks.stacks}[1] == "Event.wait", stacks.summary
    assert "rank 1 in Event.wait" in stacks.summary
    after = cluster.wait_for("rank 1 stepping again", lambda: _log_has(cluster, "job-deadlock", 1, "restart 1"))
    assert after


def test_a_plain_script_with_a_log_pattern_has_its_hang_detected(cluster: Cluster, tmp_path: Path) -> None:
    cluster.coordinator(extra=PATIENT)
    cluster.strategy()
    policy = POLICY + "  log_pattern: 'rank \\d+ step (?P<step>\\d+)'\n"
    # No --heartbeat: the worker has no client; only its output says it progresses.
    cluster.agent(
        "job-logs", worker=["--steps", "100000", "--step-time", "0.1"], extra=["--policy", _policy(tmp_path, policy)]
    )
    before = cluster.wait_running("job-logs", 4)
    cluster.wait_for("rank 1 past warm-up", lambda: _log_has(cluster, "job-logs", 1, "rank 1 step 8"))
    os.kill(before[1].pid, signal.SIGSTOP)
    recovery = _hang_recovered(cluster, "job-logs", 1, before[1].pid)
    assert [(f.rank, f.kind) for f in recovery.faults] == [(1, "hang")]
    after = cluster.ranks("job-logs")
    assert all(after[r].pid == before[r].pid for r in (0, 2, 3))
