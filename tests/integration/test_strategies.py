"""Strategies carried out end to end: retry (in the job, no restart), the fallback after it, and
dump (the job saves a checkpoint, then every rank restarts: upstream's dump_exit).

The first tests drive a DLRecoverManager from the test itself (to inject codes such as 406); the
last ones run examples/client_worker.py as the job: its ranks really re-run a step, really save and
resume from a checkpoint. recover and elastic-training: test_spare_and_elastic.py."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from recoverd.records import pb

from . import cluster as harness
from .cluster import ROOT, Cluster
from .test_client import Controller, _done

pytestmark = pytest.mark.etcd


@pytest.fixture
def controller(cluster: Cluster):  # type: ignore[no-untyped-def]
    made: list[Controller] = []
    yield lambda job, strategies: made.append(Controller(cluster, job, strategies)) or made[-1]
    for c in made:
        c.close()


def test_retry_rolls_back_in_the_job_without_restarting_anything(cluster: Cluster, controller) -> None:  # type: ignore[no-untyped-def]
    cluster.coordinator()
    cluster.strategy()
    cluster.agent("job-retry", nproc=2, strategies="retry,recover-in-place,exit")
    before = cluster.wait_running("job-retry", 2)
    client = controller("job-retry", ("retry", "exit"))
    client.start()

    assert client.manager.report_process_fault({1: 0}) == 0  # an uncorrectable memory error: retryable
    view = cluster.wait_for("the retry to finish", lambda: _done(cluster, "job-retry"))
    rec = view.recovery  # type: ignore[attr-defined]
    assert rec.strategy == "retry" and list(rec.command_nodes) == []
    decision = view.decisions[rec.epoch]  # type: ignore[attr-defined]
    assert decision.strategy == "retry" and any("retry: yes" in r for r in decision.reasons)
    # The job re-ran the step itself: changeStrategy retry reached the client, and no process restarted.
    assert ("change_strategy", "changeStrategy", {1: 0}, "retry", "") in client.seen
    after = cluster.ranks("job-retry")
    assert {r: s.pid for r, s in after.items()} == {r: s.pid for r, s in before.items()}
    assert all(s.restart_count == 0 for s in after.values())


def test_an_unrecoverable_retry_falls_back_to_exit(cluster: Cluster, controller) -> None:  # type: ignore[no-untyped-def]
    cluster.coordinator()
    cluster.strategy()
    cluster.agent("job-406", nproc=2, strategies="retry,recover-in-place,exit")
    before = cluster.wait_running("job-406", 2)
    client = controller("job-406", ("retry", "exit"))
    manager = client.manager

    def failing_retry(ranks: dict[int, int], message) -> None:  # type: ignore[no-untyped-def]
        client.seen.append(("change_strategy", message.signalType, ranks, message.changeStrategy, ""))
        code = 406 if message.changeStrategy == "retry" else 0  # the device could not be stopped
        manager.report_recover_status(code, "stop device failed", ranks, message.changeStrategy)

    manager.set_handler("change_strategy", failing_retry)
    client.start()
    assert manager.report_process_fault({0: 2}) == 0  # an HCCL fault: retryable
    view = cluster.wait_for("the fallback to finish", lambda: _done(cluster, "job-406"))
    rec = view.recovery  # type: ignore[attr-defined]
    # 406 leaves dump or exit; the client cannot dump: exit restarts every rank.
    assert rec.strategy == "exit"
    assert [f.strategy for f in rec.failed_strategies][:1] == ["retry"]
    assert {"recover-in-place", "recover"} <= {f.strategy for f in rec.failed_strategies}
    after = cluster.ranks("job-406")
    assert all(after[r].pid != before[r].pid and after[r].restart_count == 1 for r in (0, 1))
    assert [o.strategy for o in view.history.outcomes] == ["retry", "exit"]  # type: ignore[attr-defined]
    assert [o.ok for o in view.history.outcomes] == [False, True]  # type: ignore[attr-defined]


def test_dump_saves_a_checkpoint_then_restarts_every_rank(cluster: Cluster, controller, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster.coordinator()
    cluster.strategy()
    cluster.agent("job-dump", nproc=2, strategies="dump,exit")
    before = cluster.wait_running("job-dump", 2)
    client = controller("job-dump", ("dump", "exit"))
    manager = client.manager
    checkpoint = tmp_path / "dying-gasp.ckpt"

    def save_then_answer(ranks: dict[int, int], message) -> None:  # type: ignore[no-untyped-def]
        client.seen.append(("change_strategy", message.signalType, ranks, message.changeStrategy, message.extraParams))
        if message.changeStrategy == "dump":
            checkpoint.write_text(f"ranks {sorted(ranks)}\n")  # the dying-gasp checkpoint
        client.codes.append(manager.report_recover_status(0, "", ranks, message.changeStrategy))

    manager.set_handler("change_strategy", save_then_answer)
    client.start()
    assert manager.report_process_fault({1: 1}) == 0  # a normal fault: no retry, dump is the cheapest left
    view = cluster.wait_for("the dump and its exit to finish", lambda: _done(cluster, "job-dump"))
    rec = view.recovery  # type: ignore[attr-defined]
    assert checkpoint.read_text() == "ranks [1]\n"
    # The dump was decided by the selector; the exit followed it in the next round, restarting all.
    assert rec.strategy == "exit" and list(rec.failed_strategies) == []
    assert view.decisions[rec.epoch - 1].strategy == "dump"  # type: ignore[attr-defined]
    phases = [(pb.Phase.Name(e.phase), e.epoch) for e in rec.phase_log]
    assert phases[-3:] == [
        ("PHASE_RECOVERING", rec.epoch - 1),
        ("PHASE_RECOVERING", rec.epoch),
        ("PHASE_DONE", rec.epoch),
    ]
    changes = [(s[3], s[4]) for s in client.seen if s[0] == "change_strategy"]
    assert changes == [("dump", ""), ("exit", "dump_exit")]
    assert client.codes[-2:] == [0, 0]
    after = cluster.ranks("job-dump")
    assert all(after[r].pid != before[r].pid and after[r].restart_count == 1 for r in (0, 1))
    outcomes = [(o.strategy, o.ok) for o in view.history.outcomes]  # type: ignore[attr-defined]
    assert outcomes == [("dump", True), ("exit", True)]


# ---------------------------------------------------------------- the same, with examples/client_worker.py as the job

CLIENT_WORKER = str(ROOT / "examples" / "client_worker.py")


def _log(cluster: Cluster, job: str, rank: int) -> str:
    path = Path(cluster.workdir) / f"logs-{job}-node0" / f"rank{rank}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _steps(log: str, rank: int) -> list[int]:
    return [int(m) for m in re.findall(rf"^rank {rank} step (\d+) world", log, flags=re.M)]


def _rolled_back(cluster: Cluster, job: str, rank: int) -> int | None:
    found = re.search(r"step (\d+) rolled back: running it again", _log(cluster, job, rank))
    return int(found.group(1)) if found else None


def _restarted(cluster: Cluster, job: str, ranks: tuple[int, ...]) -> dict[int, pb.RankStatus] | None:
    now = cluster.ranks(job)
    return now if all(now[k].restart_count == 1 and now[k].state == pb.RANK_RUNNING for k in ranks) else None


def test_client_workers_retry_the_step_in_every_rank(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "WORKER", CLIENT_WORKER)
    job = "job-cw-retry"
    worker = ("--steps", "400", "--step-time", "0.05", "--offer", "retry,exit", "--fault-at-step", "20")
    cluster.coordinator()
    cluster.strategy()
    cluster.agent(job, nproc=3, strategies="retry,recover-in-place,exit", worker=worker)
    before = cluster.wait_running(job, 3)
    view = cluster.wait_for("the retry to finish", lambda: _done(cluster, job), timeout=30)
    assert view.recovery.strategy == "retry" and list(view.recovery.command_nodes) == []  # type: ignore[attr-defined]
    assert [f.fault_type for f in view.recovery.faults] == ["0"]  # type: ignore[attr-defined]
    # Every rank rolled its last step back and ran it again; no process restarted.
    for rank in range(3):
        again = cluster.wait_for(f"rank {rank} to roll a step back", lambda r=rank: _rolled_back(cluster, job, r))
        cluster.wait_for(
            f"rank {rank} to run step {again} twice",
            lambda r=rank, a=again: _steps(_log(cluster, job, r), r).count(a) == 2,
        )
    after = cluster.ranks(job)
    assert {r: s.pid for r, s in after.items()} == {r: s.pid for r, s in before.items()}
    assert all(s.restart_count == 0 for s in after.values())


def test_client_workers_dump_then_resume_from_the_checkpoint(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(harness, "WORKER", CLIENT_WORKER)
    job = "job-cw-dump"
    ckpt = tmp_path / "ckpt"
    worker = ("--steps", "400", "--step-time", "0.05", "--offer", "dump,exit", "--checkpoint-dir", str(ckpt))
    cluster.coordinator()
    cluster.strategy()
    cluster.agent(job, nproc=2, strategies="dump,exit", worker=worker)
    before = cluster.wait_running(job, 2)
    cluster.wait_for("the controller", lambda: cluster.view(job).clients and _steps(_log(cluster, job, 1), 1))

    os.kill(before[1].pid, signal.SIGKILL)  # a normal fault: retry is out, dump is the cheapest left

    view = cluster.wait_for("the dump and its exit to finish", lambda: _done(cluster, job), timeout=30)
    assert view.decisions[view.recovery.epoch - 1].strategy == "dump"  # type: ignore[attr-defined]
    assert [(o.strategy, o.ok) for o in view.history.outcomes] == [("dump", True), ("exit", True)]  # type: ignore[attr-defined]
    saved = json.loads((ckpt / "checkpoint.json").read_text())["step"]
    assert saved >= 0
    after = cluster.wait_for(
        "both ranks restarted",
        lambda: (
            (r := cluster.ranks(job))
            and all(r[k].restart_count == 1 and r[k].state == pb.RANK_RUNNING for k in (0, 1))
            and r
        ),
    )
    assert all(after[k].pid != before[k].pid for k in (0, 1))
    # Every restarted rank resumed from the dump, not from step 0.
    for rank in (0, 1):
        text = cluster.wait_for(
            f"rank {rank} to resume",
            lambda r=rank: f"starting at step {saved + 1}" in (t := _log(cluster, job, r)) and t,
        )
        restarted = text.split("restart 1 ====", 1)[1]
        assert _steps(restarted, rank)[:1] in ([], [saved + 1])
