"""Bad input through a real etcd and real processes: recorded with a reason, nothing crashes, nothing applied.

Each test runs the coordinator, the strategy selector and a node agent as separate processes, writes
bad input the way a buggy or stale writer would (malformed JSON, a rank outside the world, a fault
for an old generation, a report for another epoch, a key outside the schema, a second launcher with
another spec, bad command lines) and asserts what etcd, the event log, the process table and the
exit codes say afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from recoverd.keys import RunRef
from recoverd.records import decode, encode, pb, ts_from_s
from recoverd.store import KV, Store

from .cluster import Cluster

pytestmark = pytest.mark.etcd

JOB = "job-bad"
STRATEGIES = "recover-in-place,exit"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _start(cluster: Cluster, job: str = JOB) -> tuple[RunRef, dict[int, pb.RankStatus]]:
    """Coordinator, selector and one 4-rank agent (recover-in-place,exit), all ranks running."""
    cluster.coordinator()
    cluster.strategy()
    cluster.agent(job, strategies=STRATEGIES)
    ranks = cluster.wait_running(job, 4)
    run = cluster.view(job).run
    assert run is not None
    return run, ranks


def _events(cluster: Cluster, job: str, reason: str) -> list[pb.Event]:
    return [e for e in cluster.events(job) if e.reason == reason]


def _wait_event(
    cluster: Cluster,
    job: str,
    reason: str,
    what: str,
    match: Callable[[pb.Event], bool] = lambda e: True,
    timeout: float = 5.0,
) -> list[pb.Event]:
    return cluster.wait_for(
        what, lambda: [e for e in _events(cluster, job, reason) if match(e)] or None, timeout=timeout
    )


def _assert_untouched(cluster: Cluster, job: str, before: dict[int, pb.RankStatus]) -> None:
    """Every rank still runs the same process as before, with no extra restart."""
    ranks = cluster.ranks(job)
    assert sorted(ranks) == sorted(before)
    for rank, status in before.items():
        assert ranks[rank].pid == status.pid, f"rank {rank} was restarted"
        assert ranks[rank].state == pb.RANK_RUNNING
        assert ranks[rank].restart_count == status.restart_count
        assert _alive(status.pid)


def _assert_services_alive(cluster: Cluster) -> None:
    for name in ("coordinator", "strategy", "agent-node0"):
        assert cluster.procs[name].poll() is None, f"{name} exited\n{cluster.logs()}"


def _fault(rank: int, *, fault_id: str, generation: int = 0, node: str = "node0") -> bytes:
    return encode(
        pb.Fault(
            fault_id=fault_id,
            rank=rank,
            node=node,
            fault_type="1",
            source=pb.SOURCE_AGENT,
            exit_code=1,
            generation=generation,
            detected_at=ts_from_s(time.time()),
            detail="written by the test",
        )
    )


def _recover_rank(cluster: Cluster, job: str, before: dict[int, pb.RankStatus], rank: int) -> dict[int, pb.RankStatus]:
    """SIGKILL one rank and wait until it is back (new pid) and the recovery is DONE."""
    os.kill(before[rank].pid, signal.SIGKILL)
    cluster.wait_for(
        f"the recovery of rank {rank} to finish",
        lambda: (v := cluster.view(job)).recovery is not None and v.recovery.phase == pb.PHASE_DONE,
    )
    return cluster.wait_for(
        f"rank {rank} to run again",
        lambda: (
            (r := cluster.ranks(job))[rank].state == pb.RANK_RUNNING
            and r[rank].pid != before[rank].pid
            and r[rank].restart_count == before[rank].restart_count + 1
            and r
        ),
    )


# ---------------------------------------------------------------------------- malformed values


def test_malformed_json_is_recorded_deleted_and_nothing_applied(cluster: Cluster) -> None:
    run, before = _start(cluster)
    fault_key = cluster.keys.fault(run, "junk")
    report_key = cluster.keys.report(run, "agent.node0", "stop_complete")

    cluster.put(fault_key, b"{not json")
    cluster.put(report_key, b"{not json")

    bad = cluster.wait_for(
        "a bad_record event for each key",
        lambda: (
            (b := _events(cluster, JOB, "bad_record")) and {fault_key, report_key} <= {e.data["key"] for e in b} and b
        ),
    )
    by_key = {e.data["key"]: e for e in bad}
    assert by_key[fault_key].source == "coordinator"
    assert "{not json" in by_key[fault_key].data["value"]
    assert "Fault" in by_key[fault_key].message and fault_key in by_key[fault_key].message
    assert "Report" in by_key[report_key].message
    # The event and the delete commit in one transaction: once the event is there, the keys are gone.
    assert cluster.get(fault_key) is None
    assert cluster.get(report_key) is None
    # Nothing was applied: no recovery opened, no rank touched, no fault taken from the junk.
    view = cluster.view(JOB)
    assert view.recovery is None and not view.faults and not view.reports and not view.commands
    _assert_untouched(cluster, JOB, before)
    _assert_services_alive(cluster)

    # The coordinator still works: a real SIGKILL of a rank is recovered in place.
    after = _recover_rank(cluster, JOB, before, 1)
    assert all(after[r].pid == before[r].pid for r in (0, 2, 3))
    view = cluster.view(JOB)
    assert view.recovery is not None and view.recovery.strategy == "recover-in-place"
    assert [f.rank for f in view.recovery.faults] == [1]


def test_fault_for_an_unknown_rank_is_recorded_and_not_applied(cluster: Cluster) -> None:
    run, before = _start(cluster)
    keys = {rank: cluster.keys.fault(run, f"ghost{abs(rank)}") for rank in (99, 4, -1)}
    for rank, key in keys.items():
        cluster.put(key, _fault(rank, fault_id=f"ghost{abs(rank)}"))

    unknown = cluster.wait_for(
        "an unknown_rank event for each fault",
        lambda: len(e := _events(cluster, JOB, "unknown_rank")) >= len(keys) and e,
    )
    messages = " | ".join(e.message for e in unknown)
    assert "names rank 99" in messages and "names rank 4" in messages and "names rank -1" in messages
    assert "0..3" in messages
    assert all(e.source == "coordinator" and e.node == "node0" for e in unknown)
    assert all(cluster.get(key) is None for key in keys.values())
    view = cluster.view(JOB)
    assert view.recovery is None and not view.commands
    _assert_untouched(cluster, JOB, before)
    _assert_services_alive(cluster)


def test_fault_for_an_old_generation_is_stale(cluster: Cluster) -> None:
    run, before = _start(cluster)
    after = _recover_rank(cluster, JOB, before, 2)
    assert after[2].generation >= 1
    recovery = cluster.view(JOB).recovery
    assert recovery is not None

    key = cluster.keys.fault(run, "node0.r2.g0.late")
    cluster.put(key, _fault(2, fault_id="node0.r2.g0.late", generation=0))

    (stale,) = _wait_event(cluster, JOB, "stale_epoch", "the stale fault to be recorded", lambda e: e.rank == 2)
    assert "generation 0 of rank 2" in stale.message
    assert f"already runs generation {after[2].generation}" in stale.message
    assert cluster.get(key) is None
    # Nothing restarted: the recovery is the same closed one, every rank keeps its process.
    now = cluster.view(JOB).recovery
    assert now is not None and (now.epoch, now.phase) == (recovery.epoch, pb.PHASE_DONE)
    assert now.recovery_id == recovery.recovery_id
    _assert_untouched(cluster, JOB, after)
    assert [e.reason for e in cluster.events(JOB)].count("command_sent") == 1
    _assert_services_alive(cluster)


def test_report_for_another_epoch_is_stale(cluster: Cluster) -> None:
    run, before = _start(cluster)
    key = cluster.keys.report(run, "agent.node0", "stop_complete")
    report = pb.Report(
        participant="agent.node0",
        epoch=999,
        kind=pb.REPORT_STOP_COMPLETE,
        fault_ranks=[1],
        reported_at=ts_from_s(time.time()),
    )
    cluster.put(key, encode(report))

    (stale,) = _wait_event(cluster, JOB, "stale_epoch", "the stale report to be recorded", lambda e: e.epoch == 999)
    assert "REPORT_STOP_COMPLETE from agent.node0 for epoch 999" in stale.message
    assert "current epoch is 0" in stale.message
    assert cluster.get(key) is None
    view = cluster.view(JOB)
    assert view.recovery is None and not view.commands and not view.reports
    _assert_untouched(cluster, JOB, before)
    _assert_services_alive(cluster)


# ---------------------------------------------------------------------------- keys outside the schema


def test_key_outside_the_schema_is_recorded_as_bad_record(cluster: Cluster) -> None:
    """A stray key in a job's run is recorded and removed as soon as it is written."""
    run, before = _start(cluster)
    bogus = f"{cluster.keys.run_prefix(run)}bogus/x"
    cluster.put(bogus, b"whatever")

    (event,) = _wait_event(
        cluster, JOB, "bad_record", "the stray key to be recorded", lambda e: e.data["key"] == bogus, timeout=5.0
    )
    assert "unknown record kind 'bogus'" in event.message
    assert cluster.get(bogus) is None
    _assert_untouched(cluster, JOB, before)
    _assert_services_alive(cluster)


