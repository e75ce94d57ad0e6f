"""ResilientGroup's agreement tools on real gloo groups formed through a real etcd (three ranks, one
thread each): every member reads every member's joining note once formed; ``share``, the state
transfer of a recovery, brings the bytes to the receivers only, a rank that is not one returns at
once, and a receiver waiting for a source that never sends is released by an abort."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

from taskd_client.pytorch.group import GroupFailed, ResilientGroup  # noqa: E402
from taskd_client.pytorch.store import EtcdStore  # noqa: E402

pytestmark = pytest.mark.etcd

WORLD = 3


@pytest.fixture
def groups(etcd_endpoint: str, key_prefix: str) -> Iterator[list[ResilientGroup]]:
    """Three ranks of one formed generation, each with its own store (as separate processes have)."""
    prefix = f"{key_prefix}/rendezvous/j/r/"
    stores = [EtcdStore(etcd_endpoint, prefix, timeout=timedelta(seconds=10)) for _ in range(WORLD)]
    made = [ResilientGroup(s, r, WORLD, timeout=timedelta(seconds=10), backend="gloo") for r, s in enumerate(stores)]
    for rank, group in enumerate(made):
        if rank != 2:  # rank 2 writes no note
            group.joining_note = lambda rank=rank: f"rank {rank} holds step {10 + rank}"  # type: ignore[misc]
    with ThreadPoolExecutor(WORLD) as pool:
        assert list(pool.map(lambda g: g.form(), made)) == [0] * WORLD
    yield made
    for group in made:
        group.close()
    stores[0].delete_prefix_now()
    for store in stores:
        store.close()


def _on_every_rank(groups: list[ResilientGroup], work: Callable[[ResilientGroup], Any]) -> list[Any]:
    with ThreadPoolExecutor(len(groups)) as pool:
        return list(pool.map(work, groups))


def test_every_member_reads_every_joining_note_once_formed(groups: list[ResilientGroup]) -> None:
    expected = ["rank 0 holds step 10", "rank 1 holds step 11", ""]
    assert _on_every_rank(groups, lambda g: g.notes()) == [expected] * WORLD


def test_the_bytes_reach_the_receivers_only(groups: list[ResilientGroup]) -> None:
    payload = torch.frombuffer(bytearray(b"state of rank 1 " * 40_000), dtype=torch.uint8)

    def share(group: ResilientGroup) -> bytes | None:
        got = group.share(payload if group.rank == 1 else None, source=1, receivers=(0, 2))
        return None if got is None else got.numpy().tobytes()

    assert _on_every_rank(groups, share) == [payload.numpy().tobytes(), None, payload.numpy().tobytes()]


def test_a_rank_that_is_neither_source_nor_receiver_returns_at_once(groups: list[ResilientGroup]) -> None:
    """Nobody else takes part here: a rank that waited for anything would block until the timeout."""
    assert groups[1].share(None, source=0, receivers=(2,)) is None


def test_a_receiver_whose_source_never_sends_is_released_by_an_abort(groups: list[ResilientGroup]) -> None:
    released = threading.Event()
    failures: list[BaseException] = []

    def receive() -> None:
        try:
            groups[2].share(None, source=0, receivers=(2,))
        except GroupFailed as err:
            failures.append(err)
        released.set()

    waiting = threading.Thread(target=receive)
    waiting.start()
    groups[0].abort("the source died")
    assert released.wait(30), "the receiver was not released by the abort"
    waiting.join()
    assert len(failures) == 1 and "aborted" in str(failures[0])
