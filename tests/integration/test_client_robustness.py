"""DLRecoverManager when things go wrong: etcd restarts, closed and late clients, early reports, late jobs.

Real etcd and real recoverd service processes (``cluster``); the job's controller is a
``DLRecoverManager`` in the test process, subscribed on a thread and answering every phase, as in
test_client.py. A test that kills etcd runs its own :class:`EmbeddedEtcd`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from recoverd.codes import Code
from recoverd.errors import RecoverdError
from recoverd.etcd_server import EmbeddedEtcd
from recoverd.keys import Keyspace, RunRef
from recoverd.mindcluster import recover_pb2 as wire
from recoverd.records import decode, encode, pb, ts_from_s
from recoverd.store import Store
from taskd_client import DLRecoverManager

from .cluster import Cluster

pytestmark = pytest.mark.etcd

ACTIONS = ("stop_train", "on_global_rank", "change_strategy", "fault_nodes_restart", "killMaster")


class Controller:
    """A job controller in the test process: answers every phase and records what it saw.

    ``delivered`` holds the stored signals exactly as the subscription handed them to the manager
    (seq, epoch, uuid: what the wire form lacks); ``seen`` what each handler got, with the seq of the
    session's last signal read inside the handler; ``codes`` what each answer returned.
    """

    def __init__(self, endpoint: str, prefix: str, job: str, strategies: tuple[str, ...] = ("exit",)) -> None:
        self.manager = DLRecoverManager(
            wire.ClientInfo(jobId=job, role="controller"), f"etcd://{endpoint}", prefix=prefix, lease_ttl_s=1
        )
        self.strategies = strategies
        self.answers = {"stop_train", "on_global_rank", "change_strategy"}
        self.gates: dict[str, threading.Event] = {}  # action -> released when set (the handler waits)
        self.delivered: list[pb.Signal] = []
        self.seen: list[tuple[str, str, str, int]] = []  # (action, signalType, uuid, last_signal.seq)
        self.codes: list[tuple[str, int]] = []
        self.errors: list[BaseException] = []
        self.subscribed = threading.Event()  # the subscription read its snapshot and is watching
        self.thread: threading.Thread | None = None
        for action in ACTIONS:
            self.manager.set_handler(action, self._handler(action))
        original_deliver = self.manager._deliver

        def deliver(stored: pb.Signal) -> bool:
            copy = pb.Signal()
            copy.CopyFrom(stored)
            self.delivered.append(copy)
            return original_deliver(stored)

        self.manager._deliver = deliver  # type: ignore[method-assign]
        store = self.manager._store
        original_watch = store.watch_prefix

        def watch_prefix(*args: Any, **kwargs: Any) -> Any:
            # signals() calls this right after its snapshot read: from here on nothing can be missed.
            if "/signals/" in str(args[0]):
                self.subscribed.set()
            return original_watch(*args, **kwargs)

        store.watch_prefix = watch_prefix  # type: ignore[method-assign]

    def _handler(self, action: str) -> Callable[[dict[int, int], wire.ProcessManageSignal], None]:
        def handle(ranks: dict[int, int], message: wire.ProcessManageSignal) -> None:
            last = self.manager._session.last_signal
            self.seen.append((action, message.signalType, message.uuid, last.seq if last is not None else -1))
            gate = self.gates.get(action)
            if gate is not None:
                gate.wait(15)
            if action not in self.answers:
                return
            if action == "stop_train":
                self.codes.append((action, self.manager.report_stop_complete(0, "", ranks)))
            elif action == "on_global_rank":
                self.codes.append((action, self.manager.report_recover_strategy(ranks, list(self.strategies))))
            elif action == "change_strategy":
                self.codes.append((action, self.manager.report_recover_status(0, "", ranks, message.changeStrategy)))

        return handle

    def _subscribe(self) -> None:
        try:
            self.manager.start_subscribe()
        except BaseException as err:  # surfaced by the test's assertions
            self.errors.append(err)

    def register(self) -> None:
        assert self.manager.init_clusterd() is True
        status = self.manager.register()
        assert (status.code, status.info) == (0, "register success")

    def subscribe(self) -> None:
        self.thread = threading.Thread(target=self._subscribe, daemon=True, name="controller-subscriber")
        self.thread.start()
        assert self.subscribed.wait(10), "the subscription never started watching"

    def start(self) -> None:
        self.register()
        self.subscribe()

    def close(self) -> None:
        for gate in self.gates.values():
            gate.set()
        self.manager.close()
        if self.thread is not None:
            self.thread.join(timeout=10)
            assert not self.thread.is_alive()


@pytest.fixture
def controller_for(cluster: Cluster) -> Iterator[Callable[..., Controller]]:
    made: list[Controller] = []

    def make(job: str, strategies: tuple[str, ...] = ("exit",)) -> Controller:
        controller = Controller(cluster.endpoint, cluster.prefix, job, strategies)
        made.append(controller)
        return controller

    yield make
    for controller in made:
        controller.close()


def _recovery(cluster: Cluster, job: str) -> pb.Recovery | None:
    return cluster.view(job).recovery


def _wait_phase(cluster: Cluster, job: str, phase: int, recovery_id: int = 1, timeout: float = 20.0) -> pb.Recovery:
    def reached() -> pb.Recovery | None:
        rec = _recovery(cluster, job)
        return rec if rec is not None and rec.recovery_id == recovery_id and rec.phase == phase else None

    return cluster.wait_for(f"recovery {recovery_id} of {job} in {pb.Phase.Name(phase)}", reached, timeout)


def _stored_signals(cluster: Cluster, job: str) -> list[tuple[int, pb.Signal]]:
    """The run's signals in etcd as (seq in the key, record), in key order."""
    run = cluster.view(job).run
    assert run is not None

    async def read(store: Store) -> list[tuple[int, pb.Signal]]:
        snap = await store.get_prefix(cluster.keys.signals_prefix(run))
        return [(int(cluster.keys.parse(kv.key).name), decode(pb.Signal, kv.value, kv.key)) for kv in snap.kvs]

    return cluster._run(read)  # type: ignore[no-any-return]


