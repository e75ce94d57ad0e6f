"""Strategies carried out end to end: retry (in the job, no restart), the fallback after it, and
dump (the job saves a checkpoint, then every rank restarts: upstream's dump_exit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from recoverd.records import pb

from .cluster import Cluster
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
