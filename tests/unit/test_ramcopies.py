"""Where a sharded model with no twin goes back to after a loss (taskd_client.pytorch.ramcopies):
the latest copy step every rank can restore, and which holder sends each lost shard. Pure."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from taskd_client.pytorch.agreement import NoTwin
from taskd_client.pytorch.ramcopies import CopyPlan, RamCopies, holder_of, plan_restore


def next_rank(rank: int) -> int:
    return holder_of(rank, 4, 4)


def test_a_copy_is_held_on_the_next_node_or_by_the_next_rank() -> None:
    assert [holder_of(r, 4, 4) for r in range(4)] == [1, 2, 3, 0]  # one node: the next rank
    assert [holder_of(r, 8, 4) for r in range(8)] == [4, 5, 6, 7, 0, 1, 2, 3]  # the next node
    assert holder_of(0, 1, 1) == 0
    copies = RamCopies(10, rank=2, world_size=8, per_node=4)
    assert (copies.holder, copies.source) == (6, 6)


def test_every_rank_goes_back_to_the_latest_step_all_can_restore() -> None:
    own = [[10, 20], [-1, -1], [10, 20], [10, 20]]  # rank 1 is the replacement
    held = [[10, 20], [-1, -1], [10, 20], [10, 20]]
    assert plan_restore(own, held, [1], next_rank) == CopyPlan(20, {1: 2})


def test_a_copy_still_in_flight_is_not_used() -> None:
    # Rank 2 (holding rank 1's copies) has not received step 20's yet: step 10 is restored.
    own = [[10, 20], [-1, -1], [10, 20], [10, 20]]
    held = [[10, 20], [-1, -1], [-1, 10], [10, 20]]
    assert plan_restore(own, held, [1], next_rank).step == 10


def test_a_shard_whose_copy_was_lost_with_it_cannot_be_restored() -> None:
    own = held = [[10, 20]] * 4
    with pytest.raises(NoTwin, match=r"rank 1's shard and its RAM copy \(held by rank 2\) are both lost"):
        plan_restore(own, held, [1, 2], next_rank)
    with pytest.raises(NoTwin, match="no copy step is held for every shard"):
        plan_restore([[10, 20], [-1, -1], [-1, -1], [10, 20]], held, [1], next_rank)


def test_the_copy_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive number of steps"):
        RamCopies(0, rank=0, world_size=4, per_node=4)
