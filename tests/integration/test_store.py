"""The store against a real etcd: reads/writes, fenced transactions, leases, resuming watches.

No mocks: the guarantees the coordinator relies on (a fenced txn fails after a concurrent write, a
watch neither loses nor repeats events across an etcd kill -9, a compacted watch resyncs) only mean
something against the real server. Tests share the session's etcd and isolate by ``key_prefix``,
except those that kill or compact etcd, which run their own :class:`EmbeddedEtcd`.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from recoverd.errors import ConfigError
from recoverd.etcd_server import EmbeddedEtcd, find_etcdctl_binary
from recoverd.store import (
    Absent,
    Delete,
    ModRevisionAtMost,
    Put,
    Resync,
    Store,
    ValueIs,
    WatchEvent,
)

_WAIT_S = 3.0


# ---------------------------------------------------------------------------- helpers


class Collector:
    """Consumes ``store.watch_prefix`` in a task and records what it yields, in order.

    ``wait_for`` blocks on a condition notified per item (no polling); ``times`` holds the loop
    time at which each item arrived.
    """

    def __init__(self, store: Store, prefix: str, start_revision: int) -> None:
        self.items: list[WatchEvent | Resync] = []
        self.times: list[float] = []
        self._changed = asyncio.Condition()
        self._store = store
        self._prefix = prefix
        self._start = start_revision
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        async for item in self._store.watch_prefix(self._prefix, start_revision=self._start):
            async with self._changed:
                self.items.append(item)
                self.times.append(asyncio.get_running_loop().time())
                self._changed.notify_all()

    async def wait_for(self, predicate: str, check: object, timeout_s: float = _WAIT_S) -> None:
        assert callable(check)
        async with asyncio.timeout(timeout_s):
            async with self._changed:
                while not check(self.items):
                    assert self._task is not None
                    if self._task.done():
                        self._task.result()  # re-raise the watch's crash, if any
                        raise AssertionError(f"watch ended before {predicate}")
                    await self._changed.wait()

    def task_alive(self) -> bool:
        return self._task is not None and not self._task.done()

    def events(self) -> list[WatchEvent]:
        return [i for i in self.items if isinstance(i, WatchEvent)]

    def keys(self) -> list[str]:
        return [e.key for e in self.events()]

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Collector]:
        self._task = asyncio.create_task(self._run(), name=f"collect {self._prefix}")
        try:
            yield self
        finally:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


def _keys_seen(n: int, prefix: str) -> object:
    wanted = f"{prefix}/k{n - 1}"
    return lambda items: any(isinstance(i, WatchEvent) and i.key == wanted for i in items)


# ---------------------------------------------------------------------------- basic operations


async def test_put_get_delete(etcd_endpoint: str, key_prefix: str) -> None:
    async with Store(etcd_endpoint, op_timeout_s=2) as store:
        assert await store.get(f"{key_prefix}/a") is None
        rev = await store.put(f"{key_prefix}/a", b"1")
        kv = await store.get(f"{key_prefix}/a")
        assert kv is not None
        assert (kv.key, kv.value, kv.mod_revision, kv.create_revision, kv.lease) == (
            f"{key_prefix}/a",
            b"1",
            rev,
            rev,
            0,
        )
        rev2 = await store.put(f"{key_prefix}/a", b"2")
        kv = await store.get(f"{key_prefix}/a")
        assert kv is not None and kv.value == b"2" and kv.mod_revision == rev2 > rev and kv.create_revision == rev
        assert await store.delete(f"{key_prefix}/a") is True
        assert await store.delete(f"{key_prefix}/a") is False
        assert await store.get(f"{key_prefix}/a") is None
        assert await store.revision() >= rev2


async def test_get_prefix_and_delete_prefix(etcd_endpoint: str, key_prefix: str) -> None:
    async with Store(etcd_endpoint, op_timeout_s=2) as store:
        for name in ("c", "a", "b"):
            await store.put(f"{key_prefix}/x/{name}", name.encode())
        last = await store.put(f"{key_prefix}/y", b"outside")
        snap = await store.get_prefix(f"{key_prefix}/x/")
        assert [kv.key for kv in snap.kvs] == [f"{key_prefix}/x/{n}" for n in "abc"]  # sorted by key
        assert [kv.value for kv in snap.kvs] == [b"a", b"b", b"c"]
        assert snap.revision >= last
        assert await store.delete_prefix(f"{key_prefix}/x/") == 3
        assert (await store.get_prefix(f"{key_prefix}/x/")).kvs == []
        assert await store.get(f"{key_prefix}/y") is not None


async def test_create_is_create_if_absent(etcd_endpoint: str, key_prefix: str) -> None:
    async with Store(etcd_endpoint, op_timeout_s=2) as store:
        key = f"{key_prefix}/spec"
        assert await store.create(key, b"first") is True
        assert await store.create(key, b"second") is False
        kv = await store.get(key)
        assert kv is not None and kv.value == b"first"


async def test_txn_value_and_absent_compares(etcd_endpoint: str, key_prefix: str) -> None:
    leader = f"{key_prefix}/leader"
    async with Store(etcd_endpoint, op_timeout_s=2) as store:
        await store.put(leader, b"me")
        ok = await store.txn([ValueIs(leader, b"me"), Absent(f"{key_prefix}/new")], [Put(f"{key_prefix}/new", b"1")])
        assert ok.succeeded and ok.revision > 0
        lost = await store.txn(
            [ValueIs(leader, b"someone-else")],
            [Put(f"{key_prefix}/new", b"2")],
            failure=[Delete(f"{key_prefix}/new")],
        )
        assert not lost.succeeded
        assert await store.get(f"{key_prefix}/new") is None  # the failure branch ran


async def test_txn_fenced_by_prefix_mod_revision(etcd_endpoint: str, key_prefix: str) -> None:
    run = f"{key_prefix}/run/"
    async with Store(etcd_endpoint, op_timeout_s=2) as store:
        await store.put(f"{run}a", b"1")
        await store.put(f"{run}b", b"1")
        read = await store.get_prefix(run)
        fence = ModRevisionAtMost(run, read.revision, is_prefix=True)
        first = await store.txn([fence], [Put(f"{run}status", b"from-read")])
        assert first.succeeded
        # The fence now sees our own write (after `read.revision`): a stale read must re-read.
        assert not (await store.txn([fence], [Put(f"{run}status", b"stale")])).succeeded
        reread = await store.get_prefix(run)
        assert (await store.txn([ModRevisionAtMost(run, reread.revision, is_prefix=True)], [])).succeeded
        await store.put(f"{run}b", b"2")  # a concurrent writer
        fenced = await store.txn([ModRevisionAtMost(run, reread.revision, is_prefix=True)], [Put(f"{run}x", b"")])
        assert not fenced.succeeded
        assert await store.get(f"{run}x") is None
        # A single-key fence only looks at that key.
        single = ModRevisionAtMost(f"{run}a", reread.revision)
        assert (await store.txn([single], [])).succeeded


@pytest.mark.parametrize("endpoint", ["", "nohost", "host:", "host:port", "host:70000", ":2379", " , "])
def test_malformed_endpoint_is_config_error(endpoint: str) -> None:
    with pytest.raises(ConfigError):
        Store(endpoint)


# ---------------------------------------------------------------------------- leases


async def test_kept_lease_outlives_its_ttl(etcd_endpoint: str, key_prefix: str) -> None:
    key = f"{key_prefix}/node"
    async with Store(etcd_endpoint, op_timeout_s=2) as store, store.lease(1) as lease:
        await store.put(key, b"alive", lease=lease.id)
        await asyncio.sleep(1.6)  # > TTL + etcd's 0.5 s expiry sweep, kept alive every TTL/3
        kv = await store.get(key)
        assert kv is not None and kv.lease == lease.id
        assert not lease.lost.is_set()


async def test_unrevoked_lease_expires_after_ttl(etcd_endpoint: str, key_prefix: str) -> None:
    key = f"{key_prefix}/node"
    async with Store(etcd_endpoint, op_timeout_s=2) as store:
        start = await store.revision()
        collector = Collector(store, key, start + 1)
        async with collector.running(), store.lease(1) as lease:
            await store.put(key, b"alive", lease=lease.id)
            await lease.aclose(revoke=False)
            loop = asyncio.get_running_loop()
            closed_at = loop.time()
            # The expiry arrives as a delete event: wait on the watch, not on a sleep.
            await collector.wait_for("expiry", lambda items: any(getattr(i, "is_delete", False) for i in items))
            elapsed = loop.time() - closed_at
        assert await store.get(key) is None
        assert elapsed < 2.5, f"lease with TTL 1 s took {elapsed:.2f}s to expire"


async def test_revoked_lease_deletes_keys_at_once(etcd_endpoint: str, key_prefix: str) -> None:
    key = f"{key_prefix}/node"
    async with Store(etcd_endpoint, op_timeout_s=2) as store:
        async with store.lease(1) as lease:
            await store.put(key, b"alive", lease=lease.id)
        assert lease.lost.is_set()
        assert await store.get(key) is None


# ---------------------------------------------------------------------------- watches


async def test_watch_delivers_puts_and_deletes_in_order(etcd_endpoint: str, key_prefix: str) -> None:
    async with Store(etcd_endpoint, op_timeout_s=2) as store:
        rev = await store.put(f"{key_prefix}/before", b"not seen")
        async with Collector(store, key_prefix, rev + 1).running() as c:
            await store.put(f"{key_prefix}/k0", b"v0")
            await store.delete(f"{key_prefix}/k0")
            await store.put(f"{key_prefix}/k1", b"v1")
            await store.put("/elsewhere-not-watched", b"x")
            await c.wait_for("k1", _keys_seen(2, key_prefix))
        events = c.events()
        assert [(e.key, e.value, e.is_delete) for e in events] == [
            (f"{key_prefix}/k0", b"v0", False),
            (f"{key_prefix}/k0", b"", True),
            (f"{key_prefix}/k1", b"v1", False),
        ]
        revs = [e.mod_revision for e in events]
        assert revs == sorted(revs)


async def test_watch_resumes_after_etcd_kill9_without_loss_or_duplicates(key_prefix: str) -> None:
    with EmbeddedEtcd(for_tests=True) as etcd:
        async with Store(etcd.endpoint, op_timeout_s=2, watch_retry_s=0.05, watch_retry_max_s=0.2) as store:
            start = await store.revision()
            async with Collector(store, key_prefix, start + 1).running() as c:
                for i in range(5):
                    await store.put(f"{key_prefix}/k{i}", str(i).encode())
                await c.wait_for("k0..k4", _keys_seen(5, key_prefix))
                etcd.kill9()
                await asyncio.sleep(0.3)  # several failed re-watches while etcd is down
                assert c.task_alive(), "the watch consumer crashed while etcd was down"
                n_before_restart = len(c.items)
                assert n_before_restart == 5, "nothing is yielded while etcd is down"
                loop = asyncio.get_running_loop()
                await asyncio.to_thread(etcd.restart)
                restarted_at = loop.time()
                for i in range(5, 10):
                    await store.put(f"{key_prefix}/k{i}", str(i).encode())  # first call after restart works
                await c.wait_for("k5..k9", _keys_seen(10, key_prefix))
        assert c.keys() == [f"{key_prefix}/k{i}" for i in range(10)]
        assert [e.value for e in c.events()] == [str(i).encode() for i in range(10)]
        after_restart = c.items[n_before_restart:]
        assert isinstance(after_restart[0], Resync), c.items  # told to re-read before new events
        assert after_restart.count(Resync("reconnected")) == 1, c.items
        lag_ms = (c.times[-1] - restarted_at) * 1000
        print(f"k9 arrived {lag_ms:.1f} ms after etcd was healthy again")


async def test_watch_catches_up_on_writes_made_while_it_was_disconnected(key_prefix: str) -> None:
    with EmbeddedEtcd(for_tests=True) as etcd:
        async with (
            # A 0.6 s retry delay leaves room to restart etcd and write before the watch returns.
            Store(etcd.endpoint, op_timeout_s=2, watch_retry_s=0.6, watch_retry_max_s=0.6) as store,
            Store(etcd.endpoint, op_timeout_s=2) as writer,
        ):
            start = await store.revision()
            async with Collector(store, key_prefix, start + 1).running() as c:
                for i in range(5):
                    await writer.put(f"{key_prefix}/k{i}", str(i).encode())
                await c.wait_for("k0..k4", _keys_seen(5, key_prefix))
                etcd.kill9()
                await asyncio.to_thread(etcd.restart)
                for i in range(5, 10):  # another client writes after the restart, before the re-watch
                    await writer.put(f"{key_prefix}/k{i}", str(i).encode())
                written_at = asyncio.get_running_loop().time()
                await c.wait_for("k5..k9", _keys_seen(10, key_prefix))
        assert c.keys() == [f"{key_prefix}/k{i}" for i in range(10)]
        resync_at = c.items.index(Resync("reconnected"))
        assert resync_at == 5, c.items  # exactly one, right before the catch-up
        assert c.times[resync_at] > written_at, "the watch reconnected before the writes: arrange failed"


async def test_watch_from_compacted_revision_resyncs_then_continues(key_prefix: str) -> None:
    with EmbeddedEtcd(for_tests=True) as etcd:
        etcdctl = find_etcdctl_binary(etcd.binary)
        if etcdctl is None:
            pytest.skip("no etcdctl next to the etcd binary or on PATH: cannot force a compaction")
        async with Store(etcd.endpoint, op_timeout_s=2) as store:
            first = await store.put(f"{key_prefix}/old0", b"0")
            for i in range(1, 5):
                compact_to = await store.put(f"{key_prefix}/old{i}", str(i).encode())
            env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
            await asyncio.to_thread(
                subprocess.run,
                [etcdctl, "--endpoints", etcd.url, "compact", str(compact_to)],
                check=True,
                capture_output=True,
                env={**env, "ETCDCTL_API": "3"},
                timeout=5,
            )
            async with Collector(store, key_prefix, first).running() as c:
                await c.wait_for("the compaction resync", lambda items: len(items) >= 1)
                for i in range(3):
                    await store.put(f"{key_prefix}/k{i}", str(i).encode())
                await c.wait_for("k0..k2", _keys_seen(3, key_prefix))
        assert c.items[0] == Resync("compacted")
        events = c.events()
        assert all(e.mod_revision >= compact_to for e in events)
        # Resumes at the compaction point: what is still in history is delivered once, then the rest.
        assert [e.key for e in events] == [f"{key_prefix}/old4"] + [f"{key_prefix}/k{i}" for i in range(3)]


async def test_a_lease_given_up_during_an_outage_is_revoked_before_the_next_grant(key_prefix: str) -> None:
    """An etcd restart re-arms every lease with its full TTL: a lease its keeper judged lost would
    keep its keys (a leader key, a node record) one more TTL and block a new campaign. The store
    revokes it before granting the next one, so the old key is gone at once."""
    with EmbeddedEtcd(for_tests=True) as etcd:
        async with Store(etcd.endpoint, op_timeout_s=1) as store:
            key = f"{key_prefix}/leader"
            keeper = store.lease(3)
            await keeper.__aenter__()
            await store.put(key, b"old term", lease=keeper.id)
            etcd.kill9()
            await asyncio.wait_for(keeper.lost.wait(), timeout=10)  # no keep-alive for a whole TTL
            await keeper.aclose()  # the owner gives the lease up (etcd is still down: not revoked yet)
            etcd.restart()
            async with store.lease(3) as fresh:
                assert fresh.id != keeper.id
                assert await store.get(key) is None, "the given-up lease's key outlived it"