def _max_seq(cluster: Cluster, job: str) -> int:
    return max((seq for seq, _ in _stored_signals(cluster, job)), default=0)


def _client_key(cluster: Cluster, job: str, manager: DLRecoverManager) -> str:
    run = cluster.view(job).run
    assert run is not None
    return cluster.keys.client(run, manager.client_id)


# ---------------------------------------------------------------------------- etcd kill -9


def test_no_signal_is_lost_or_repeated_across_an_etcd_kill9(tmp_path: Path, key_prefix: str) -> None:
    job = "job-etcd-kill"
    etcd = EmbeddedEtcd(for_tests=True)
    etcd.start()
    cluster = Cluster(etcd.endpoint, key_prefix, tmp_path)
    controller: Controller | None = None
    try:
        cluster.coordinator()
        cluster.strategy()
        cluster.agent(job, nproc=2, strategies="recover-in-place,exit")
        before = cluster.wait_running(job, 2)
        controller = Controller(etcd.endpoint, key_prefix, job, ("recover", "dump", "exit"))
        controller.register()
        base = _max_seq(cluster, job)  # every signal after this one is owed to the controller
        controller.subscribe()

        # etcd dies mid-subscription for longer than every lease TTL in play (1 s), then comes back.
        etcd.kill9()
        time.sleep(1.5)
        etcd.restart()
        cluster.wait_for("the agent to publish again", lambda: cluster.ranks(job), timeout=20)

        os.kill(before[1].pid, signal.SIGKILL)
        rec = _wait_phase(cluster, job, pb.PHASE_DONE, timeout=20)
        cluster.wait_for("every handler to run", lambda: len(controller.seen) >= 4, timeout=5)
        time.sleep(0.3)  # a duplicate would arrive now

        assert controller.errors == []
        assert controller.thread is not None and controller.thread.is_alive()  # still subscribed
        # Exactly stopTrain, globalFault, changeStrategy, once each, in order, all of this epoch.
        delivered = controller.delivered
        assert [s.signal_type for s in delivered] == ["stopTrain", "globalFault", "changeStrategy"]
        assert {(s.epoch, s.uuid) for s in delivered} == {(rec.epoch, rec.uuid)}
        assert rec.recovery_id == 1 and rec.epoch == 1 and rec.strategy == "recover-in-place"
        assert [s[:2] for s in controller.seen] == [
            ("stop_train", "stopTrain"),
            ("on_global_rank", "globalFault"),
            ("change_strategy", "changeStrategy"),
            ("fault_nodes_restart", "changeStrategy"),
        ]
        # Inside each handler the session's last signal is the one being handled.
        assert [s[3] for s in controller.seen] == [*(d.seq for d in delivered), delivered[2].seq]
        assert all(s[2] == rec.uuid for s in controller.seen)
        assert controller.codes == [("stop_train", 0), ("on_global_rank", 0), ("change_strategy", 0)]

        # Signals are numbered consecutively per run, and every one from registration on was
        # delivered exactly once, in order.
        stored = _stored_signals(cluster, job)
        assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
        assert all(seq == s.seq for seq, s in stored)
        owed = [s for seq, s in stored if seq > base]
        assert [s.seq for s in delivered] == [s.seq for s in owed]
        assert [(s.uuid, s.signal_type) for s in delivered] == [(s.uuid, s.signal_type) for s in owed]

        # Training survived the outage; only the killed rank was restarted.
        after = cluster.ranks(job)
        assert after[0].pid == before[0].pid
        assert after[1].pid != before[1].pid and after[1].restart_count == 1
    finally:
        if controller is not None:
            controller.close()
        cluster.close()
        etcd.stop()