def test_keys_outside_the_schema_do_not_stop_the_coordinator(cluster: Cluster) -> None:
    """Stray keys (in a run, and under jobs/ with no valid job id) never crash or wedge the coordinator."""
    run, before = _start(cluster)
    bogus = f"{cluster.keys.run_prefix(run)}bogus/x"
    unattributable = [
        f"{cluster.keys.jobs_prefix()}-not-a-job/spec",
        f"{cluster.keys.jobs_prefix()}{JOB}/whatever",
        f"{cluster.keys.jobs_prefix()}{JOB}",
    ]
    for key in [bogus, *unattributable]:
        cluster.put(key, b"whatever")
    # A malformed fault as well: both it and the stray keys of the job are recorded and removed.
    junk = cluster.keys.fault(run, "junk")
    cluster.put(junk, b"{not json")

    in_job = f"{cluster.keys.jobs_prefix()}{JOB}/whatever"
    bad = cluster.wait_for(
        "the stray keys of the job and the junk fault to be recorded",
        lambda: (
            (b := _events(cluster, JOB, "bad_record")) and {bogus, in_job, junk} <= {e.data["key"] for e in b} and b
        ),
    )
    by_key = {e.data["key"]: e for e in bad}
    assert "unknown record kind 'bogus'" in by_key[bogus].message
    assert "names nothing recoverd knows" in by_key[in_job].message
    assert cluster.get(bogus) is None and cluster.get(junk) is None and cluster.get(in_job) is None
    # Keys that name no valid job cannot be attributed to one: left alone, and harmless.
    assert cluster.get(unattributable[0]) == b"whatever"
    _assert_untouched(cluster, JOB, before)
    _assert_services_alive(cluster)
    # And it still recovers a real fault.
    after = _recover_rank(cluster, JOB, before, 3)
    assert all(after[r].pid == before[r].pid for r in (0, 1, 2))


