"""recoverctl inject and drain, end to end: the agent carries out the drill, recoverd recovers from
it as from the real fault, and a drain moves a node's ranks to the spare (docs/incident.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from recoverd.records import pb

from .cluster import Cluster
from .test_spare_and_elastic import _alive, _on_spare, _start_spare, _two_nodes_and_a_spare

pytestmark = pytest.mark.etcd


def _ctl(cluster: Cluster, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recoverd.cli.ctl", "--etcd", cluster.endpoint, "--prefix", cluster.prefix, *argv],
        capture_output=True,
        text=True,
        timeout=90,
    )


def _done(cluster: Cluster, job: str) -> pb.Recovery | None:
    rec = cluster.view(job).recovery
    return rec if rec is not None and rec.phase == pb.PHASE_DONE else None


def test_inject_kill_is_carried_out_by_the_agent_and_recovered_in_place(cluster: Cluster) -> None:
    job = "job-drill"
    cluster.coordinator()
    cluster.strategy()
    cluster.agent(job, nproc=2, strategies="recover-in-place,exit")
    before = cluster.wait_running(job, 2)
    done = _ctl(cluster, "inject", job, "--rank", "1", "--kind", "kill", "--reason", "game day", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["taken"] is True and result["node"] == "node0" and result["kind"] == "kill"
    rec = cluster.wait_for("the recovery", lambda: _done(cluster, job))
    assert rec.strategy == "recover-in-place" and [f.rank for f in rec.faults] == [1]
    after = cluster.wait_for("rank 1 back", lambda: (r := cluster.ranks(job))[1].state == pb.RANK_RUNNING and r)
    assert after[1].restart_count == 1 and after[1].pid != before[1].pid and after[0].pid == before[0].pid
    reasons = [e.reason for e in cluster.events(job)]
    assert reasons.index("drill_requested") < reasons.index("drill") < reasons.index("fault_detected")
    assert not cluster.view(job).drills  # consumed: done at most once
    again = _ctl(cluster, "inject", job, "--rank", "7")
    assert again.returncode == 2 and "has ranks 0..1, not 7" in again.stderr


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        (("--no-hang-detection",), "refused, a hang drill needs hang detection"),
        ((), "refused, rank 0 has shown no progress"),  # silent, no heartbeat: its hang would go unseen
    ],
    ids=["no-hang-detection", "no-progress-reports"],
)
def test_a_drill_the_agent_cannot_do_is_refused_and_touches_nothing(
    cluster: Cluster, extra: tuple[str, ...], why: str
) -> None:
    job = "job-drill-refused"
    cluster.coordinator()
    cluster.strategy()
    # `sleep` prints nothing: no output cadence either (a printing rank's hang would be found).
    cluster.agent(job, nproc=2, strategies="recover-in-place,exit", extra=extra, command=("sleep", "1000000"))
    before = cluster.wait_running(job, 2)
    done = _ctl(cluster, "inject", job, "--rank", "0", "--kind", "hang")
    assert done.returncode == 1, done.stdout + done.stderr
    assert why in done.stdout
    assert {r: s.pid for r, s in cluster.ranks(job).items()} == {r: s.pid for r, s in before.items()}
    assert cluster.view(job).recovery is None
    assert "drill_refused" in [e.reason for e in cluster.events(job)]


def test_drain_moves_a_nodes_ranks_to_the_spare(cluster: Cluster) -> None:
    job = "job-drain"
    strategies = "recover-in-place,recover,exit"
    cluster.coordinator()
    cluster.strategy()
    _two_nodes_and_a_spare(cluster, job, strategies)
    before = cluster.wait_running(job, 4)
    refused = _ctl(cluster, "drain", job, "node-b")
    assert refused.returncode == 2 and "no idle spare node" in refused.stderr
    assert not cluster.view(job).faults
    _start_spare(cluster, job, strategies)
    done = _ctl(cluster, "drain", job, "node-b", "--reason", "kernel upgrade")
    assert done.returncode == 0, done.stderr
    assert "ranks [2, 3] move to a spare (spare-0 idle)" in done.stdout
    after = cluster.wait_for("ranks 2 and 3 on the spare", lambda: _on_spare(cluster, job, (2, 3)), timeout=60)
    assert all(after[r].pid == before[r].pid for r in (0, 1))
    assert not _alive(before[2].pid) and not _alive(before[3].pid)
    rec = cluster.wait_for("the recovery", lambda: _done(cluster, job))
    assert rec.strategy == "recover"  # recover-in-place was ruled out for the drained node
    assert any("being drained" in reason for d in cluster.view(job).decisions.values() for reason in d.reasons)