# ---------------------------------------------------------------------------- a closed client


def test_a_closed_client_hands_over_to_the_agents_at_once(cluster: Cluster, controller_for) -> None:  # type: ignore[no-untyped-def]
    job = "job-closed"
    cluster.coordinator()
    cluster.strategy()
    cluster.agent(job, nproc=2, strategies="recover-in-place,exit")
    before = cluster.wait_running(job, 2)
    controller = controller_for(job)
    controller.start()
    manager = controller.manager
    key = _client_key(cluster, job, manager)
    assert cluster.get(key) is not None

    manager.close()
    # The lease is revoked, not left to expire (TTL 1 s): the key is gone the moment close returns.
    assert cluster.get(key) is None
    assert controller.thread is not None
    controller.thread.join(timeout=5)
    assert not controller.thread.is_alive() and controller.errors == []  # the subscription ended quietly

    # Every etcd-backed call on the closed manager says so.
    calls: list[Callable[[], object]] = [
        lambda: manager.register(),
        lambda: manager.report_stop_complete(0, "", {1: 1}),
        lambda: manager.report_recover_strategy({1: 1}, ["exit"]),
        lambda: manager.report_recover_status(0, "", {1: 1}, "recover"),
        lambda: manager.report_process_fault({1: 1}),
        lambda: manager.start_subscribe(),
    ]
    for call in calls:
        with pytest.raises(RecoverdError, match="closed"):
            call()
    manager.close()  # idempotent

    # A new recovery is answered by the agents alone and nothing reaches the closed client.
    os.kill(before[1].pid, signal.SIGKILL)
    rec = _wait_phase(cluster, job, pb.PHASE_DONE, timeout=15)
    assert sorted(rec.participants) == ["agent.node0", "agents"]  # node0 holds the fault rank
    assert controller.delivered == [] and controller.seen == []
    after = cluster.ranks(job)
    assert after[1].restart_count == 1 and after[0].pid == before[0].pid


def test_init_and_observe_on_a_closed_manager_say_it_is_closed(cluster: Cluster) -> None:
    job = "job-closed-init"
    cluster.agent(job, nproc=1, strategies="recover-in-place,exit")
    cluster.wait_running(job, 1)
    manager = DLRecoverManager(wire.ClientInfo(jobId=job), f"etcd://{cluster.endpoint}", prefix=cluster.prefix)
    manager.close()
    for call in (manager.init_clusterd, manager.observe):
        with pytest.raises(RecoverdError, match="closed"):
            call()


# ---------------------------------------------------------------------------- a late subscriber


