"""taskd_client.pytorch.EtcdStore against a real etcd: the torch.distributed Store contract, and the
abort that releases a blocked rendezvous read (docs/adr/0017)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

torch_distributed = pytest.importorskip("torch.distributed", reason="PyTorch is not installed")

from taskd_client.pytorch import store as store_module  # noqa: E402
from taskd_client.pytorch.store import EtcdStore, GenerationAborted  # noqa: E402

pytestmark = pytest.mark.etcd


@pytest.fixture
def store(etcd_endpoint: str, key_prefix: str):  # type: ignore[no-untyped-def]
    made = EtcdStore(etcd_endpoint, f"{key_prefix}/rendezvous/j/r/", timeout=timedelta(seconds=5))
    yield made
    made.delete_prefix_now()
    made.close()


def test_set_get_add_compare_set_delete(store: EtcdStore) -> None:
    store.set("a", "1")
    assert store.get("a") == b"1"
    assert store.add("n", 2) == 2 and store.add("n", 3) == 5
    assert store.compare_set("gen", "", "0") == b"0"  # created: absent and expected empty
    assert store.compare_set("gen", "7", "8") == b"0"  # not changed: returns the value held
    assert store.compare_set("gen", "0", "1") == b"1"
    assert store.check(["a", "gen"]) and not store.check(["a", "missing"])
    assert store.num_keys() == 3
    assert store.delete_key("a") and not store.check(["a"])


def test_a_prefix_store_over_it_works_as_torch_uses_it(store: EtcdStore) -> None:
    prefixed = torch_distributed.PrefixStore("g0/pg", store)  # torch joins with "/"
    prefixed.set("k", b"v")
    assert prefixed.get("k") == b"v"
    assert store.get("g0/pg/k") == b"v"


def test_get_blocks_until_the_key_is_set(store: EtcdStore) -> None:
    threading.Timer(0.2, store.set, ("late", "x")).start()
    started = time.monotonic()
    assert store.get("late") == b"x"
    assert time.monotonic() - started >= 0.15


def test_a_blocked_get_gives_up_when_its_generation_is_aborted(store: EtcdStore) -> None:
    store.interrupted = lambda: "generation 3 aborted" if store.check(["g3/abort"]) else None
    threading.Timer(0.2, store.set, ("g3/abort", "peer died")).start()
    with pytest.raises(GenerationAborted, match="generation 3 aborted"):
        store.get("never-set")


def test_get_times_out_with_the_key_named(store: EtcdStore) -> None:
    store.set_timeout(timedelta(seconds=0.3))
    with pytest.raises(TimeoutError, match="never"):
        store.get("never")


def _watch_live(store: EtcdStore) -> None:
    deadline = time.monotonic() + 30
    while not store.watched("any")[0]:  # the watch has read the prefix and follows it
        assert time.monotonic() < deadline, "the store's watch never came up"
        time.sleep(0.01)


def _count_reads(store: EtcdStore) -> list[int]:
    """Counts the store's etcd reads from now on (``[n]``)."""
    reads = [0]
    read_now = store._get_now

    def counted(key: str) -> bytes | None:
        reads[0] += 1
        return read_now(key)

    store._get_now = counted  # type: ignore[method-assign]
    return reads


def test_a_blocked_get_follows_the_watch_and_does_not_poll_etcd(store: EtcdStore, etcd_endpoint: str) -> None:
    """Three ranks waiting for a replacement used to make ~1,000 etcd reads a second between them."""
    _watch_live(store)
    reads = _count_reads(store)
    writer = EtcdStore(etcd_endpoint, store._prefix)
    try:
        threading.Timer(0.5, writer.set, ("late", "x")).start()
        assert store.get("late") == b"x"  # set by another client: seen through the watch
    finally:
        writer.close()
    assert reads[0] <= 2, f"{reads[0]} etcd reads while waiting 0.5 s: polling every 1-5 ms makes dozens (69 measured)"


def test_seen_is_the_watched_copy(store: EtcdStore, etcd_endpoint: str) -> None:
    _watch_live(store)
    other = EtcdStore(etcd_endpoint, store._prefix)
    try:
        other.set("g1/abort", "peer died")
        deadline = time.monotonic() + 10
        while store.seen("g1/abort") is None:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert store.seen("g1/abort") == b"peer died" and store.seen_or_none("g1/abort") is True
        other.delete_key("g1/abort")
        while store.seen("g1/abort") is not None:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert store.seen_or_none("g1/abort") is False
    finally:
        other.close()


def test_a_key_the_watch_holds_is_read_with_no_etcd_request(store: EtcdStore, etcd_endpoint: str) -> None:
    """gloo's connect reads every peer's address: each read was an etcd request on a replacement's
    critical path; set before the read, they are in the watched copy."""
    _watch_live(store)
    other = EtcdStore(etcd_endpoint, store._prefix)
    try:
        other.multi_set(["pg/0", "pg/2"], ["addr0", "addr2"])
        deadline = time.monotonic() + 10
        while store.watched("pg/2") != (True, b"addr2"):
            assert time.monotonic() < deadline
            time.sleep(0.005)
        reads = _count_reads(store)
        store.wait(["pg/0", "pg/2"])
        assert store.get("pg/0") == b"addr0" and store.multi_get(["pg/0", "pg/2"]) == [b"addr0", b"addr2"]
        assert reads[0] == 0
        store.set("own", "x")
        assert store.get("own") == b"x"  # written a moment ago, maybe not in the copy yet: etcd, once
        assert reads[0] <= 1
    finally:
        other.close()


def test_put_if_writes_only_when_every_condition_holds(store: EtcdStore) -> None:
    store.set("gen", "3")
    assert not store.put_if("g3/member/1", "a", absent=("g3/abort",), equal={"gen": "2"})  # gen moved on
    store.set("g3/abort", "peer died")
    assert not store.put_if("g3/member/1", "a", absent=("g3/abort",), equal={"gen": "3"})  # aborted
    assert store.peek("g3/member/1") is None
    store.delete_key("g3/abort")
    assert store.put_if("g3/member/1", "a", absent=("g3/member/1", "g3/abort"), equal={"gen": "3"})
    assert not store.put_if("g3/member/1", "b", absent=("g3/member/1",))  # the seat is taken
    assert store.peek("g3/member/1") == b"a"


def test_a_store_made_ahead_is_taken_once_by_the_same_prefix(etcd_endpoint: str, key_prefix: str) -> None:
    """A warm-start standby makes its rank's store while it waits; the rank's trainer takes it,
    connected and in step, only if it is for the same etcd and prefix; it is never shared."""
    prefix = f"{key_prefix}/rendezvous/j/r/"
    store_module.make_ahead(etcd_endpoint, prefix)
    made = store_module._ahead
    assert made is not None and made.made_ahead
    _watch_live(made)
    other = store_module.open_store(etcd_endpoint, f"{key_prefix}/rendezvous/j/another-run/")
    try:
        assert other is not made and not other.made_ahead  # another run's: a new store
        assert made._loop.loop.is_closed()  # the one made ahead is closed, not leaked
        assert store_module._ahead is None
    finally:
        other.close()

    store_module.make_ahead(etcd_endpoint, prefix)
    made = store_module._ahead
    taken = store_module.open_store(etcd_endpoint, prefix, timeout=timedelta(seconds=7))
    fresh = store_module.open_store(etcd_endpoint, prefix)
    try:
        assert taken is made and taken.timeout == timedelta(seconds=7)
        assert fresh is not made and not fresh.made_ahead  # taken once
        taken.set("k", "v")
        assert fresh.get("k") == b"v"
    finally:
        taken.close()
        fresh.close()
