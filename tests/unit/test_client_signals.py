"""The client library's pure parts: the signal pipeline, the server address, the loop thread.

No etcd here: ``taskd_client.signals.plan``/``to_wire`` decide what a subscriber runs for a signal,
``parse_server_addr`` says which addresses the client accepts, and ``LoopThread`` is the bridge from
the synchronous MindCluster API to the asyncio etcd client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

import pytest

from recoverd.errors import ConfigError
from recoverd.mindcluster import recover_pb2 as wire
from recoverd.records import pb, ts_from_s
from taskd_client.loop_thread import LoopThread
from taskd_client.manager import DLRecoverManager, parse_server_addr
from taskd_client.signals import KILL_MASTER, Delivery, plan, to_wire

JOB = "job-a"


def _message(**fields: Any) -> wire.ProcessManageSignal:
    base: dict[str, Any] = {
        "uuid": "u-1",
        "jobId": JOB,
        "signalType": "stopTrain",
        "actions": ["stop_train"],
        "faultRanks": [wire.FaultRank(rankId="1", faultType="0")],
    }
    base.update(fields)
    return wire.ProcessManageSignal(**base)


# ---------------------------------------------------------------------------- plan


def test_a_plain_signal_is_planned_with_its_actions_and_ranks() -> None:
    assert plan(_message(), JOB) == Delivery("stopTrain", ("stop_train",), {1: 0})


def test_keep_alive_is_ignored() -> None:
    assert plan(_message(signalType="keep-alive", actions=[]), JOB) is None
    assert plan(_message(signalType="keep-alive", actions=["stop_train"]), JOB) is None


@pytest.mark.parametrize("signal_type", ["stopTrain", "globalFault", "changeStrategy", KILL_MASTER])
def test_a_signal_for_another_job_is_discarded(signal_type: str) -> None:
    # Unlike upstream, killMaster is checked against the job id too: it must not end another job.
    assert plan(_message(jobId="job-b", signalType=signal_type), JOB) is None


def test_a_signal_without_a_job_id_is_taken_as_ours() -> None:
    assert plan(_message(jobId=""), JOB) == Delivery("stopTrain", ("stop_train",), {1: 0})


@pytest.mark.parametrize("actions", [[], [""], ["", ""]])
def test_a_signal_without_actions_is_ignored(actions: list[str]) -> None:
    assert plan(_message(actions=actions), JOB) is None


@pytest.mark.parametrize(
    ("actions", "expected"),
    [
        (["b", "a", "b"], ("b", "a")),
        (["change_strategy", "fault_nodes_restart"], ("change_strategy", "fault_nodes_restart")),
        (["z", "", "y", "z", "x", "y"], ("z", "y", "x")),
        (["a", "a", "a"], ("a",)),
    ],
)
def test_actions_keep_their_order_without_duplicates(actions: list[str], expected: tuple[str, ...]) -> None:
    delivery = plan(_message(signalType="changeStrategy", actions=actions), JOB)
    assert delivery is not None and delivery.actions == expected


def test_fault_ranks_become_int_to_int_and_malformed_entries_are_skipped() -> None:
    ranks = [
        wire.FaultRank(rankId="3", faultType="0"),
        wire.FaultRank(rankId="5", faultType="2"),
        wire.FaultRank(rankId="7", faultType=""),  # no type: upstream's default, 1 (not retryable)
        wire.FaultRank(rankId="x", faultType="1"),  # not a rank
        wire.FaultRank(rankId="", faultType="1"),
        wire.FaultRank(rankId="9", faultType="uce"),  # not a type
    ]
    delivery = plan(_message(faultRanks=ranks), JOB)
    assert delivery is not None
    assert delivery.fault_ranks == {3: 0, 5: 2, 7: 1}
    assert all(type(k) is int and type(v) is int for k, v in delivery.fault_ranks.items())


def test_no_fault_ranks_is_an_empty_dict() -> None:
    delivery = plan(_message(faultRanks=[]), JOB)
    assert delivery is not None and delivery.fault_ranks == {}


def test_kill_master_has_no_actions() -> None:
    delivery = plan(_message(signalType=KILL_MASTER, actions=["stop_train", "x"], faultRanks=[]), JOB)
    assert delivery == Delivery(KILL_MASTER, (), {}, is_kill_master=True)
    # Even with no actions at all (as the coordinator sends it) it is not ignored.
    bare = plan(_message(signalType=KILL_MASTER, actions=[], faultRanks=[]), JOB)
    assert bare is not None and bare.is_kill_master and bare.actions == ()


def test_only_kill_master_is_a_kill() -> None:
    for signal_type in ("stopTrain", "globalFault", "changeStrategy", "killmaster"):
        delivery = plan(_message(signalType=signal_type), JOB)
        assert delivery is not None and not delivery.is_kill_master


# ---------------------------------------------------------------------------- to_wire


def test_to_wire_maps_every_field_of_a_stored_signal() -> None:
    stored = pb.Signal(
        seq=7,
        epoch=3,
        uuid="18A-beef",
        signal_type="changeStrategy",
        actions=["change_strategy", "fault_nodes_restart"],
        fault_ranks=[pb.FaultRankWire(rank_id="1", fault_type="0"), pb.FaultRankWire(rank_id="4", fault_type="2")],
        change_strategy="recover",
        timeout=30,
        node_rank_ids=["0", "2"],
        extra_params="recover-in-place",
        sent_at=ts_from_s(1_700_000_000.5),
    )
    message = to_wire(stored, JOB)
    assert message == wire.ProcessManageSignal(
        uuid="18A-beef",
        jobId=JOB,
        signalType="changeStrategy",
        actions=["change_strategy", "fault_nodes_restart"],
        faultRanks=[wire.FaultRank(rankId="1", faultType="0"), wire.FaultRank(rankId="4", faultType="2")],
        changeStrategy="recover",
        timeout=30,
        nodeRankIds=["0", "2"],
        extraParams="recover-in-place",
    )
    # Every wire field is set from the record (none left at its default by omission).
    assert {f.name for f, _ in message.ListFields()} == {f.name for f in wire.ProcessManageSignal.DESCRIPTOR.fields}
    assert plan(message, JOB) == Delivery("changeStrategy", ("change_strategy", "fault_nodes_restart"), {1: 0, 4: 2})


def test_to_wire_of_an_empty_signal_names_only_the_job() -> None:
    assert to_wire(pb.Signal(), JOB) == wire.ProcessManageSignal(jobId=JOB)


# ---------------------------------------------------------------------------- server address


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("etcd://127.0.0.1:2379", [("127.0.0.1", 2379)]),
        ("etcd://a:1,b:2", [("a", 1), ("b", 2)]),
        ("etcd://a:1, etcd://b:2/", [("a", 1), ("b", 2)]),
        ("http://10.0.0.1:2379,10.0.0.2:2380", [("10.0.0.1", 2379), ("10.0.0.2", 2380)]),
        ("  etcd://[::1]:2379  ", [("::1", 2379)]),
    ],
)
def test_etcd_and_http_addresses_parse(text: str, expected: list[tuple[str, int]]) -> None:
    assert parse_server_addr(text) == expected


@pytest.mark.parametrize("text", ["127.0.0.1:8899", "localhost:2379", "a:1,b:2"])
def test_a_bare_host_port_is_the_gateway_which_is_not_built(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_server_addr(text)
    message = str(caught.value)
    assert "talks to etcd directly" in message
    assert "etcd://" in message


@pytest.mark.parametrize("text", ["etcd://", "etcd://host", "etcd://host:0", "http://host:notaport"])
def test_a_malformed_etcd_address_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_server_addr(text)


def test_the_manager_refuses_a_gateway_address_before_starting_anything() -> None:
    threads = threading.active_count()
    with pytest.raises(ConfigError, match="talks to etcd directly"):
        DLRecoverManager(wire.ClientInfo(jobId=JOB), "127.0.0.1:8899")
    assert threading.active_count() == threads  # no loop thread left behind


@pytest.mark.parametrize("info", [{"jobId": JOB}, JOB, None, pb.ClientRecord(client_id="c")])
def test_the_manager_wants_a_client_info(info: object) -> None:
    threads = threading.active_count()
    with pytest.raises(TypeError, match="ClientInfo"):
        DLRecoverManager(info, "etcd://127.0.0.1:2379")  # type: ignore[arg-type]
    assert threading.active_count() == threads


# ---------------------------------------------------------------------------- LoopThread


@pytest.fixture
def loop_thread() -> Any:
    lt = LoopThread(name="test-loop")
    try:
        yield lt
    finally:
        lt.close()


def test_call_returns_the_result(loop_thread: LoopThread) -> None:
    async def answer() -> tuple[int, str]:
        await asyncio.sleep(0)
        return 42, threading.current_thread().name

    assert loop_thread.call(answer(), 5) == (42, "test-loop")


def test_call_propagates_the_exception(loop_thread: LoopThread) -> None:
    class Boom(Exception):
        pass

    async def fail() -> None:
        await asyncio.sleep(0)
        raise Boom("bad")

    with pytest.raises(Boom, match="bad"):
        loop_thread.call(fail(), 5)
    # The loop survives a failed call.
    assert loop_thread.call(asyncio.sleep(0, result="still here"), 5) == "still here"


def test_call_times_out_and_cancels_the_coroutine(loop_thread: LoopThread) -> None:
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(concurrent.futures.TimeoutError):
        loop_thread.call(forever(), 0.05)
    assert cancelled.wait(5), "the timed-out coroutine kept running"


def test_call_from_the_loop_thread_is_refused(loop_thread: LoopThread) -> None:
    async def nested() -> BaseException | None:
        inner = asyncio.sleep(0)
        try:
            loop_thread.call(inner, 1)
        except RuntimeError as err:
            return err
        finally:
            inner.close()
        return None

    err = loop_thread.call(nested(), 5)
    assert isinstance(err, RuntimeError) and "deadlock" in str(err)


def test_close_is_idempotent_joins_the_thread_and_cancels_what_runs() -> None:
    lt = LoopThread(name="test-close")
    thread = lt._thread
    started = threading.Event()

    async def forever() -> None:
        started.set()
        await asyncio.sleep(60)

    pending = lt.submit(forever())
    assert started.wait(5)
    lt.close()
    assert not thread.is_alive()
    assert lt.loop.is_closed()
    assert pending.cancelled()
    lt.close()  # again: nothing to do, no error
    lt.close(timeout_s=0.01)
    assert not thread.is_alive()