def test_a_late_subscriber_first_gets_the_signal_the_recovery_waits_on(cluster: Cluster, controller_for) -> None:  # type: ignore[no-untyped-def]
    job = "job-late"
    cluster.coordinator()  # no strategy service yet: the recovery will wait in DECIDING
    cluster.agent(job, nproc=2, strategies="recover-in-place,exit")
    before = cluster.wait_running(job, 2)
    os.kill(before[0].pid, signal.SIGKILL)
    waiting = _wait_phase(cluster, job, pb.PHASE_DECIDING, timeout=15)
    assert sorted(waiting.participants) == ["agent.node0", "agents"]  # the agents answered so far
    stored = _stored_signals(cluster, job)
    assert [s.signal_type for _, s in stored] == ["stopTrain", "globalFault"]
    pending = stored[-1][1]
    assert pending.epoch == waiting.epoch and pending.uuid == waiting.uuid

    controller = controller_for(job, ("recover", "exit"))
    controller.start()
    cluster.wait_for("the pending signal", lambda: controller.delivered, timeout=5)
    first = controller.delivered[0]
    # The latest signal of the current epoch, not the episode's first (stopTrain).
    assert (first.seq, first.epoch, first.uuid, first.signal_type) == (
        pending.seq,
        pending.epoch,
        pending.uuid,
        "globalFault",
    )
    cluster.wait_for("the answer to globalFault", lambda: controller.codes, timeout=5)
    # Answering it is accepted (it is the current signal), though DECIDING no longer waits for it.
    assert controller.codes == [("on_global_rank", 0)]
    client = f"client.{controller.manager.client_id}"
    cluster.wait_for(
        "the client to take over from the agents",
        lambda: (r := _recovery(cluster, job)) is not None and list(r.participants) == [client],
        timeout=5,
    )
    assert _wait_phase(cluster, job, pb.PHASE_DECIDING).epoch == waiting.epoch  # still waiting, same epoch

    # The decision: the client, now the participant, must confirm RECOVERING (with the agent of
    # the commanded node) before the recovery is done.
    cluster.strategy()
    rec = _wait_phase(cluster, job, pb.PHASE_DONE, timeout=15)
    assert list(rec.participants) == [client]
    cluster.wait_for("every handler to run", lambda: len(controller.seen) >= 3, timeout=5)
    time.sleep(0.2)  # a duplicate would arrive now
    assert [s.signal_type for s in controller.delivered] == ["globalFault", "changeStrategy"]
    assert [s[0] for s in controller.seen] == ["on_global_rank", "change_strategy", "fault_nodes_restart"]
    assert controller.codes == [("on_global_rank", 0), ("change_strategy", 0)]
    run = cluster.view(job).run
    assert run is not None
    raw = cluster.get(cluster.keys.report(run, client, "recover_status"))
    assert raw is not None
    answer = decode(pb.Report, raw)
    assert (answer.epoch, answer.uuid, answer.strategy) == (rec.epoch, rec.uuid, "recover")
    assert cluster.ranks(job)[0].restart_count == 1


# ---------------------------------------------------------------------------- report codes


def test_report_codes_before_a_signal_with_no_faults_and_after_losing_registration(
    cluster: Cluster,
    controller_for,  # type: ignore[no-untyped-def]
) -> None:
    job = "job-codes"
    cluster.coordinator()
    cluster.strategy()
    cluster.agent(job, nproc=2, strategies="recover-in-place,exit")
    before = cluster.wait_running(job, 2)
    controller = controller_for(job, ("recover", "exit"))
    controller.register()
    manager = controller.manager

    # Nothing was delivered yet: there is nothing to answer (401), whatever the report.
    assert manager.report_stop_complete(0, "", {0: 1}) == Code.ORDER_MIXED
    assert manager.report_recover_strategy({0: 1}, ["exit"]) == Code.ORDER_MIXED
    assert manager.report_recover_status(0, "", {0: 1}, "recover") == Code.ORDER_MIXED
    # No fault is no fault report (409), and nothing is written for it.
    assert manager.report_process_fault({}) == Code.INVALID_PARAM
    assert _recovery(cluster, job) is None

    registrations: list[int] = []
    register = manager._session.register

    async def counted_register(*args: Any, **kwargs: Any) -> Any:
        outcome = await register(*args, **kwargs)
        registrations.append(outcome.code)
        return outcome

    manager._session.register = counted_register  # type: ignore[method-assign]
    key = _client_key(cluster, job, manager)

    # Unregistered but open (as after a lost lease): the report is refused with 400 inside, the
    # manager registers once and retries. 401: registering again delivers no signal, so there is
    # still nothing to answer.
    manager._call(manager._session.deregister())
    assert cluster.get(key) is None
    assert manager.report_stop_complete(0, "", {0: 1}) == Code.ORDER_MIXED
    assert registrations == [0]
    assert manager._session.is_registered and cluster.get(key) is not None

    # Now with a delivered signal: the controller walks a recovery, then loses its registration.
    controller.subscribe()
    os.kill(before[1].pid, signal.SIGKILL)
    rec = _wait_phase(cluster, job, pb.PHASE_DONE, timeout=15)
    cluster.wait_for("every handler to run", lambda: len(controller.seen) >= 4, timeout=5)
    assert controller.codes == [("stop_train", 0), ("on_global_rank", 0), ("change_strategy", 0)]
    assert registrations == [0]  # the handlers' reports needed no re-registration
    manager._call(manager._session.deregister())
    assert cluster.get(key) is None
    # 0: after re-registering (once) the last delivered signal (changeStrategy) is still the
    # recovery's current one (same epoch and uuid), and this client already answered it, so the
    # report is an acknowledged duplicate that changes nothing.
    assert manager.report_recover_status(0, "", {1: 1}, "recover") == Code.OK
    assert registrations == [0, 0]
    assert manager._session.is_registered and cluster.get(key) is not None
    assert _recovery(cluster, job) == rec  # the duplicate changed nothing


