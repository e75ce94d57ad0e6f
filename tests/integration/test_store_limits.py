"""The store at etcd's edges, against the real server: undecodable keys, etcd's size limits, paged
reads over the 4 MiB response limit, refusals that are not "etcd unavailable", the server version.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from recoverd import store as store_module
from recoverd.errors import ConfigError, EtcdRefused, EtcdUnavailable, RequestTooLarge
from recoverd.etcd_server import EmbeddedEtcd
from recoverd.etcd_versions import known_problem
from recoverd.store import MAX_TXN_OPS, Delete, Put, Resync, Store, WatchEvent, check_lease_ttl, printable

pytestmark = pytest.mark.etcd


async def test_an_undecodable_key_is_read_watched_and_deleted(etcd_endpoint: str, key_prefix: str) -> None:
    bad = f"{key_prefix}/jobs/j/runs/r/faults/x" + b"\xff\xfe".decode("utf-8", "surrogateescape")
    async with Store(etcd_endpoint) as store:
        start = await store.revision()
        await store.put(bad, b"{}")
        snap = await store.get_prefix(f"{key_prefix}/")
        assert [kv.key for kv in snap.kvs] == [bad]
        assert printable(bad).endswith("x\\udcff\\udcfe")  # safe to log and to store in a record
        watch = store.watch_prefix(f"{key_prefix}/", start + 1)
        event = await anext(watch)
        assert event.key == bad  # type: ignore[union-attr]
        await watch.aclose()
        assert (await store.get(bad)) is not None
        assert await store.txn([], [Delete(bad)])
        assert (await store.get_prefix(f"{key_prefix}/")).kvs == []


async def test_a_transaction_over_128_operations_is_refused_before_it_is_sent(
    etcd_endpoint: str, key_prefix: str
) -> None:
    async with Store(etcd_endpoint) as store:
        ops = [Put(f"{key_prefix}/k{i:04d}", b"v") for i in range(MAX_TXN_OPS + 1)]
        with pytest.raises(RequestTooLarge) as caught:
            await store.txn([], ops)
        assert not isinstance(caught.value, EtcdUnavailable) and caught.value.reason == "etcd_limit"
        assert (await store.txn([], ops[:MAX_TXN_OPS])).succeeded
        with pytest.raises(RequestTooLarge):
            await store.put(f"{key_prefix}/big", b"x" * (2 * 1024 * 1024))


async def test_etcds_own_refusals_are_typed_and_not_unavailable(
    etcd_endpoint: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the client-side check out of the way, etcd itself refuses: a distinct error, no retry loop."""
    monkeypatch.setattr(store_module, "MAX_TXN_OPS", 10_000)
    async with Store(etcd_endpoint) as store:
        ops = [Put(f"{key_prefix}/k{i:04d}", b"v") for i in range(MAX_TXN_OPS + 1)]
        with pytest.raises(RequestTooLarge, match="too many operations"):
            await store.txn([], ops)
        with pytest.raises(EtcdRefused) as dup:
            await store.txn([], [Put(f"{key_prefix}/same", b"1"), Put(f"{key_prefix}/same", b"2")])
        assert not isinstance(dup.value, EtcdUnavailable)
        # The connection is still good.
        assert await store.put(f"{key_prefix}/after", b"ok") > 0


async def test_a_read_over_4_mib_is_paged_at_one_revision(etcd_endpoint: str, key_prefix: str) -> None:
    """Five legal 1 MB values (5 MB under one prefix) read whole, consistently, in pages."""
    async with Store(etcd_endpoint) as store:
        for i in range(5):
            await store.put(f"{key_prefix}/acks/n{i}", bytes([65 + i]) * 1_000_000)
        await store.put(f"{key_prefix}/zz", b"small")
        began = time.perf_counter()
        snap = await store.get_prefix(f"{key_prefix}/")
        took = time.perf_counter() - began
        assert [kv.key.rsplit("/", 1)[1] for kv in snap.kvs] == ["n0", "n1", "n2", "n3", "n4", "zz"]
        assert all(len(kv.value) == 1_000_000 for kv in snap.kvs[:5])
        assert store.page_keys < store_module.PAGE_KEYS  # it had to shrink the page
        print(f"paged read of 5 MB: {took * 1000:.0f} ms, {store.page_keys} keys per page")
        # Pages are read at the first page's revision: a write during the read is not half-seen.
        assert snap.revision == max(kv.mod_revision for kv in snap.kvs)


async def test_a_watch_whose_catch_up_exceeds_4_mib_resyncs_instead_of_failing(
    etcd_endpoint: str, key_prefix: str
) -> None:
    """Five 1 MB writes watched from before them come back in one answer over gRPC's limit: the
    watch skips to now and yields a Resync (a level-triggered reader re-reads), then goes on."""
    async with Store(etcd_endpoint) as store:
        start = await store.revision() + 1
        for i in range(5):
            await store.put(f"{key_prefix}/big/n{i}", bytes([65 + i]) * 1_000_000)
        watch = store.watch_prefix(f"{key_prefix}/big/", start)
        first = await asyncio.wait_for(anext(watch), 20)
        assert isinstance(first, Resync) and first.reason == "oversized"
        await store.put(f"{key_prefix}/big/after", b"small")
        event = await asyncio.wait_for(anext(watch), 20)
        assert isinstance(event, WatchEvent) and event.key.endswith("/after")
        await watch.aclose()


async def test_the_server_version_is_read_and_a_known_bad_one_warned(
    etcd_endpoint: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="recoverd.store")
    async with Store(etcd_endpoint) as store:
        await store.put(f"{key_prefix}/x", b"1")
        task = store._version_task
        if task is not None:
            await task
        assert store.server_version.count(".") == 2
        warned = [r for r in caplog.records if "known" in r.getMessage() or "release that" in r.getMessage()]
        if known_problem(store.server_version):
            assert len(warned) == 1 and store.server_version in warned[0].getMessage()
        else:
            assert warned == []


def test_a_lease_ttl_that_etcd_cannot_grant_is_refused_with_the_reason() -> None:
    for bad in (0, 0.5, 1.5, -2):
        with pytest.raises(ConfigError, match="whole seconds"):
            check_lease_ttl(bad)
    assert check_lease_ttl(2.0) == 2


async def test_a_lease_etcd_raises_is_said_and_judged_by_the_granted_ttl(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An etcd with the default election timeout (1 s) raises a 1 s lease to its minimum, 2 s: the
    keeper says so once and times loss by the granted TTL, never silently by the asked one."""
    caplog.set_level(logging.WARNING, logger="recoverd.store")
    with EmbeddedEtcd(data_dir=str(tmp_path / "etcd")) as etcd:  # etcd's own default timings
        async with Store(etcd.endpoint) as store, store.lease(1) as lease:
            assert lease.ttl == 2
            async with store.lease(1) as again:
                assert again.ttl == 2
    raised = [r for r in caplog.records if "granted a 2 s lease for the 1 s asked" in r.getMessage()]
    assert len(raised) == 1