# ---------------------------------------------------------------------------- mismatched job spec


def test_agents_with_another_spec_are_refused_and_the_job_is_untouched(cluster: Cluster) -> None:
    run, before = _start(cluster)
    spec_before = cluster.get(cluster.keys.job_spec(JOB))
    cluster.agent(JOB, "node1", nproc=2, strategies=STRATEGIES)
    cluster.agent(JOB, "node2", nproc=4, strategies="exit")
    # Same spec, but node0 is taken (cluster.agent names it agent-node0: keep the first one's handle too).
    first = cluster.procs["agent-node0"]
    cluster.agent(JOB, "node0", nproc=4, strategies=STRATEGIES)
    cluster.procs["agent-dup"], cluster.procs["agent-node0"] = cluster.procs["agent-node0"], first

    assert cluster.wait_exit("agent-node1", timeout=10) == 2
    assert cluster.wait_exit("agent-node2", timeout=10) == 2
    refused: dict[str, str] = {}
    for name in ("agent-node1", "agent-node2"):
        refused[name] = cluster.procs[name].log_path.read_text()  # type: ignore[attr-defined]
        assert "refused to join job job-bad" in refused[name]
        assert "Traceback" not in refused[name]
    assert "nproc-per-node 2 != 4" in refused["agent-node1"] and "world size 2 != 4" in refused["agent-node1"]
    assert "strategies exit != recover-in-place,exit" in refused["agent-node2"]
    assert cluster.wait_exit("agent-dup", timeout=10) == 2
    dup = cluster.procs["agent-dup"].log_path.read_text()  # type: ignore[attr-defined]
    assert "node node0 is already registered in job job-bad" in dup

    # The running job is untouched: same spec and run, only node0 registered, same rank processes.
    assert cluster.get(cluster.keys.job_spec(JOB)) == spec_before
    view = cluster.view(JOB)
    assert view.run == run and set(view.nodes) == {"node0"} and set(view.ranks) == {"node0"}
    assert view.recovery is None
    spec = decode(pb.JobSpec, spec_before or b"")
    assert (spec.world_size, spec.nproc_per_node, list(spec.policy.strategies)) == (4, 4, STRATEGIES.split(","))
    _assert_untouched(cluster, JOB, before)
    assert cluster.procs["coordinator"].poll() is None