# ---------------------------------------------------------------------------- init_clusterd


def test_init_clusterd_waits_for_a_job_created_later(cluster: Cluster) -> None:
    job = "job-later"
    cluster.coordinator()
    manager = DLRecoverManager(wire.ClientInfo(jobId=job), f"etcd://{cluster.endpoint}", prefix=cluster.prefix)
    results: list[object] = []
    returned = threading.Event()

    def init() -> None:
        try:
            results.append(manager.init_clusterd())
        except BaseException as err:
            results.append(err)
        returned.set()

    waiter = threading.Thread(target=init, daemon=True)
    try:
        waiter.start()
        assert not returned.wait(0.5)  # no job yet: it waits
        assert manager.register().code == Code.UNINIT  # 408 until init_clusterd succeeded

        cluster.agent(job, nproc=1, strategies="recover-in-place,exit")
        spec_key = cluster.keys.job_spec(job)
        cluster.wait_for("the job record", lambda: cluster.get(spec_key), timeout=15)
        # Woken by the watch on the job's key: no polling interval to wait out.
        assert returned.wait(1.0), "init_clusterd did not return after the job was created"
        assert results == [True]
        assert manager.register().code == Code.OK
    finally:
        manager.close()
        waiter.join(timeout=5)
    assert not waiter.is_alive()


def test_init_clusterd_is_false_when_the_policy_allows_only_exit(cluster: Cluster) -> None:
    job = "job-exit-only"
    cluster.coordinator()
    cluster.agent(job, nproc=1)  # the default policy: exit only
    cluster.wait_running(job, 1)
    manager = DLRecoverManager(wire.ClientInfo(jobId=job), f"etcd://{cluster.endpoint}", prefix=cluster.prefix)
    try:
        assert manager.init_clusterd() is False
        assert manager.register().code == Code.UNINIT  # process-level recovery is off
        started = time.monotonic()
        manager.start_subscribe()  # returns at once: nothing to subscribe to
        assert time.monotonic() - started < 2
        assert not manager._session.is_registered
        assert not cluster.view(job).clients
    finally:
        manager.close()


# ---------------------------------------------------------------------------- found bugs


async def _seed_job(store: Store, keys: Keyspace, job: str) -> RunRef:
    run = RunRef(job, "run1")
    spec = pb.JobSpec(
        name=job,
        uid=run.uid,
        world_size=2,
        nnodes=1,
        nproc_per_node=2,
        policy=pb.Policy(strategies=["recover-in-place", "exit"]),
    )
    await store.put(keys.job_spec(job), encode(spec))
    return run


