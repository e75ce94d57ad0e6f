"""A ResilientTrainer whose every rank takes part in recoverd's protocol through its node agent
(``RecoveryProtocol(via_agent=True)``, docs/adr/0036): a dump saves every rank and the restarted
job resumes from it, with one report per node per phase whatever the ranks per node.

Real etcd, the services as separate processes, real PyTorch ranks (gloo, CPU), two nodes.
"""

from __future__ import annotations

import os
import re
import signal
from collections import Counter
from pathlib import Path

import pytest

from recoverd.keys import RunRef
from recoverd.records import pb

from .cluster import Cluster
from .history import report_writes, run_writes_between
from .test_pytorch_elastic import START_S, _elastic_worker, _log  # noqa: F401  (_elastic_worker: an autouse fixture)

pytest.importorskip("torch", reason="PyTorch is not installed (pip install -r requirements-torch.txt)")

pytestmark = pytest.mark.etcd

SLOW_RECOVER = ("--recover-timeout", "40")
DONE = re.compile(r"^rank (\d+) step (\d+) done", re.M)


def _steps(text: str) -> list[int]:
    return [int(m[2]) for m in DONE.finditer(text)]


@pytest.mark.slow
def test_a_dump_through_the_agents_saves_every_rank_and_the_job_resumes_from_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    job = "job-torch-agent-dump"
    dumps = tmp_path / "dumps"
    steps_total = 40
    worker = (
        "--steps", str(steps_total), "--step-sleep", "0.03", "--offer", "dump,exit", "--dump-dir", str(dumps),
        "--via-agent",
    )  # fmt: skip
    cluster.coordinator(extra=SLOW_RECOVER)
    cluster.strategy()
    nodes = ("node-a", "node-b")
    for node_rank, node in enumerate(nodes):
        cluster.agent(job, node, nproc=2, nnodes=2, node_rank=node_rank, strategies="dump,exit", worker=worker)
    before = cluster.wait_running(job, 4, timeout=START_S)

    def declared() -> bool:
        view = cluster.view(job)
        return all(
            n in view.nodes and view.nodes[n].answers_for_ranks and list(view.nodes[n].strategies) == ["dump", "exit"]
            for n in nodes
        )

    cluster.wait_for("both agents to answer for their ranks", declared, timeout=START_S)
    view = cluster.view(job)
    assert not view.clients  # no DLRecoverManager anywhere: the agents speak for the ranks
    assert view.run is not None
    run: RunRef = view.run
    target = 8
    cluster.wait_for(
        f"step {target}", lambda: any(s >= target for s in _steps(_log(cluster, job, "node-b", 3))), START_S
    )
    start = view.revision + 1

    os.kill(before[3].pid, signal.SIGKILL)

    for node in nodes:
        assert cluster.wait_exit(f"agent-{node}", timeout=90) == 0, cluster.logs()
    view = cluster.view(job)
    assert view.status is not None and view.status.state == pb.JOB_SUCCEEDED
    assert [(o.strategy, o.ok) for o in view.history.outcomes] == [("dump", True), ("exit", True)]  # type: ignore[union-attr]
    after = cluster.ranks(job)
    assert all(after[r].pid != before[r].pid and after[r].restart_count == 1 for r in range(4)), "every rank restarted"

    # One report per node per phase: each agent stop-complete once and the dump's status once.
    reports = report_writes(run_writes_between(cluster, run, start, view.revision),
                            cluster.keys.reports_prefix(run))  # fmt: skip
    assert reports == Counter(
        {f"agent.{n}/{kind}": 1 for n in nodes for kind in ("stop_complete", "recover_status")}
    ), reports

    logs = {r: _log(cluster, job, nodes[r // 2], r) for r in range(4)}
    story = "\n".join(f"--- rank {r}:\n{t[-3000:]}" for r, t in logs.items())
    saved = {r: [int(s) for s in re.findall(r"dump \S+: step (\d+) saved", t)] for r, t in logs.items()}
    assert all(len(saved[r]) == 1 for r in (0, 1, 2)) and saved[3] == [], story
    assert len(list(dumps.glob("dump-*/rank*.pt"))) == 3
    assert sorted(p.name for p in dumps.glob("latest-*")) == [f"latest-{run.uid}-rank{r}" for r in (0, 1, 2)]
    resume = min(saved[r][0] for r in (0, 1, 2))
    assert resume > target, story
    for r, text in logs.items():
        resumed = [int(s) for s in re.findall(r"resuming at step (\d+)", text)]
        assert resumed[-1] == resume, (r, resumed, story)  # every rank starts from the dump
        _, second_run = text.split(" restart (exit) ", 1)
        assert _steps(second_run) == list(range(resume, steps_total)), (r, story)
