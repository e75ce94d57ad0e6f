"""The watch-fed job cache and an agent's watched keys, against a real etcd.

The cache replaces a full read of the job on every pass (docs/adr/0029); it is only correct if, at
any point the watch has caught up to, its view equals what a fresh read of etcd returns: the same
records, the same bad keys, the same revision. These tests write a job's keys (good, bad, deleted,
overwritten, leased), then compare the cache's view with ``read_job`` at the same revision.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from recoverd.agent.watched import WatchedKeys
from recoverd.controller import JobController
from recoverd.jobcache import JobCache
from recoverd.jobview import JobView, read_job
from recoverd.keys import Keyspace, RunRef
from recoverd.records import encode, pb
from recoverd.store import Store

pytestmark = pytest.mark.etcd

JOB = "cached"


def _spec(uid: str = "20261202000000-0000abcd") -> pb.JobSpec:
    return pb.JobSpec(
        name=JOB, uid=uid, world_size=16, nnodes=4, nproc_per_node=4, policy=pb.Policy(strategies=["exit"])
    )


def _same(a: JobView, b: JobView) -> None:
    """Two views hold the same records and the same bad keys."""
    assert a.spec == b.spec and a.run == b.run and a.recovery == b.recovery and a.status == b.status
    assert a.nodes == b.nodes and a.ranks == b.ranks and a.faults == b.faults and a.reports == b.reports
    assert a.commands == b.commands and a.acks == b.acks and a.decisions == b.decisions
    assert a.signals == b.signals and a.other_runs == b.other_runs
    assert sorted((x.key, x.reason) for x in a.bad) == sorted((x.key, x.reason) for x in b.bad)


async def _caught_up(controller: JobController, store: Store) -> int:
    revision = await store.revision()
    assert controller.cache is not None
    await asyncio.wait_for(controller.cache.reached(revision), 5)
    return revision


async def test_the_cached_view_equals_a_fresh_read_through_writes_deletes_and_bad_keys(
    store: Store, keys: Keyspace
) -> None:
    async def nothing(job: str) -> None:
        return

    controller = JobController(store, keys, nothing, name="test", cached=True)
    run = RunRef(JOB, _spec().uid)
    await store.put(keys.job_spec(JOB), encode(_spec()))
    start = await controller.enqueue_all()
    watch = asyncio.create_task(controller.watch(start + 1))
    rng = random.Random(7)
    try:
        async with store.lease(10) as lease:
            for round_ in range(6):
                for node in range(4):
                    name = f"n{node}"
                    table = pb.NodeRanks(
                        node=name,
                        ranks=[
                            pb.RankStatus(rank=node * 4 + i, node=name, state=pb.RANK_RUNNING, pid=100 + round_)
                            for i in range(4)
                        ],
                    )
                    await store.put(keys.ranks(run, name), encode(table))
                    if round_ == 0:
                        record = pb.NodeRecord(node=name, node_rank=node, ranks=[node * 4 + i for i in range(4)])
                        await store.put(keys.node(run, name), encode(record), lease=lease.id)
                fault = pb.Fault(fault_id=f"n1.r5.g{round_}.c0", rank=5, node="n1", generation=round_)
                await store.put(keys.fault(run, fault.fault_id), encode(fault))
                if rng.random() < 0.5:
                    await store.delete(keys.fault(run, fault.fault_id))
                await store.put(
                    keys.command(run, "n2"),
                    encode(pb.Command(epoch=round_ + 1, seq=round_ + 1, action=pb.ACTION_RESTART_RANKS, ranks=[9])),
                )
                # Bad input: a value that does not decode, an unknown kind, a rank outside the job.
                await store.put(
                    keys.ack(run, "n3"), b"{not json" if round_ % 2 else encode(pb.CommandAck(epoch=1, seq=1, ok=True))
                )
                await store.put(keys.run_prefix(run) + "mystery/x", b"?")
                await store.put(keys.fault(run, "n0.r99.g0.c0"), encode(pb.Fault(fault_id="n0.r99.g0.c0", rank=99)))
                revision = await _caught_up(controller, store)
                cached = await controller.view(JOB)
                fresh = await read_job(store, keys, JOB)
                assert cached.revision == revision == fresh.revision
                _same(cached, fresh)
            # A node's lease ends: its record goes, in the cache too.
            await lease.aclose()
        await _caught_up(controller, store)
        cached, fresh = await controller.view(JOB), await read_job(store, keys, JOB)
        assert not cached.nodes
        _same(cached, fresh)
        # A new run of the job (a new spec uid): the old run's keys are another run's now.
        await store.put(keys.job_spec(JOB), encode(_spec("20261202000001-0000abce")))
        await _caught_up(controller, store)
        cached, fresh = await controller.view(JOB), await read_job(store, keys, JOB)
        assert cached.other_runs == {run.uid}
        _same(cached, fresh)
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        controller.close()


async def test_a_view_waits_for_the_reconcilers_own_write(store: Store, keys: Keyspace) -> None:
    """After writing at revision R, the next view of that job includes R (the watch brought it)."""

    async def nothing(job: str) -> None:
        return

    controller = JobController(store, keys, nothing, name="test", cached=True)
    await store.put(keys.job_spec(JOB), encode(_spec()))
    start = await controller.enqueue_all()
    run = RunRef(JOB, _spec().uid)
    written = await store.put(keys.history(run), encode(pb.History(outcomes=[pb.RecoveryOutcome(epoch=1, ok=True)])))
    controller.written(JOB, written)
    viewer = asyncio.create_task(controller.view(JOB))
    await asyncio.sleep(0.05)
    assert not viewer.done(), "the view must wait until the watch has brought the write back"
    watch = asyncio.create_task(controller.watch(start + 1))
    try:
        view = await asyncio.wait_for(viewer, 5)
        assert view.revision >= written and view.history is not None
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        controller.close()


async def test_a_cache_reloaded_after_a_resync_forgets_deleted_keys(store: Store, keys: Keyspace) -> None:
    cache = JobCache(keys)
    run = RunRef(JOB, _spec().uid)
    await store.put(keys.job_spec(JOB), encode(_spec()))
    await store.put(keys.command(run, "n1"), encode(pb.Command(epoch=1, seq=1, action=pb.ACTION_RESTART_ALL)))
    cache.load(await store.get_prefix(keys.jobs_prefix()))
    assert "n1" in cache.view(JOB).commands
    await store.delete(keys.command(run, "n1"))  # a delete the (missing) watch never delivered
    cache.load(await store.get_prefix(keys.jobs_prefix()))
    assert cache.view(JOB).commands == {}
    assert len(cache.memo) == 0  # the deleted command's decoded record is forgotten too (the spec is never memoized)


async def test_watched_keys_keep_the_newest_value_whatever_arrives_first(store: Store, keys: Keyspace) -> None:
    key = keys.prefix + "/watched/x"
    watched = WatchedKeys(store)
    assert await watched.value(key) is None  # absent, as read (and remembered as of that read)
    first = await store.put(key, b"1")
    second = await store.put(key, b"2")
    stream = store.watch_key(key, first)
    events = [await anext(stream) for _ in range(2)]
    await stream.aclose()
    watched.apply(key, events[1])
    watched.apply(key, events[0])  # an older event after a newer one changes nothing
    assert await watched.value(key) == b"2" and second == events[1].mod_revision
    watched.forget(key)
    await store.put(key, b"3")
    assert await watched.value(key) == b"3"  # read again from etcd
    watched.apply(key, events[1])  # a stale event after the read: the read is newer
    assert await watched.value(key) == b"3"
