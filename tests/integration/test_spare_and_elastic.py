"""`recover` to a spare node and `elastic-training` (downgrade, then upgrade), end to end.

Real etcd, the services as separate processes, real rank processes killed with real signals. Two
nodes of two ranks each (node-a: ranks 0-1, node-b: ranks 2-3) and a spare agent (``--spare``)
that runs nothing until it is given ranks.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import psutil
import pytest

from recoverd.records import pb

from . import cluster as harness
from .cluster import ROOT, Cluster
from .test_bad_input import _cli

pytestmark = pytest.mark.etcd

CLIENT_WORKER = str(ROOT / "examples" / "client_worker.py")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _two_nodes_and_a_spare(cluster: Cluster, job: str, strategies: str, worker: tuple[str, ...] | None = None) -> None:
    kw = {"worker": worker} if worker else {}
    cluster.agent(job, "node-a", nproc=2, nnodes=2, node_rank=0, strategies=strategies, **kw)  # type: ignore[arg-type]
    cluster.agent(job, "node-b", nproc=2, nnodes=2, node_rank=1, strategies=strategies, **kw)  # type: ignore[arg-type]


def _start_spare(cluster: Cluster, job: str, strategies: str, worker: tuple[str, ...] | None = None) -> None:
    kw = {"worker": worker} if worker else {}
    cluster.agent(job, "spare-0", nproc=2, nnodes=2, strategies=strategies, extra=("--spare",), **kw)  # type: ignore[arg-type]
    # Registered (as a spare, or already given ranks: an upgrade can follow at once).
    cluster.wait_for("the spare to register", lambda: "spare-0" in cluster.view(job).nodes)


def _on_spare(cluster: Cluster, job: str, ranks: tuple[int, ...]) -> dict[int, pb.RankStatus] | None:
    now = cluster.ranks(job)
    ok = all(now.get(r) and now[r].node == "spare-0" and now[r].state == pb.RANK_RUNNING for r in ranks)
    return now if ok else None


def test_a_lost_node_moves_to_the_spare(cluster: Cluster) -> None:
    job = "job-spare-lost"
    strategies = "recover-in-place,recover,exit"
    cluster.coordinator()
    cluster.strategy()
    _two_nodes_and_a_spare(cluster, job, strategies)
    before = cluster.wait_running(job, 4)
    _start_spare(cluster, job, strategies)
    orphans = [before[2].pid, before[3].pid]
    try:
        # The whole of node-b is gone: its agent and its ranks.
        cluster.kill("agent-node-b")
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)

        after = cluster.wait_for("ranks 2 and 3 to run on the spare", lambda: _on_spare(cluster, job, (2, 3)))
        assert all(after[r].pid == before[r].pid for r in (0, 1)), "the survivors keep their processes"
        assert all(after[r].pid not in orphans and after[r].restart_count == 1 for r in (2, 3))
        env = psutil.Process(after[2].pid).environ()
        assert (env["RANK"], env["GROUP_RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("2", "1", "0", "4")
        assert env["RECOVERD_NODE"] == "spare-0"

        view = cluster.wait_for(
            "the recovery to finish", lambda: (v := cluster.view(job)).recovery.phase == pb.PHASE_DONE and v
        )  # type: ignore[union-attr]
        rec = view.recovery
        assert rec is not None and rec.strategy == "recover" and rec.outcome == "succeeded"
        decision = view.decisions[rec.epoch]
        assert [(m.from_node, m.to_node) for m in decision.moves] == [("node-b", "spare-0")]
        assert any("recover-in-place: no, node(s) ['node-b'] lost" in r for r in decision.reasons)
        # The lost node is forgotten (its old rank table would read as running ranks), and the
        # spare is a normal node of the job now.
        assert "node-b" not in view.ranks
        spare = view.nodes["spare-0"]
        assert not spare.is_spare and list(spare.ranks) == [2, 3] and spare.node_rank == 1
        assert [(o.strategy, o.ok) for o in view.history.outcomes] == [("recover", True)]  # type: ignore[union-attr]
    finally:
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)  # re-parented to the test session (a subreaper)


def test_a_crashed_rank_takes_its_whole_node_to_the_spare(cluster: Cluster) -> None:
    job = "job-spare-crash"
    strategies = "recover,exit"  # no recover-in-place: the node itself is suspect
    cluster.coordinator()
    cluster.strategy()
    _two_nodes_and_a_spare(cluster, job, strategies)
    before = cluster.wait_running(job, 4)
    _start_spare(cluster, job, strategies)

    os.kill(before[3].pid, signal.SIGKILL)

    after = cluster.wait_for("ranks 2 and 3 to run on the spare", lambda: _on_spare(cluster, job, (2, 3)))
    # Node-wide: rank 2 was healthy but shares the faulty node, so node-b released it (stopped by
    # its agent: not a fault) and the spare runs it now.
    assert not _alive(before[2].pid)
    assert all(after[r].pid == before[r].pid for r in (0, 1))
    view = cluster.wait_for(
        "the recovery to finish",
        lambda: (v := cluster.view(job)).recovery.phase == pb.PHASE_DONE and v,  # type: ignore[union-attr]
    )
    rec = view.recovery
    assert rec is not None and rec.strategy == "recover"
    assert sorted(f.rank for f in rec.faults) == [2, 3]
    assert sorted(rec.command_nodes) == [] and view.commands["node-b"].action == pb.ACTION_RELEASE_RANKS
    assert view.commands["spare-0"].action == pb.ACTION_START_RANKS and list(view.commands["spare-0"].ranks) == [2, 3]
    # node-b's agent is still there, holding no ranks (it acknowledges its release after the spare
    # took the ranks, so its table may still show them stopped for a moment); exactly one fault.
    assert "node-b" in view.nodes
    cluster.wait_for("node-b's table to be empty", lambda: list(cluster.view(job).ranks["node-b"].ranks) == [])
    assert [e.reason for e in cluster.events(job)].count("fault_detected") == 1


def _rank_log(cluster: Cluster, job: str, node: str, rank: int) -> str:
    path = Path(cluster.workdir) / f"logs-{job}-{node}" / f"rank{rank}.log"
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.mark.slow
def test_elastic_training_shrinks_the_world_then_grows_it_back(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Client workers (rank 0 the controller) that offer elastic-training: a crash on node-b with no
    spare downgrades the job to ranks 0-1; a spare that registers later brings ranks 2-3 back."""
    monkeypatch.setattr(harness, "WORKER", CLIENT_WORKER)
    job = "job-elastic"
    strategies = "elastic-training,exit"
    worker = ("--steps", "240", "--step-time", "0.05", "--offer", "elastic-training,exit")
    cluster.coordinator()
    cluster.strategy()
    _two_nodes_and_a_spare(cluster, job, strategies, worker)
    before = cluster.wait_running(job, 4)
    cluster.wait_for("rank 0 to register as the controller", lambda: cluster.view(job).clients)

    os.kill(before[3].pid, signal.SIGKILL)

    view = cluster.wait_for(
        "the downgrade",
        lambda: (v := cluster.view(job)).recovery.phase == pb.PHASE_DONE and v,  # type: ignore[union-attr]
    )
    rec = view.recovery
    assert rec is not None and rec.strategy == "elastic-training"
    assert [(p.rank, p.node) for p in rec.isolated] == [(2, "node-b"), (3, "node-b")]
    cluster.wait_for(
        "rank 0 to train with 2 ranks",
        lambda: "world 2: downgrade of ranks [2, 3]" in _rank_log(cluster, job, "node-a", 0),
    )
    assert not _alive(before[2].pid), "node-b released rank 2"
    assert cluster.ranks(job)[0].pid == before[0].pid
    shown = _cli("recoverd.cli.ctl", ["--etcd", cluster.endpoint, "--prefix", cluster.prefix, "status", job]).stdout
    assert "downgraded: training with 2 of 4 ranks; ranks [2, 3] are isolated until a spare registers" in shown

    _start_spare(cluster, job, strategies, worker)

    after = cluster.wait_for("ranks 2 and 3 back on the spare", lambda: _on_spare(cluster, job, (2, 3)))
    assert all(after[r].pid == before[r].pid for r in (0, 1))
    cluster.wait_for(
        "rank 0 to train with 4 ranks again",
        lambda: "world 4: upgrade of ranks [2, 3]" in _rank_log(cluster, job, "node-a", 0),
    )
    final = cluster.wait_for(
        "the upgrade to finish",
        lambda: (v := cluster.view(job)).recovery.strategy == "upgrade" and v.recovery.phase == pb.PHASE_DONE and v,  # type: ignore[union-attr]
    )
    assert list(final.recovery.isolated) == []  # type: ignore[union-attr]
    assert [(o.strategy, o.ok) for o in final.history.outcomes] == [("elastic-training", True), ("upgrade", True)]  # type: ignore[union-attr]
    # Every rank finishes its steps: the job succeeds and every agent (the idle node-b too) exits 0.
    for agent in ("agent-node-a", "agent-node-b", "agent-spare-0"):
        assert cluster.wait_exit(agent, timeout=60) == 0
    assert cluster.view(job).status.state == pb.JOB_SUCCEEDED  # type: ignore[union-attr]