def test_agent_for_a_node_rank_already_taken_is_refused(cluster: Cluster) -> None:
    _run, before = _start(cluster)
    cluster.agent(JOB, "node1", nproc=4, strategies=STRATEGIES)  # same spec, node rank 0 again
    rc = None
    with contextlib.suppress(subprocess.TimeoutExpired):
        rc = cluster.wait_exit("agent-node1", timeout=30)  # a refused agent exits; an accepted one never does
    view = cluster.view(JOB)
    assert rc == 2, f"the second agent was not refused (rc={rc}); registered nodes: {sorted(view.nodes)}"
    assert "node rank 0 of job" in cluster.procs["agent-node1"].log_path.read_text()  # type: ignore[attr-defined]
    assert set(view.nodes) == {"node0"} and set(view.ranks) == {"node0"}
    _assert_untouched(cluster, JOB, before)


# ---------------------------------------------------------------------------- bad command lines


def _cli(module: str, args: Sequence[str], timeout: float = 15.0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RECOVERD_ETCD", "RECOVERD_JOB", "RECOVERD_PREFIX")}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**env, "GRPC_VERBOSITY": "ERROR"},
    )


def test_recoverctl_on_an_unknown_job_exits_1(etcd_endpoint: str, key_prefix: str) -> None:
    proc = _cli("recoverd.cli.ctl", ["--etcd", etcd_endpoint, "--prefix", key_prefix, "status", "nosuchjob"])
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    assert f"recoverctl: no job named 'nosuchjob' under {key_prefix}" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("cmd", ["status", "events", "decisions"])
def test_recoverctl_on_an_invalid_job_id_exits_2(etcd_endpoint: str, key_prefix: str, cmd: str) -> None:
    proc = _cli("recoverd.cli.ctl", ["--etcd", etcd_endpoint, "--prefix", key_prefix, cmd, "bad/job"])
    assert proc.returncode == 2, proc.stderr
    assert "invalid job id 'bad/job'" in proc.stderr
    assert "Traceback" not in proc.stderr


def _agent_args(endpoint: str, prefix: str, **over: str) -> list[str]:
    flags = {"--etcd": endpoint, "--prefix": prefix, "--job": "job-ok", "--node": "node0", "--nproc-per-node": "1"}
    flags.update({f"--{k.replace('_', '-')}": v for k, v in over.items()})
    return ["agent", *(x for kv in flags.items() for x in kv), "--", sys.executable, "-c", "pass"]


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"job": "bad/job"}, "invalid job id 'bad/job'"),
        ({"node": "bad node"}, "invalid node id 'bad node'"),
        ({"etcd": "nonsense"}, "invalid etcd endpoint 'nonsense': expected host:port"),
        ({"node_rank": "3"}, "--node-rank 3 is outside 0..0"),
        ({"strategies": "reboot"}, "unknown strategy reboot"),
        ({"nproc_per_node": "0"}, "'0' must be positive"),
    ],
    ids=["job-id", "node-id", "endpoint", "node-rank", "strategy", "nproc"],
)
def test_agent_with_bad_arguments_exits_with_a_clear_error(
    etcd_endpoint: str, key_prefix: str, over: dict[str, str], message: str
) -> None:
    proc = _cli("recoverd.cli.main", _agent_args(etcd_endpoint, key_prefix, **over))
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_agent_with_a_bad_job_id_writes_nothing(cluster: Cluster) -> None:
    proc = _cli("recoverd.cli.main", _agent_args(cluster.endpoint, cluster.prefix, job="bad/job"))
    assert proc.returncode == 2

    async def everything(store: Store) -> list[KV]:
        return (await store.get_prefix(f"{cluster.prefix}/")).kvs

    assert cluster._run(everything) == []


@pytest.mark.parametrize("tail", [[], ["--"]], ids=["no-dashdash", "empty-after-dashdash"])
def test_run_without_a_command_exits_2(etcd_endpoint: str, key_prefix: str, tail: list[str]) -> None:
    args = ["run", "--etcd", etcd_endpoint, "--prefix", key_prefix, "--nproc-per-node", "2", *tail]
    proc = _cli("recoverd.cli.main", args)
    assert proc.returncode == 2, proc.stderr
    assert "no command to run: put it after --" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_run_without_a_command_and_without_etcd_exits_2_and_leaves_nothing(tmp_path: Path) -> None:
    """With no --etcd, run starts an embedded etcd; a missing command must still exit 2, cleanly."""
    proc = _cli("recoverd.cli.main", ["run", "--nproc-per-node", "1", "--etcd-data-dir", str(tmp_path / "etcd")])
    assert proc.returncode == 2, proc.stderr
    assert "no command to run: put it after --" in proc.stderr
    assert "Traceback" not in proc.stderr
    # The leak check (conftest) fails the test if the embedded etcd outlived the command.


