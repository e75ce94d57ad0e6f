"""taskd_client.pytorch.Membership against a real etcd, as the ranks use it when every one of them
takes part in recoverd's protocol through its agent (docs/adr/0036): each survivor publishes a
world change itself, and they must agree on one new generation; on an upgrade each survivor waits
for the returning ranks, whose ready marks nobody consumes but themselves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import TypeVar

import pytest

pytest.importorskip("torch.distributed", reason="PyTorch is not installed")

from recoverd.records import encode, pb
from taskd_client.pytorch.membership import Membership
from taskd_client.pytorch.store import EtcdStore

pytestmark = pytest.mark.etcd

WORLD = 4
T = TypeVar("T")


@pytest.fixture
def stores(etcd_endpoint: str, key_prefix: str) -> Iterator[list[EtcdStore]]:
    """One rendezvous store per rank (each rank has its own connection), and one more for
    recoverd's recovery record (written outside the rendezvous prefix, as the coordinator does)."""
    made = [
        EtcdStore(etcd_endpoint, f"{key_prefix}/rendezvous/j/r/", timeout=timedelta(seconds=5)) for _ in range(WORLD)
    ]
    made.append(EtcdStore(etcd_endpoint, f"{key_prefix}/jobs/j/runs/r/", timeout=timedelta(seconds=5)))
    yield made
    made[0].delete_prefix_now()
    made[-1].delete_prefix_now()
    for store in made:
        store.close()


def _isolate(stores: list[EtcdStore], key: str, ranks: list[int]) -> None:
    record = pb.Recovery(isolated=[pb.RankPlace(rank=r, node="node-b") for r in ranks])
    assert key == f"{stores[-1]._prefix}recovery"
    stores[-1].set("recovery", encode(record))


def _at_once(calls: list[Callable[[], T]]) -> list[T]:
    """Run ``calls`` in threads released together (the ranks act on one signal at one moment)."""
    start = threading.Barrier(len(calls))

    def run(call: Callable[[], T]) -> T:
        start.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def test_survivors_that_each_publish_a_downgrade_agree_on_one_new_generation(
    stores: list[EtcdStore], key_prefix: str
) -> None:
    key = f"{key_prefix}/jobs/j/runs/r/recovery"
    ranks = [Membership(stores[r], key, r, WORLD) for r in range(WORLD)]
    assert [m.seat(0) for m in ranks] == [(r, WORLD) for r in range(WORLD)]  # generation 0: everyone

    _isolate(stores, key, [2, 3])
    published = _at_once([lambda m=m: m.publish("downgrade of ranks [2, 3]") for m in ranks[:2]])

    assert {tuple(live) for _, live, _ in published} == {(0, 1)}
    # One of them aborted generation 0 (it was pinned to the old world); whichever came second
    # either found it aborted or pinned generation 1 to the same world: never a third generation.
    assert any(aborted for _, _, aborted in published)
    assert stores[0].get("gen") == b"1" and ranks[0].is_aborted(0) and not ranks[0].is_aborted(1)
    assert [m.seat(1) for m in ranks[:2]] == [(0, 2), (1, 2)]


def test_every_survivor_waits_for_the_returning_ranks_and_their_marks_are_theirs_to_clear(
    stores: list[EtcdStore], key_prefix: str
) -> None:
    key = f"{key_prefix}/jobs/j/runs/r/recovery"
    _isolate(stores, key, [3])
    ranks = [Membership(stores[r], key, r, WORLD) for r in range(WORLD)]
    stores[0].compare_set("gen", "", "0")  # the group's current generation (ResilientGroup sets it)
    assert [m.seat(0) for m in ranks[:3]] == [(0, 3), (1, 3), (2, 3)]
    # Rank 3 comes back (an upgrade's START_RANKS) before the survivors are told: no seat in
    # generation 0, so it says it is ready (and waits for the next generation).
    assert ranks[3].seat(0) is None

    _isolate(stores, key, [])  # the upgrade's record: nobody isolated
    waited = _at_once([lambda m=m: m.wait_ready([3], 5.0, consume=False) for m in ranks[:3]])
    assert waited == [[3], [3], [3]]  # every survivor saw the mark: none took it from the others
    assert stores[0].peek("ready/3") == b"0"

    _at_once([lambda m=m: m.publish("upgrade of ranks [3]") for m in ranks[:3]])
    assert [m.seat(1) for m in ranks] == [(r, WORLD) for r in range(WORLD)]
    assert stores[0].peek("ready/3") is None  # seated: rank 3 cleared its own mark for the next upgrade
    # A survivor told late (its agent relayed the upgrade after the others had published, or again
    # after a restart) finds no mark, yet rank 3 is seated: it is ready, no wait.
    assert ranks[0].wait_ready([3], 5.0, consume=False) == [3]
