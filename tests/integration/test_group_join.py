"""ResilientGroup's join of the current generation against a real etcd: one request when the
store's watch is in step (a replacement's join was four in a row), and the one-by-one checks when
the generation was aborted or a predecessor holds the seat."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

pytest.importorskip("torch.distributed", reason="PyTorch is not installed")

from taskd_client.pytorch.group import ResilientGroup
from taskd_client.pytorch.store import EtcdStore

pytestmark = pytest.mark.etcd


@pytest.fixture
def store(etcd_endpoint: str, key_prefix: str) -> Iterator[EtcdStore]:
    made = EtcdStore(etcd_endpoint, f"{key_prefix}/rendezvous/j/r/", timeout=timedelta(seconds=5))
    yield made
    made.delete_prefix_now()
    made.close()


def _in_step(store: EtcdStore, key: str, value: bytes | None) -> None:
    deadline = time.monotonic() + 30
    while store.watched(key) != (True, value):
        assert time.monotonic() < deadline, f"the watch never saw {key}={value!r}"
        time.sleep(0.005)


def _requests(store: EtcdStore) -> list[int]:
    """Counts every etcd request the store makes from now on."""
    made = [0]
    run = store._run

    def counted(make):  # type: ignore[no-untyped-def]
        made[0] += 1
        return run(make)

    store._run = counted  # type: ignore[method-assign]
    return made


def test_a_join_is_one_request_when_the_watch_is_in_step(store: EtcdStore) -> None:
    store.set("gen", "4")
    _in_step(store, "gen", b"4")
    group = ResilientGroup(store, 1, 2, incarnation="me")
    made = _requests(store)
    assert group._join_current() == 4
    assert made[0] == 1
    assert store.peek("g4/member/1") == b"me"


def test_an_aborted_generation_is_left_for_the_next(store: EtcdStore) -> None:
    store.set("gen", "4")
    store.set("g4/abort", "rank 0 died")
    _in_step(store, "g4/abort", b"rank 0 died")
    group = ResilientGroup(store, 1, 2, incarnation="me")
    assert group._join_current() is None
    assert store.peek("gen") == b"5" and store.peek("g4/member/1") is None
    _in_step(store, "gen", b"5")
    assert group._join_current() == 5


def test_a_predecessors_seat_aborts_its_generation(store: EtcdStore) -> None:
    """The watched copy may not know the predecessor's seat yet: the transaction does."""
    store.set("gen", "2")
    _in_step(store, "gen", b"2")
    store.set("g2/member/1", "my predecessor")
    group = ResilientGroup(store, 1, 2, incarnation="me")
    assert group._join_current() is None
    assert store.peek("g2/abort") == b"rank 1 restarted" and store.peek("gen") == b"3"
