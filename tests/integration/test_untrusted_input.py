"""Everything under the prefix is untrusted, and etcd's limits hold: coordinator passes against the
real etcd, one at a time (tests/integration/untrusted.py), with the input a buggy or hostile writer
leaves: undecodable keys, unknown key shapes, garbage that parses as JSON, clobbered records, and
more work than one etcd transaction can hold.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from recoverd import events as coordinator_events
from recoverd.coordinator.reconciler import Coordinator
from recoverd.jobview import read_job
from recoverd.keys import Keyspace
from recoverd.records import decode, encode, pb, ts_from_s
from recoverd.store import Put, Store
from recoverd.strategy.service import StrategyService

from .untrusted import Job, drain, events, fault, leader, seed_job

pytestmark = pytest.mark.etcd


async def _setup(
    store: Store, keys: Keyspace, *, nnodes: int = 2, nproc: int = 2, strategies: tuple[str, ...] = ("exit",)
) -> tuple[Coordinator, Job]:
    lease = await store._grant(60)
    job = await seed_job(store, keys, "job-u", nnodes=nnodes, nproc=nproc, lease=lease, strategies=strategies)
    coordinator = await leader(store, keys)
    await drain(coordinator, job.name)
    return coordinator, job


async def _recovery(store: Store, keys: Keyspace, job: Job) -> pb.Recovery | None:
    kv = await store.get(keys.recovery(job.run))
    return None if kv is None else decode(pb.Recovery, kv.value)


async def _a_real_fault_is_recovered(store: Store, keys: Keyspace, coordinator: Coordinator, job: Job) -> None:
    """After the garbage, a real fault opens the next epoch with exactly its rank."""
    before = await _recovery(store, keys, job)
    fault_id, value = fault(job, 1, f"real-{time.time_ns()}")
    await store.put(keys.fault(job.run, fault_id), value)
    await drain(coordinator, job.name)
    after = await _recovery(store, keys, job)
    assert after is not None
    assert after.epoch == (before.epoch if before else 0) + 1
    assert [f.rank for f in after.faults] == [1]
    assert after.phase == pb.PHASE_COLLECTING


# ---------------------------------------------------------------------------- keys


async def test_an_undecodable_key_is_recorded_and_removed(store: Store, keys: Keyspace) -> None:
    coordinator, job = await _setup(store, keys)
    bad = keys.faults_prefix(job.run) + b"x\xff\xfe".decode("utf-8", "surrogateescape")
    in_job_segment = keys.jobs_prefix() + b"j\xff".decode("utf-8", "surrogateescape") + "/spec"
    await store.put(bad, b"{}")
    await store.put(in_job_segment, b"{}")
    # Neither the enqueue-all read nor a pass crashes.
    await coordinator._jobs.enqueue_all()
    await drain(coordinator, job.name)
    (event,) = await events(store, keys, job.run, "bad_record")
    assert event.data["key"].endswith("x\\udcff\\udcfe")
    assert await store.get(bad) is None
    assert await store.get(in_job_segment) is not None  # names no valid job: harmless, left alone
    assert await _recovery(store, keys, job) is None
    await _a_real_fault_is_recovered(store, keys, coordinator, job)


@pytest.mark.parametrize("name", ["zzz", "1x", "-1", "0000000000000000000000001"])
async def test_a_signal_key_that_is_not_a_number_is_bad_input(store: Store, keys: Keyspace, name: str) -> None:
    coordinator, job = await _setup(store, keys)
    key = keys.signals_prefix(job.run) + name
    await store.put(key, encode(pb.Signal(seq=1, epoch=1, signal_type="stopTrain")))
    await drain(coordinator, job.name)
    (event,) = await events(store, keys, job.run, "bad_record")
    assert "sequence number" in event.message or "invalid signals id" in event.message
    assert await store.get(key) is None
    await _a_real_fault_is_recovered(store, keys, coordinator, job)


# ---------------------------------------------------------------------------- values that parse as JSON


@pytest.mark.parametrize(
    "value",
    [b"{}", b"[]", b'"str"', b'{"unknown": 1}', b"null", b'{"fault_id": "other", "rank": 0}'],
    ids=["empty", "list", "string", "unknown-fields", "null", "id-mismatch"],
)
async def test_garbage_faults_touch_no_rank(store: Store, keys: Keyspace, value: bytes) -> None:
    coordinator, job = await _setup(store, keys)
    key = keys.fault(job.run, "x")
    await store.put(key, value)
    await drain(coordinator, job.name)
    (event,) = await events(store, keys, job.run, "bad_record")
    assert event.data["key"] == key
    assert await store.get(key) is None
    assert await _recovery(store, keys, job) is None, "garbage opened a recovery (rank 0 restarted)"
    await _a_real_fault_is_recovered(store, keys, coordinator, job)


@pytest.mark.parametrize(
    "value", [b"[]", b"{}", encode(pb.NodeRecord(node="ghost"))], ids=["list", "empty", "no-lease"]
)
async def test_a_ghost_node_is_not_a_participant(store: Store, keys: Keyspace, value: bytes) -> None:
    coordinator, job = await _setup(store, keys)
    key = keys.node(job.run, "ghost")
    await store.put(key, value)
    await drain(coordinator, job.name)
    assert await store.get(key) is None
    view = await read_job(store, keys, job.name)
    assert "ghost" not in view.nodes
    await _a_real_fault_is_recovered(store, keys, coordinator, job)
    recovery = await _recovery(store, keys, job)
    assert recovery is not None and "agent.ghost" not in recovery.participants


async def test_a_leased_node_record_with_garbage_is_kept_and_the_node_stays_live(store: Store, keys: Keyspace) -> None:
    coordinator, job = await _setup(store, keys)
    key = keys.node(job.run, "n0")
    await store.put(key, b"garbage", lease=job.lease)  # clobbered, but its owner's lease still holds it
    for _ in range(3):
        await drain(coordinator, job.name)
    kv = await store.get(key)
    assert kv is not None and kv.value == b"garbage", "another service's leased record was deleted"
    bad = await events(store, keys, job.run, "bad_record")
    assert len(bad) == 1 and "leased" in bad[0].message  # recorded once, not once per pass
    assert await _recovery(store, keys, job) is None, "the node was taken for lost"
    await _a_real_fault_is_recovered(store, keys, coordinator, job)
    recovery = await _recovery(store, keys, job)
    assert recovery is not None and "agent.n0" in recovery.participants


# ---------------------------------------------------------------------------- the coordinator's own records


# The last one parses but has no recovery id: refused like the others (and its epoch 1 < 3 anyway).
@pytest.mark.parametrize("value", [b"{}", b"garbage", encode(pb.Recovery(epoch=1, phase=pb.PHASE_DONE))])
async def test_a_clobbered_recovery_is_rebuilt_and_the_epoch_never_repeats(
    store: Store, keys: Keyspace, value: bytes
) -> None:
    coordinator, job = await _setup(store, keys)
    # Two recoveries happened: epoch 3 is the last one any record names.
    history = pb.History(outcomes=[pb.RecoveryOutcome(epoch=2, strategy="exit", ok=True)])
    decision = pb.Decision(epoch=3, strategy="exit", decided_at=ts_from_s(time.time()))
    command = pb.Command(epoch=3, seq=4, action=pb.ACTION_RESTART_ALL)
    await store.txn(
        [],
        [
            Put(keys.history(job.run), encode(history)),
            Put(keys.decision(job.run, 3), encode(decision)),
            Put(keys.command(job.run, "n0"), encode(command)),
            Put(keys.recovery(job.run), value),
        ],
    )
    await drain(coordinator, job.name)
    rebuilt = await _recovery(store, keys, job)
    assert rebuilt is not None and rebuilt.epoch == 3 and rebuilt.phase == pb.PHASE_DONE
    (note,) = await events(store, keys, job.run, "recovery_rebuilt")
    assert "epoch 3" in note.message
    await _a_real_fault_is_recovered(store, keys, coordinator, job)
    after = await _recovery(store, keys, job)
    assert after is not None and after.epoch == 4


async def test_a_garbage_spec_is_reported_not_crashed_on(store: Store, keys: Keyspace) -> None:
    coordinator, job = await _setup(store, keys)
    await store.put(keys.job_spec(job.name), b'{"name": "other"}')
    await drain(coordinator, job.name)  # no exception, nothing written
    view = await read_job(store, keys, job.name)
    assert view.spec is None and "other" in view.spec_error
    assert await store.get(keys.job_spec(job.name)) is not None  # the job's identity is not deleted
    await StrategyService(store, keys).reconcile(job.name)


# ---------------------------------------------------------------------------- etcd's limits


async def test_80_faults_at_once_fit_etcds_limits(store: Store, keys: Keyspace) -> None:
    """10 nodes x 8 ranks fail together: every fault lands in one recovery, no pass is refused."""
    coordinator, job = await _setup(store, keys, nnodes=10, nproc=8)
    ops = [Put(keys.fault(job.run, fid), value) for fid, value in (fault(job, r) for r in range(80))]
    await store.txn([], ops)
    began = time.perf_counter()
    passes = await drain(coordinator, job.name)
    took = time.perf_counter() - began
    print(f"80 faults: {passes} passes, {took * 1000:.0f} ms")
    recovery = await _recovery(store, keys, job)
    assert recovery is not None and recovery.epoch == 1
    assert sorted(f.rank for f in recovery.faults) == list(range(80))
    assert (await read_job(store, keys, job.name)).faults == {}
    assert len(await events(store, keys, job.run, "recovery_opened")) == 1


async def test_100_bad_keys_are_all_recorded_and_removed(store: Store, keys: Keyspace) -> None:
    coordinator, job = await _setup(store, keys)
    ops = [Put(keys.fault(job.run, f"junk{i:03d}"), b"{not json") for i in range(100)]
    await store.txn([], ops)
    passes = await drain(coordinator, job.name)
    assert passes >= 5  # bounded per pass, requeued for the rest
    assert len(await events(store, keys, job.run, "bad_record")) == 100
    assert (await store.get_prefix(keys.faults_prefix(job.run))).kvs == []
    await _a_real_fault_is_recovered(store, keys, coordinator, job)


async def test_the_second_recovery_of_a_64_node_job_fits(store: Store, keys: Keyspace) -> None:
    """Epoch change with 64 x 3 answers of the old epoch: consumed by one prefix delete, no stale events."""
    coordinator, job = await _setup(store, keys, nnodes=64, nproc=1)
    participants = [f"agent.{n}" for n in job.nodes]
    done = pb.Recovery(epoch=1, recovery_id=1, phase=pb.PHASE_DONE, participants=participants, strategy="exit")
    ops = [Put(keys.recovery(job.run), encode(done))]
    for node in job.nodes:
        for kind in (pb.REPORT_STOP_COMPLETE, pb.REPORT_STRATEGIES, pb.REPORT_RECOVER_STATUS):
            report = pb.Report(participant=f"agent.{node}", epoch=1, kind=kind)
            name = pb.ReportKind.Name(kind).removeprefix("REPORT_").lower()
            ops.append(Put(keys.report(job.run, f"agent.{node}", name), encode(report)))
    for start in range(0, len(ops), 100):
        await store.txn([], ops[start : start + 100])
    fid, value = fault(job, 5)
    await store.put(keys.fault(job.run, fid), value)
    await drain(coordinator, job.name)
    recovery = await _recovery(store, keys, job)
    assert recovery is not None and recovery.epoch == 2
    assert (await store.get_prefix(keys.reports_prefix(job.run))).kvs == []
    assert await events(store, keys, job.run, "stale_epoch") == []


async def test_a_job_with_5_mb_of_values_is_read_and_the_oversized_ones_removed(store: Store, keys: Keyspace) -> None:
    coordinator, job = await _setup(store, keys)
    for i in range(5):
        await store.put(keys.ack(job.run, f"big{i}"), b"x" * 1_000_000)
    began = time.perf_counter()
    view = await read_job(store, keys, job.name)
    print(f"read_job over 5 MB: {(time.perf_counter() - began) * 1000:.0f} ms")
    assert len(view.bad) == 5 and all("cap" in b.reason for b in view.bad)
    await StrategyService(store, keys).reconcile(job.name)
    await drain(coordinator, job.name)
    assert len(await events(store, keys, job.run, "bad_record")) == 5
    assert (await store.get_prefix(keys.acks_prefix(job.run))).kvs == []
    await _a_real_fault_is_recovered(store, keys, coordinator, job)


async def test_a_pass_with_more_puts_than_one_transaction_holds_commits_them_all(store: Store, keys: Keyspace) -> None:
    """300 commands and 200 events (an `exit` of a 300-node job): the fenced transaction takes the
    recovery record first, the rest follows in fenced chunks; nothing is refused or lost."""
    coordinator, job = await _setup(store, keys)
    view = await read_job(store, keys, job.name)
    recovery = pb.Recovery(epoch=1, recovery_id=1, phase=pb.PHASE_RECOVERING)
    ops: list[Any] = [
        Put(keys.command(job.run, f"m{i:03d}"), encode(pb.Command(epoch=1, seq=1, action=pb.ACTION_RESTART_ALL)))
        for i in range(300)
    ]
    ops.append(Put(keys.recovery(job.run), encode(recovery)))
    ev = [
        coordinator_events.event_put(keys, job.run, "coordinator", "command_sent", f"to m{i:03d}") for i in range(200)
    ]
    await coordinator._commit(view, ops, ev)
    assert len((await store.get_prefix(keys.commands_prefix(job.run))).kvs) == 300
    assert await _recovery(store, keys, job) == recovery
    assert len(await events(store, keys, job.run, "command_sent")) == 200


async def test_follow_up_puts_are_fenced_by_the_recovery_record(store: Store, keys: Keyspace) -> None:
    """If another pass rewrote the recovery between the fenced commit and a follow-up chunk, the
    chunk is not written (that pass owns the recovery now) and the job is requeued."""
    coordinator, job = await _setup(store, keys)
    view = await read_job(store, keys, job.name)
    real_txn = store.txn
    calls = 0

    async def txn_with_a_rival(compares: Any, success: Any, failure: Any = ()) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:  # after the fenced commit, before the first follow-up chunk
            await store.put(keys.recovery(job.run), encode(pb.Recovery(epoch=2, recovery_id=2, phase=pb.PHASE_DONE)))
        return await real_txn(compares, success, failure)

    ops: list[Any] = [
        Put(keys.command(job.run, f"m{i:03d}"), encode(pb.Command(epoch=1, seq=1, action=pb.ACTION_RESTART_ALL)))
        for i in range(200)
    ]
    store.txn = txn_with_a_rival  # type: ignore[method-assign]
    try:
        await coordinator._commit(view, ops, [])
    finally:
        store.txn = real_txn  # type: ignore[method-assign]
    assert len((await store.get_prefix(keys.commands_prefix(job.run))).kvs) == 128
    assert job.name in coordinator._jobs.queue._queued
