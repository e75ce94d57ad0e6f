"""examples/client_worker.py end to end: a job whose rank 0 is its recovery controller, real processes.

Coordinator, strategy selector and one agent with 4 ranks of the example; rank 0 registers as the
job's controller (DLRecoverManager), ranks 1-3 observe. A SIGKILLed survivor is recovered in place
through the controller; a SIGKILLed controller is recovered through the agents once its lease expires.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from recoverd.records import pb

from . import cluster as harness
from .cluster import ROOT, Cluster

pytestmark = pytest.mark.etcd

CLIENT_WORKER = str(ROOT / "examples" / "client_worker.py")
WORKER_ARGS = ("--steps", "600", "--step-time", "0.05")
WORLD = 4
PAUSED = "paused: stopTrain"
RESUMED = "resumed: changeStrategy recover recover-in-place"

Start = Callable[[str], tuple[dict[int, pb.RankStatus], str]]


def _rank_log(cluster: Cluster, job: str, rank: int) -> str:
    path = Path(cluster.workdir) / f"logs-{job}-node0" / f"rank{rank}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _logged(cluster: Cluster, job: str, ranks: tuple[int, ...], *texts: str) -> bool:
    return all(text in _rank_log(cluster, job, rank) for rank in ranks for text in texts)


def _logged_after(cluster: Cluster, job: str, rank: int, marker: str, text: str) -> bool:
    """``text`` appears in rank's log after ``marker``."""
    _, found, rest = _rank_log(cluster, job, rank).partition(marker)
    return bool(found) and text in rest


def _controller(cluster: Cluster, job: str, other_than: str = "") -> str | None:
    """The client id of the job's registered controller (other than ``other_than``), if any."""
    return next((c for c in cluster.view(job).clients if c != other_than), None)


def _done(cluster: Cluster, job: str) -> pb.Recovery | None:
    rec = cluster.view(job).recovery
    return rec if rec is not None and rec.recovery_id == 1 and rec.phase == pb.PHASE_DONE else None


@pytest.fixture
def start_job(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Start:
    """Start the services and a 4-rank job of client_worker.py; wait for the controller and observers."""
    monkeypatch.setattr(harness, "WORKER", CLIENT_WORKER)  # Cluster.agent runs this script

    def start(job: str) -> tuple[dict[int, pb.RankStatus], str]:
        cluster.coordinator()
        cluster.strategy()
        cluster.agent(job, nproc=WORLD, strategies="recover-in-place,exit", worker=WORKER_ARGS)
        ranks = cluster.wait_running(job, WORLD)
        client_id = cluster.wait_for("rank 0 to register as the controller", lambda: _controller(cluster, job))
        cluster.wait_for(
            "ranks 1-3 to observe", lambda: _logged(cluster, job, (1, 2, 3), "observing the recoveries of job")
        )
        return ranks, client_id

    return start


def test_a_survivor_is_recovered_in_place_through_the_controller(cluster: Cluster, start_job: Start) -> None:
    job = "job-cw-survivor"
    before, client_id = start_job(job)

    os.kill(before[2].pid, signal.SIGKILL)
    rec = cluster.wait_for("the recovery to finish", lambda: _done(cluster, job))

    assert list(rec.participants) == [f"client.{client_id}"]  # the controller answered, not the agent
    assert rec.strategy == "recover-in-place"
    after = cluster.ranks(job)
    assert after[2].pid != before[2].pid and after[2].restart_count == 1
    assert all(after[r].pid == before[r].pid and after[r].restart_count == 0 for r in (0, 1, 3))
    assert _controller(cluster, job) == client_id  # rank 0 kept its process and its registration
    # Every survivor paused at stopTrain and resumed at changeStrategy; the controller answered each phase.
    cluster.wait_for("the survivors to resume", lambda: _logged(cluster, job, (0, 1, 3), PAUSED, RESUMED))
    controller_log = _rank_log(cluster, job, 0)
    assert "stop-complete 0 answered 0" in controller_log
    assert "offered ['exit'], answered 0" in controller_log
    assert "recover status 0 for recover answered 0" in controller_log
    cluster.wait_for("the replacement of rank 2", lambda: _logged(cluster, job, (2,), "the replacement (restart 1)"))
    # The survivors train on after the resume.
    cluster.wait_for("rank 1 to train on", lambda: _logged_after(cluster, job, 1, RESUMED, "rank 1 step"))


def test_a_killed_controller_is_recovered_through_the_agents(
    cluster: Cluster, start_job: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = "job-cw-controller"
    # A dead controller stops being a participant when its lease expires: 1 s instead of 5. The agent
    # passes its environment to the ranks, and DLRecoverManager reads it there.
    monkeypatch.setenv("RECOVERD_CLIENT_LEASE_TTL", "1")
    before, client_id = start_job(job)

    os.kill(before[0].pid, signal.SIGKILL)
    rec = cluster.wait_for("the recovery to finish", lambda: _done(cluster, job))

    # The dead controller's lease expired and the agent answered the stop and the strategies in its
    # place, without waiting for a deadline. (The replacement of rank 0 may register before the end
    # of RECOVERING and then answer that phase too: only the first two phases are checked.)
    assert rec.strategy == "recover-in-place"
    assert f"client.{client_id}" not in rec.participants
    answered = {
        (r.participant, pb.ReportKind.Name(r.kind))
        for r in cluster.view(job).reports.values()
        if r.kind in (pb.REPORT_STOP_COMPLETE, pb.REPORT_STRATEGIES)
    }
    # The agent's stop needed no report (rank 0 had exited: the coordinator answered it from the
    # rank table, ADR 0037; the agent may still have written one, a duplicate); its strategies are
    # declared in its node record, and the coordinator answered GLOBAL_FAULT from there (ADR 0029).
    assert answered <= {("agent.node0", "REPORT_STOP_COMPLETE")}
    assert "escalated" not in [e.reason for e in cluster.events(job)]  # no deadline passed
    after = cluster.ranks(job)
    assert after[0].pid != before[0].pid and after[0].restart_count == 1
    assert all(after[r].pid == before[r].pid and after[r].restart_count == 0 for r in (1, 2, 3))
    # The replacement of rank 0 registers again as the job's controller.
    new_id = cluster.wait_for("the new controller", lambda: _controller(cluster, job, other_than=client_id))
    assert new_id != client_id
    cluster.wait_for("the survivors to resume", lambda: _logged(cluster, job, (1, 2, 3), PAUSED, RESUMED))
    replacement = "the replacement (restart 1) starts"
    cluster.wait_for(
        "rank 0's replacement to register", lambda: _logged_after(cluster, job, 0, replacement, "registered as the")
    )