def test_a_signal_between_register_and_subscribe_is_delivered(etcd_endpoint: str, key_prefix: str) -> None:
    job = "job-gap"
    keys = Keyspace(key_prefix)

    async def seed() -> RunRef:
        async with Store(etcd_endpoint) as store:
            return await _seed_job(store, keys, job)

    run = asyncio.run(seed())
    manager = DLRecoverManager(wire.ClientInfo(jobId=job), f"etcd://{etcd_endpoint}", prefix=key_prefix)
    killed = threading.Event()
    manager.set_handler("killMaster", lambda _ranks, _signal: killed.set())
    thread: threading.Thread | None = None
    try:
        assert manager.init_clusterd() is True
        assert manager.register().code == Code.OK

        # After registration, before subscribing: the job's recovery fails and killMaster is sent
        # (as the coordinator writes it: the recovery FAILED, then signal seq 1 of its epoch).
        async def fail_the_job() -> None:
            async with Store(etcd_endpoint) as store:
                recovery = pb.Recovery(epoch=1, uuid="u1", phase=pb.PHASE_FAILED, recovery_id=1)
                await store.put(keys.recovery(run), encode(recovery))
                kill = pb.Signal(seq=1, epoch=1, uuid="u1", signal_type="killMaster", sent_at=ts_from_s(time.time()))
                await store.put(keys.signal(run, 1), encode(kill))

        asyncio.run(fail_the_job())
        thread = threading.Thread(target=manager.start_subscribe, daemon=True)
        thread.start()
        assert killed.wait(3), "killMaster published after register() never reached the subscriber"
        thread.join(timeout=3)
        assert not thread.is_alive()  # killMaster ends the subscription
    finally:
        manager.close()
        if thread is not None:
            thread.join(timeout=5)


def test_a_slow_handler_cannot_answer_a_signal_it_has_not_seen(cluster: Cluster, controller_for) -> None:  # type: ignore[no-untyped-def]
    job = "job-slow"
    cluster.coordinator()
    cluster.strategy()
    cluster.agent(job, nproc=2, strategies="recover-in-place,exit")
    before = cluster.wait_running(job, 2)
    controller = controller_for(job, ("recover", "exit"))
    gate = controller.gates["on_global_rank"] = threading.Event()
    controller.start()
    manager = controller.manager

    os.kill(before[1].pid, signal.SIGKILL)
    cluster.wait_for("globalFault to reach the handler", lambda: len(controller.seen) >= 2, timeout=10)
    assert controller.seen[1][:2] == ("on_global_rank", "globalFault")
    # While the globalFault handler still works, another fault restarts the round (epoch 2).
    assert manager.report_process_fault({0: 1}) == Code.OK
    cluster.wait_for(
        "stopTrain of epoch 2 to be published",
        lambda: any(s.epoch == 2 and s.signal_type == "stopTrain" for _, s in _stored_signals(cluster, job)),
        timeout=10,
    )
    time.sleep(0.2)  # it reaches the client's watch, but no handler has it yet
    assert [s.signal_type for s in controller.delivered] == ["stopTrain", "globalFault"]  # not handed over yet
    gate.set()
    cluster.wait_for("the globalFault answer", lambda: len(controller.codes) >= 2, timeout=10)
    # The answer is to globalFault of epoch 1, which is stale now: it must be refused.
    assert controller.codes[1] == ("on_global_rank", Code.ORDER_MIXED)


def test_a_live_client_is_a_participant_again_after_an_etcd_outage(key_prefix: str) -> None:
    job = "job-outage"
    keys = Keyspace(key_prefix)
    etcd = EmbeddedEtcd(for_tests=True)
    etcd.start()
    manager: DLRecoverManager | None = None
    try:

        async def seed() -> RunRef:
            async with Store(etcd.endpoint) as store:
                return await _seed_job(store, keys, job)

        run = asyncio.run(seed())
        manager = DLRecoverManager(
            wire.ClientInfo(jobId=job), f"etcd://{etcd.endpoint}", prefix=key_prefix, lease_ttl_s=1
        )
        assert manager.init_clusterd() is True
        assert manager.register().code == Code.OK
        etcd.kill9()
        time.sleep(1.5)  # longer than the client's lease TTL (1 s)
        etcd.restart()

        async def client_keys() -> list[str]:
            async with Store(etcd.endpoint) as store:
                return [kv.key for kv in (await store.get_prefix(keys.clients_prefix(run))).kvs]

        # etcd restores the lease with a fresh TTL; once that runs out (~1 s) the key is gone unless
        # the client keeps or renews its registration.
        time.sleep(2.5)
        assert manager._session.is_registered
        assert asyncio.run(client_keys()) == [keys.client(run, manager.client_id)]
    finally:
        if manager is not None:
            manager.close()
        etcd.stop()