# ---------------------------------------------------------------------------- untrusted input (issue 10)


def test_hostile_keys_and_values_crash_no_service_and_a_real_fault_is_still_recovered(cluster: Cluster) -> None:
    """Undecodable key bytes, a signal key that is no number, JSON garbage in faults and nodes, a
    clobbered (but still leased) node record and a clobbered recovery record, all at once, with a
    standby coordinator waiting: every service lives, no rank is touched, the epoch never repeats."""
    run, before = _start(cluster)
    cluster.coordinator("coordinator-standby")
    first = _recover_rank(cluster, JOB, before, 2)  # epoch 1 happened: it must never be reused
    epoch = cluster.view(JOB).recovery.epoch  # type: ignore[union-attr]
    node_key = cluster.keys.node(run, "node0")

    async def clobber_node(store: Store) -> None:
        kv = await store.get(node_key)
        assert kv is not None and kv.lease
        await store.put(node_key, b"[]", lease=kv.lease)  # garbage, still on the agent's lease

    undecodable = cluster.keys.faults_prefix(run) + b"x\xff".decode("utf-8", "surrogateescape")
    garbage = {
        undecodable: b"{}",
        cluster.keys.signals_prefix(run) + "zzz": b"{}",
        cluster.keys.fault(run, "x"): b"{}",
        cluster.keys.fault(run, "y"): b"[]",
        cluster.keys.fault(run, "z"): b'{"only": "unknown fields"}',
        cluster.keys.node(run, "ghost"): b"[]",
        cluster.keys.recovery(run): b"{}",
    }
    for key, value in garbage.items():
        cluster.put(key, value)
    cluster._run(clobber_node)

    bad = cluster.wait_for(
        "a bad_record event for every garbage key",
        lambda: (
            (b := _events(cluster, JOB, "bad_record"))
            and {k.replace("\udcff", "\\udcff") for k in garbage} <= {e.data["key"] for e in b}
            and b
        ),
    )
    assert len(bad) >= len(garbage)
    cluster.wait_for(
        "the removable keys removed",
        lambda: all(cluster.get(k) is None for k in garbage if k != cluster.keys.recovery(run)),
    )
    # The agent's leased record is its own to rewrite (it watches it), never the coordinator's.
    cluster.wait_for(
        "the agent to write its node record again",
        lambda: (v := cluster.get(node_key)) is not None and b'"node0"' in v,
    )
    rebuilt = cluster.wait_for(
        "the recovery rebuilt", lambda: (r := cluster.view(JOB).recovery) and r.epoch >= epoch and r
    )
    assert rebuilt.phase == pb.PHASE_DONE
    _assert_untouched(cluster, JOB, first)
    for name in ("coordinator", "coordinator-standby", "strategy", "agent-node0"):
        assert cluster.procs[name].poll() is None, f"{name} exited\n{cluster.logs()}"

    # A real SIGKILL is still recovered in place, in a new epoch.
    after = _recover_rank(cluster, JOB, first, 1)
    assert all(after[r].pid == first[r].pid for r in (0, 2, 3))
    recovery = cluster.view(JOB).recovery
    assert recovery is not None and recovery.epoch > epoch and recovery.strategy == "recover-in-place"


def test_recoverctl_reports_a_job_with_a_bad_spec_in_one_line(etcd_endpoint: str, key_prefix: str) -> None:
    async def write(store: Store) -> None:
        await store.put(f"{key_prefix}/jobs/broken/spec", b'{"name": 7}')

    asyncio.run(_with_store(etcd_endpoint, write))
    proc = _cli("recoverd.cli.ctl", ["--etcd", etcd_endpoint, "--prefix", key_prefix, "status", "broken"])
    assert proc.returncode == 1, proc.stderr
    assert "job 'broken' is stored but its spec record is bad" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_recoverctl_with_etcd_down_fails_in_one_line() -> None:
    proc = _cli("recoverd.cli.ctl", ["--etcd", "127.0.0.1:9", "--timeout", "1", "status", "job"])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("recoverctl: error: etcd_unavailable")
    assert "Traceback" not in proc.stderr


async def _with_store(endpoint: str, fn: Callable[[Store], Any]) -> Any:
    async with Store(endpoint) as store:
        return await fn(store)
