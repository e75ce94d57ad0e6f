"""DLRecoverManager against a real etcd and real services: the client side of the protocol."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from recoverd.codes import Code
from recoverd.mindcluster import recover_pb2 as wire
from recoverd.records import pb
from taskd_client import DLRecoverManager
from taskd_client.session import ClientSession

from .cluster import Cluster

pytestmark = pytest.mark.etcd


class Controller:
    """A job controller in the test process: answers every phase and records what it saw."""

    def __init__(self, cluster: Cluster, job: str, strategies: tuple[str, ...] = ("exit",)) -> None:
        self.manager = DLRecoverManager(
            wire.ClientInfo(jobId=job, role="controller"),
            f"etcd://{cluster.endpoint}",
            prefix=cluster.prefix,
            lease_ttl_s=1,
        )
        self.seen: list[tuple[str, str, dict[int, int], str, str]] = []
        self.codes: list[int] = []
        self.strategies = strategies
        self.answer = True
        for action in ("stop_train", "on_global_rank", "change_strategy", "fault_nodes_restart", "killMaster"):
            self.manager.set_handler(action, self._handler(action))
        self.thread: threading.Thread | None = None

    def _handler(self, action: str):  # type: ignore[no-untyped-def]
        def handle(ranks: dict[int, int], message: wire.ProcessManageSignal) -> None:
            self.seen.append((action, message.signalType, ranks, message.changeStrategy, message.extraParams))
            if not self.answer:
                return
            if action == "stop_train":
                self.codes.append(self.manager.report_stop_complete(0, "", ranks))
            elif action == "on_global_rank":
                self.codes.append(self.manager.report_recover_strategy(ranks, list(self.strategies)))
            elif action == "change_strategy":
                self.codes.append(self.manager.report_recover_status(0, "", ranks, message.changeStrategy))

        return handle

    def start(self) -> None:
        assert self.manager.init_clusterd() is True
        status = self.manager.register()
        assert (status.code, status.info) == (0, "register success")
        self.thread = threading.Thread(target=self.manager.start_subscribe, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.manager.close()
        if self.thread is not None:
            self.thread.join(timeout=10)
            assert not self.thread.is_alive()


@pytest.fixture
def controller_for(cluster: Cluster) -> Iterator[object]:
    made: list[Controller] = []

    def make(job: str, strategies: tuple[str, ...] = ("exit",)) -> Controller:
        controller = Controller(cluster, job, strategies)
        made.append(controller)
        return controller

    yield make
    for controller in made:
        controller.close()


async def _die(session: ClientSession) -> None:
    assert session._keeper is not None and session._lease is not None
    session._keeper.cancel()
    await session._lease.aclose(revoke=False)


def _done(cluster: Cluster, job: str, recovery_id: int = 1) -> object:
    view = cluster.view(job)
    rec = view.recovery
    return rec is not None and rec.recovery_id == recovery_id and rec.phase == pb.PHASE_DONE and view


def test_a_client_walks_a_whole_recovery(cluster: Cluster, controller_for) -> None:  # type: ignore[no-untyped-def]
    cluster.coordinator()
    cluster.strategy()
    cluster.agent("job-client", nproc=4, strategies="recover-in-place,exit")
    before = cluster.wait_running("job-client", 4)
    controller = controller_for("job-client", ("recover", "dump", "exit"))
    controller.start()

    # The job's controller saw a UCE on rank 3 itself: report_process_fault starts the recovery.
    started = time.time()
    assert controller.manager.report_process_fault({3: 0}) == 0
    view = cluster.wait_for("the recovery to finish", lambda: _done(cluster, "job-client"))
    elapsed = time.time() - started

    rec = view.recovery  # type: ignore[attr-defined]
    client = f"client.{controller.manager.client_id}"
    assert list(rec.participants) == [client]  # the agent stayed silent for the client's ranks
    assert [(f.rank, f.fault_type, f.source, f.node) for f in rec.faults] == [(3, "0", pb.SOURCE_CLIENT, "node0")]
    assert rec.strategy == "recover-in-place"
    # Every signal in MindCluster's wire form, in order, exactly once.
    assert [s[:2] for s in controller.seen] == [
        ("stop_train", "stopTrain"),
        ("on_global_rank", "globalFault"),
        ("change_strategy", "changeStrategy"),
        ("fault_nodes_restart", "changeStrategy"),
    ]
    assert all(s[2] == {3: 0} for s in controller.seen)
    assert controller.seen[2][3:] == ("recover", "recover-in-place")
    assert controller.codes == [0, 0, 0]
    # The reports carried the epoch of the signals they answer; the commanded agent confirmed.
    phases = [pb.Phase.Name(e.phase) for e in rec.phase_log]
    assert phases == ["PHASE_COLLECTING", "PHASE_STOPPING", "PHASE_GLOBAL_FAULT", "PHASE_DECIDING",
                      "PHASE_RECOVERING", "PHASE_DONE"]  # fmt: skip
    span = rec.phase_log[-1].at.ToNanoseconds() - rec.phase_log[0].at.ToNanoseconds()
    assert 0 < span / 1e9 < elapsed
    after = cluster.ranks("job-client")
    assert after[3].pid != before[3].pid and after[3].restart_count == 1
    assert all(after[r].pid == before[r].pid for r in (0, 1, 2))
    reasons = [e.reason for e in cluster.events("job-client")]
    assert "client_registered" in reasons and "recovery_done" in reasons


def test_a_killed_client_falls_back_to_the_agents(cluster: Cluster, controller_for) -> None:  # type: ignore[no-untyped-def]
    cluster.coordinator()
    cluster.strategy()
    cluster.agent("job-fallback", nproc=2, strategies="recover-in-place,exit")
    before = cluster.wait_running("job-fallback", 2)
    controller = controller_for("job-fallback")
    controller.answer = False  # it receives stopTrain, then dies without answering
    controller.start()

    os.kill(before[1].pid, signal.SIGKILL)
    cluster.wait_for("stopTrain to reach the client", lambda: controller.seen)
    view = cluster.view("job-fallback")
    assert view.recovery is not None and view.recovery.phase == pb.PHASE_STOPPING
    assert list(view.recovery.participants) == [f"client.{controller.manager.client_id}"]
    # The client's process dies: its lease expires and the agents answer instead of the
    # recovery waiting forever (simulated: the lease is dropped unrevoked and nothing renews it).
    controller.manager._call(_die(controller.manager._session))
    view = cluster.wait_for("the agents to finish the recovery", lambda: _done(cluster, "job-fallback"))
    # node0's agent answers itself (it holds the fault rank); the coordinator answers for the rest.
    assert sorted(view.recovery.participants) == ["agent.node0", "agents"]  # type: ignore[attr-defined]
    after = cluster.ranks("job-fallback")
    assert after[1].restart_count == 1 and after[0].pid == before[0].pid


def test_reports_stale_duplicate_and_invalid(cluster: Cluster, controller_for) -> None:  # type: ignore[no-untyped-def]
    cluster.coordinator()
    cluster.strategy()
    cluster.agent("job-stale", nproc=2, strategies="recover-in-place,exit")
    before = cluster.wait_running("job-stale", 2)
    controller = controller_for("job-stale")
    controller.start()
    manager = controller.manager

    assert manager.report_stop_complete(0, "", {0: 1}) == Code.ORDER_MIXED  # nothing delivered yet
    os.kill(before[0].pid, signal.SIGKILL)
    cluster.wait_for("the first recovery", lambda: _done(cluster, "job-stale"))
    # Repeating an answer to the current (last) signal is acknowledged, changes nothing.
    assert manager.report_recover_status(0, "", {0: 1}, "recover") == Code.OK
    # Bad input: unknown rank, wrong types, wrong fault type, a strategy list that is a string.
    assert manager.report_stop_complete(0, "", {7: 1}) == Code.INVALID_PARAM
    assert manager.report_stop_complete(0, "", {"0": 1}) == Code.INVALID_PARAM  # type: ignore[dict-item]
    assert manager.report_stop_complete(0, "", [0]) == Code.INVALID_PARAM  # type: ignore[arg-type]
    assert manager.report_process_fault({0: 5}) == Code.INVALID_PARAM
    assert manager.report_recover_strategy({0: 1}, "exit") == Code.INVALID_PARAM  # type: ignore[arg-type]
    assert manager.register(wire.ClientInfo(jobId="other-job")).code == Code.INVALID_PARAM

    # A second recovery: an answer stamped with the first recovery's signal is stale.
    first_uuid = manager._session.last_signal.uuid  # type: ignore[union-attr]
    controller.answer = False
    now = cluster.ranks("job-stale")
    os.kill(now[1].pid, signal.SIGKILL)
    cluster.wait_for("the second recovery's stopTrain", lambda: len(controller.seen) > 4)
    stale = manager._session.last_signal
    assert stale is not None and stale.uuid != first_uuid
    manager._session._last_signal = pb.Signal(epoch=1, uuid=first_uuid)  # type: ignore[attr-defined]
    assert manager.report_stop_complete(0, "", {1: 1}) == Code.ORDER_MIXED
    assert "stale_epoch" in [e.reason for e in cluster.events("job-stale")]
    view = cluster.view("job-stale")
    assert view.recovery is not None and view.recovery.phase == pb.PHASE_STOPPING  # not applied
    # The current signal's answer is applied, and a duplicate of it is acknowledged with 0.
    manager._session._last_signal = stale  # type: ignore[attr-defined]
    assert manager.report_stop_complete(0, "", {1: 1}) == Code.OK
    assert manager.report_stop_complete(0, "", {1: 1}) == Code.OK
    cluster.wait_for("the stop to be accepted", lambda: cluster.view("job-stale").recovery.phase  # type: ignore[union-attr]
                     != pb.PHASE_STOPPING)  # fmt: skip

    # Deregistered: reports are refused with 400 after one re-register attempt fails... no, succeeds:
    # upstream re-registers on 400, so a closed manager is the way to stop being a participant.
    controller.close()
    with pytest.raises(Exception, match="closed"):
        manager.report_stop_complete(0, "", {1: 1})
