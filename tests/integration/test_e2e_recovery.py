"""End to end through a real etcd and real processes: a killed rank is recovered.

Each test starts the coordinator, the strategy selector and node agents as separate processes
(``python -m recoverd.cli.main``), runs a plain Python worker (no client) as the ranks, kills real
processes with real signals, and asserts what etcd and the process table say afterwards.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import psutil
import pytest

from recoverd.records import decode, pb

from .cluster import Cluster

pytestmark = pytest.mark.etcd


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _rank_env(pid: int) -> dict[str, str]:
    return psutil.Process(pid).environ()


def test_recover_in_place_restarts_only_the_killed_rank(cluster: Cluster) -> None:
    cluster.coordinator()
    cluster.strategy()
    cluster.agent("job-rip", strategies="recover-in-place,exit")
    before = cluster.wait_running("job-rip", 4)

    os.kill(before[2].pid, signal.SIGKILL)

    after = cluster.wait_for(
        "rank 2 to come back",
        lambda: (r := cluster.ranks("job-rip"))[2].state == pb.RANK_RUNNING and r[2].pid != before[2].pid and r,
    )
    assert after[2].restart_count == 1 and after[2].generation >= 1
    assert _rank_env(after[2].pid)["RANK"] == "2"
    assert _rank_env(after[2].pid)["RECOVERD_RESTART_COUNT"] == "1"
    for rank in (0, 1, 3):
        assert after[rank].pid == before[rank].pid, f"rank {rank} was restarted"
        assert after[rank].restart_count == 0
        assert _alive(before[rank].pid)

    view = cluster.wait_for(
        "the recovery to finish",
        lambda: (v := cluster.view("job-rip")).recovery and v.recovery.phase == pb.PHASE_DONE and v,
    )
    recovery = view.recovery
    assert recovery is not None
    assert recovery.strategy == "recover-in-place"
    assert [f.rank for f in recovery.faults] == [2]
    assert recovery.faults[0].signal == signal.SIGKILL
    # The decision was written by the strategy service, with its reasons, for the recovery's epoch.
    decision = view.decisions[recovery.epoch]
    assert decision.strategy == "recover-in-place"
    assert decision.decided_by.startswith("strategy@")
    assert any("recover-in-place: yes" in r for r in decision.reasons)
    # The agent executed the (epoch, seq) command the coordinator sent, and acknowledged it.
    command, ack = view.commands["node0"], view.acks["node0"]
    assert (command.epoch, command.seq) == (recovery.epoch, 1)
    assert command.action == pb.ACTION_RESTART_RANKS and list(command.ranks) == [2]
    assert (ack.epoch, ack.seq) == (command.epoch, command.seq) and list(ack.pids) == [after[2].pid]
    # Phases walked in MindCluster's order, each recorded with its time.
    phases = [pb.Phase.Name(e.phase) for e in recovery.phase_log]
    assert phases == [
        "PHASE_COLLECTING",
        "PHASE_STOPPING",
        "PHASE_GLOBAL_FAULT",
        "PHASE_DECIDING",
        "PHASE_RECOVERING",
        "PHASE_DONE",
    ]
    reasons = [e.reason for e in cluster.events("job-rip")]
    assert "fault_detected" in reasons and "command_executed" in reasons and "recovery_done" in reasons

    assert cluster.stop("agent-node0") == 143
    for rank in range(4):
        assert not _alive(after[rank].pid)


def test_nothing_restarts_while_the_strategy_service_is_down(cluster: Cluster) -> None:
    cluster.coordinator()
    cluster.agent("job-nostrat", strategies="recover-in-place,exit")
    before = cluster.wait_running("job-nostrat", 4)

    os.kill(before[2].pid, signal.SIGKILL)
    cluster.wait_for(
        "the recovery to wait for a decision",
        lambda: (v := cluster.view("job-nostrat")).recovery is not None and v.recovery.phase == pb.PHASE_DECIDING,
    )
    # Give it time to do something wrong: nothing may restart without a decision.
    import time

    time.sleep(1.0)
    ranks = cluster.ranks("job-nostrat")
    assert ranks[2].state == pb.RANK_FAILED and ranks[2].restart_count == 0
    assert all(ranks[r].pid == before[r].pid for r in (0, 1, 3))
    assert cluster.view("job-nostrat").recovery.phase == pb.PHASE_DECIDING  # type: ignore[union-attr]

    cluster.strategy()
    after = cluster.wait_for(
        "rank 2 to be restarted once the selector is back",
        lambda: (r := cluster.ranks("job-nostrat"))[2].state == pb.RANK_RUNNING and r[2].restart_count == 1 and r,
    )
    assert all(after[r].pid == before[r].pid for r in (0, 1, 3))


def test_default_policy_restarts_every_rank(cluster: Cluster) -> None:
    cluster.coordinator()
    cluster.strategy()
    cluster.agent("job-default")  # no --strategies: exit only
    before = cluster.wait_running("job-default", 4)

    os.kill(before[2].pid, signal.SIGKILL)

    after = cluster.wait_for(
        "every rank to be restarted",
        lambda: (
            (r := cluster.ranks("job-default"))
            and all(x.restart_count == 1 and x.state == pb.RANK_RUNNING for x in r.values())
            and r
        ),
    )
    for rank in range(4):
        assert after[rank].pid != before[rank].pid
        assert not _alive(before[rank].pid)
    view = cluster.view("job-default")
    assert view.decisions[view.recovery.epoch].strategy == "exit"  # type: ignore[union-attr]
    assert view.commands["node0"].action == pb.ACTION_RESTART_ALL
    # The agent's own kills were not faults: exactly one fault (the SIGKILL) was recorded.
    assert [e.reason for e in cluster.events("job-default")].count("fault_detected") == 1


def test_two_agents_normal_end_exit_zero(cluster: Cluster) -> None:
    cluster.coordinator()
    cluster.strategy()
    short = ("--steps", "8", "--step-time", "0.05")
    cluster.agent("job-two", "node-a", nproc=2, nnodes=2, node_rank=0, worker=short)
    cluster.agent("job-two", "node-b", nproc=2, nnodes=2, node_rank=1, worker=short)

    assert cluster.wait_exit("agent-node-a") == 0
    assert cluster.wait_exit("agent-node-b") == 0
    view = cluster.view("job-two")
    assert view.status is not None and view.status.state == pb.JOB_SUCCEEDED
    assert view.spec is not None and view.spec.world_size == 4
    ranks = cluster.ranks("job-two")
    assert sorted(ranks) == [0, 1, 2, 3]
    assert {r.node for r in ranks.values()} == {"node-a", "node-b"}
    assert all(r.state == pb.RANK_SUCCEEDED for r in ranks.values())


def test_two_agents_recover_a_rank_on_the_second_node(cluster: Cluster) -> None:
    cluster.coordinator()
    cluster.strategy()
    cluster.agent("job-2n", "node-a", nproc=2, nnodes=2, node_rank=0, strategies="recover-in-place,exit")
    cluster.agent("job-2n", "node-b", nproc=2, nnodes=2, node_rank=1, strategies="recover-in-place,exit")
    before = cluster.wait_running("job-2n", 4)

    os.kill(before[3].pid, signal.SIGKILL)

    after = cluster.wait_for(
        "rank 3 to come back on node-b",
        lambda: (r := cluster.ranks("job-2n"))[3].restart_count == 1 and r[3].state == pb.RANK_RUNNING and r,
    )
    assert after[3].node == "node-b"
    assert all(after[r].pid == before[r].pid for r in (0, 1, 2))
    view = cluster.view("job-2n")
    # node-b is a participant (it held the fault rank); node-a, with nothing to do, wrote nothing and
    # was answered for by the coordinator (docs/adr/0029); only node-b got a command. node-b's rank
    # had exited, so its stop was answered for too (ADR 0037): its own report, if it wrote one
    # before the phase moved on, is a duplicate.
    assert set(view.recovery.participants) == {"agents", "agent.node-b"}  # type: ignore[union-attr]
    assert {r.participant for r in view.reports.values()} <= {"agent.node-b"}
    assert "node-a" not in view.commands and view.commands["node-b"].ranks == [3]


def test_crash_looping_rank_fails_the_job(cluster: Cluster) -> None:
    cluster.coordinator()
    cluster.strategy()
    cluster.agent(
        "job-loop",
        nproc=2,
        strategies="recover-in-place,exit",
        worker=("--steps", "600", "--fail-rank", "1"),
        # The crash-loop backoff spaces the restarts (ADR 0046): 1 s at most here.
        extra=("--max-rank-restarts", "2", "--max-job-restarts", "2", "--crash-backoff-max", "1"),
    )
    assert cluster.wait_exit("agent-node0", timeout=60) == 1
    view = cluster.view("job-loop")
    assert view.status is not None and view.status.state == pb.JOB_FAILED
    assert "exit" in view.status.reason
    strategies = [o.strategy for o in view.history.outcomes]  # type: ignore[union-attr]
    # Budget: 2 in-place restarts of rank 1, then 2 exits, then the job fails.
    assert strategies[:4] == ["recover-in-place", "recover-in-place", "exit", "exit"]
    reasons = [e.reason for e in cluster.events("job-loop")]
    assert "job_failed" in reasons


def test_sigterm_stops_the_ranks_and_is_not_a_fault(cluster: Cluster) -> None:
    cluster.coordinator()
    cluster.strategy()
    cluster.agent("job-term", nproc=2, strategies="recover-in-place,exit")
    before = cluster.wait_running("job-term", 2)
    assert cluster.stop("agent-node0") == 143
    for rank in before.values():
        assert not _alive(rank.pid)
    ranks = cluster.ranks("job-term")
    assert all(r.state == pb.RANK_STOPPED for r in ranks.values())
    assert "fault_detected" not in [e.reason for e in cluster.events("job-term")]
    assert cluster.view("job-term").recovery is None


def test_mismatched_spec_is_refused_with_the_reason(cluster: Cluster) -> None:
    cluster.coordinator()
    cluster.agent("job-spec", "node-a", nproc=2, nnodes=2, node_rank=0)
    cluster.wait_for("node-a registered", lambda: "node-a" in cluster.view("job-spec").nodes)
    cluster.agent("job-spec", "node-b", nproc=3, nnodes=2, node_rank=1)
    assert cluster.wait_exit("agent-node-b") == 2
    log = cluster.procs["agent-node-b"].log_path.read_text()  # type: ignore[attr-defined]
    assert "nproc-per-node 3 != 2" in log
    # The running job is untouched.
    view = cluster.view("job-spec")
    assert set(view.nodes) == {"node-a"} and decode(pb.JobSpec, cluster.get(cluster.keys.job_spec("job-spec")) or b"")


def test_a_lost_node_is_a_fault_and_its_unconfirmed_command_fails_the_job(cluster: Cluster, tmp_path: Path) -> None:
    """With no wait for a replacement (``deadlines.replacement: 0``; the default waits 120 s for one:
    test_node_replacement.py), the `exit` commands the lost node and waits for its agent."""
    policy = tmp_path / "no-wait.yaml"
    policy.write_text("deadlines: {replacement: 0}\n")
    no_wait = ("--policy", str(policy))
    cluster.coordinator(extra=("--recover-timeout", "1.5"))
    cluster.strategy()
    for i, node in enumerate(("node-a", "node-b")):
        cluster.agent(
            "job-lost", node, nproc=2, nnodes=2, node_rank=i, strategies="recover-in-place,exit", extra=no_wait
        )
    before = cluster.wait_running("job-lost", 4)
    orphans = [before[2].pid, before[3].pid]
    try:
        cluster.kill("agent-node-b")  # the node is gone; its lease expires after 1 s
        view = cluster.wait_for(
            "the lost node's ranks to be faults",
            lambda: (v := cluster.view("job-lost")).recovery is not None and len(v.recovery.faults) == 2 and v,
        )
        assert view.recovery is not None
        assert sorted(f.rank for f in view.recovery.faults) == [2, 3]
        assert {f.source for f in view.recovery.faults} == {pb.SOURCE_LEASE}
        # Nobody can restart node-b's ranks: recover-in-place is ruled out (no agent there), exit is
        # never confirmed, and the job fails (killMaster semantics) instead of waiting forever or
        # calling it a success. (With a spare, `recover` moves them: test_spare_and_elastic.py.)
        assert cluster.wait_exit("agent-node-a", timeout=30) == 1
        final = cluster.view("job-lost")
        assert final.status is not None and final.status.state == pb.JOB_FAILED
        assert "agent.node-b" in final.status.reason
        outcomes = [(o.strategy, o.ok) for o in final.history.outcomes]  # type: ignore[union-attr]
        assert outcomes == [("exit", False)]
        first = final.decisions[min(final.decisions)]
        assert any("recover-in-place: no, node(s) ['node-b'] lost" in r for r in first.reasons), first.reasons
    finally:
        for pid in orphans:  # the lost agent's ranks outlived it, as they must; clean them up
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)  # re-parented to the test session (a subreaper)


def test_faults_during_a_recovery_are_merged_not_lost_nor_doubled(cluster: Cluster) -> None:
    """Rank 1 fails; while its recovery waits for a decision (the selector is not started yet),
    rank 0 on the same node and rank 3 on the other node fail too. One recovery takes all three."""
    job = "job-merge"
    cluster.coordinator()
    cluster.agent(job, "node-a", nproc=2, nnodes=2, node_rank=0, strategies="recover-in-place,exit")
    cluster.agent(job, "node-b", nproc=2, nnodes=2, node_rank=1, strategies="recover-in-place,exit")
    before = cluster.wait_running(job, 4)

    os.kill(before[1].pid, signal.SIGKILL)
    first = cluster.wait_for(
        "the first fault to wait for a decision",
        lambda: (v := cluster.view(job)).recovery is not None and v.recovery.phase == pb.PHASE_DECIDING and v.recovery,
    )
    os.kill(before[0].pid, signal.SIGKILL)  # same node
    os.kill(before[3].pid, signal.SIGKILL)  # the other node
    merged = cluster.wait_for(
        "all three faults in one recovery, deciding again",
        lambda: (
            (r := cluster.view(job).recovery) is not None
            and sorted({f.rank for f in r.faults}) == [0, 1, 3]
            and r.phase == pb.PHASE_DECIDING
            and r
        ),
    )
    assert merged.recovery_id == first.recovery_id == 1 and merged.epoch > first.epoch

    cluster.strategy()
    after = cluster.wait_for(
        "ranks 0, 1 and 3 restarted",
        lambda: (
            (r := cluster.ranks(job))
            and all(r[k].state == pb.RANK_RUNNING and r[k].restart_count for k in (0, 1, 3))
            and r
        ),
    )
    assert after[2].pid == before[2].pid and after[2].restart_count == 0
    view = cluster.wait_for(
        "the recovery to finish",
        lambda: (v := cluster.view(job)).recovery.phase == pb.PHASE_DONE and v,  # type: ignore[union-attr]
    )
    # Not doubled: one recovery, one outcome, each faulty rank restarted exactly once.
    assert view.recovery.recovery_id == 1  # type: ignore[union-attr]
    assert [(o.strategy, sorted(o.ranks), o.ok) for o in view.history.outcomes] == [  # type: ignore[union-attr]
        ("recover-in-place", [0, 1, 3], True)
    ]
    assert all(after[k].restart_count == 1 for k in (0, 1, 3))
    assert list(view.commands["node-a"].ranks) == [0, 1] and list(view.commands["node-b"].ranks) == [3]


def test_kill_master_makes_every_agent_exit_non_zero(cluster: Cluster) -> None:
    """A rank that keeps failing spends its in-place budget, then the job's exit budget: the job
    fails (killMaster) and every node's agent exits 1, so the outer scheduler reschedules.

    Each fault is injected only once the previous recovery is confirmed DONE. A rank that crashes at
    start (``--fail-rank``) races its own confirmation: its next exit can land while the recovery
    that restarted it is still in RECOVERING (the coordinator then records that strategy as
    interrupted, ``ok=False``) or before its agent's recover status (code 1, strategy failed). Both
    are correct and count for the budgets, but the outcomes are then not fixed; with the faults
    spaced by the test, they are. (The crash-at-start loop is test_crash_looping_rank_fails_the_job.)
    """
    job = "job-killmaster"
    flags = ("--max-rank-restarts", "1", "--max-job-restarts", "1")
    for node, node_rank in (("node-a", 0), ("node-b", 1)):
        cluster.agent(
            job, node, nproc=2, nnodes=2, node_rank=node_rank, strategies="recover-in-place,exit", extra=flags
        )
    cluster.coordinator()
    cluster.strategy()
    ranks = cluster.wait_running(job, 4)

    def outcomes() -> list[tuple[str, bool]]:
        history = cluster.view(job).history
        return [(o.strategy, o.ok) for o in history.outcomes] if history else []

    def settled(expected: list[tuple[str, bool]]) -> dict[int, pb.RankStatus] | None:
        # DONE with the expected history, and rank 3 running its new process (the next target).
        view = cluster.view(job)
        if view.recovery is None or view.recovery.phase != pb.PHASE_DONE or outcomes() != expected:
            return None
        now = {r.rank: r for table in view.ranks.values() for r in table.ranks}
        ok = len(now) == 4 and all(r.state == pb.RANK_RUNNING and _alive(r.pid) for r in now.values())
        return now if ok and now[3].pid != ranks[3].pid else None

    # 1st fault: restarted in place (the rank's budget of 1 is now spent).
    os.kill(ranks[3].pid, signal.SIGKILL)
    ranks = cluster.wait_for("recover-in-place done", lambda: settled([("recover-in-place", True)]), timeout=30)
    # 2nd fault: in place is over budget, so every rank restarts (the job's budget of 1 is now spent).
    os.kill(ranks[3].pid, signal.SIGKILL)
    ranks = cluster.wait_for("exit done", lambda: settled([("recover-in-place", True), ("exit", True)]), timeout=30)
    # 3rd fault: nothing is left within budget; the selector gives up and the job fails.
    os.kill(ranks[3].pid, signal.SIGKILL)
    assert cluster.wait_exit("agent-node-a", timeout=60) == 1
    assert cluster.wait_exit("agent-node-b", timeout=60) == 1
    view = cluster.view(job)
    assert view.status is not None and view.status.state == pb.JOB_FAILED
    assert outcomes() == [("recover-in-place", True), ("exit", True)]
    assert "reached the job budget of 1" in view.status.reason
    for status in ranks.values():  # the agents stopped their ranks on the way out
        assert not _alive(status.pid)
