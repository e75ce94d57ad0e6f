"""The ranks' agreement after a formation (taskd_client.pytorch.agreement): the step, the source,
and who receives the source's state. Pure: no torch, no group."""

from __future__ import annotations

import pytest

from taskd_client.pytorch.agreement import (
    Agreement,
    Holding,
    Kind,
    NoTwin,
    agree,
    agree_sharded,
    must_read_checkpoints,
)

LIVE, SUSPECT, DISK, NONE = Kind.LIVE, Kind.SUSPECT, Kind.FROM_DISK, Kind.NONE


def test_a_replacement_beside_survivors_is_the_only_receiver() -> None:
    world = [Holding(LIVE, 7), Holding(NONE, 0), Holding(LIVE, 7), Holding(LIVE, 7)]
    assert agree(world) == Agreement(step=7, source=0, receivers=(1,))


def test_the_replacement_of_rank_0_makes_the_next_survivor_the_source() -> None:
    world = [Holding(NONE, 0, unread_checkpoint=True), Holding(LIVE, 7), Holding(LIVE, 7)]
    assert agree(world) == Agreement(step=7, source=1, receivers=(0,))


def test_a_survivor_ahead_is_put_back_and_receives() -> None:
    """Its all-reduce completed when a peer's did not: one step ahead, so it takes step 7's state."""
    world = [Holding(LIVE, 8), Holding(LIVE, 7), Holding(NONE, 0)]
    assert agree(world) == Agreement(step=7, source=1, receivers=(0, 2))


def test_a_retry_moves_no_state() -> None:
    """Every rank rolled the same step back: nobody receives anything."""
    assert agree([Holding(LIVE, 3)] * 4) == Agreement(step=3, source=0, receivers=())


def test_a_rank_that_raised_a_retryable_fault_is_repaired_from_a_healthy_peer() -> None:
    """Its memory error may have corrupted its state: rank 0 raised, so rank 1 is the source."""
    world = [Holding(SUSPECT, 3), Holding(LIVE, 3), Holding(LIVE, 3), Holding(SUSPECT, 3)]
    assert agree(world) == Agreement(step=3, source=1, receivers=(0, 3))


def test_with_every_rank_suspect_the_lowest_numbered_one_is_the_source() -> None:
    assert agree([Holding(SUSPECT, 3)] * 3) == Agreement(step=3, source=0, receivers=(1, 2))


def test_a_fresh_world_takes_rank_0s_initial_state_everywhere() -> None:
    """As DDP's first broadcast: fresh ranks may have been built with different seeds."""
    assert agree([Holding(NONE, 0)] * 3) == Agreement(step=0, source=0, receivers=(1, 2))


def test_checkpoints_are_not_assumed_equal() -> None:
    """Ranks that loaded a checkpoint at the same step still receive the source's state: a
    per-rank checkpoint need not be the same as rank 0's."""
    world = [Holding(DISK, 5), Holding(DISK, 5), Holding(DISK, 9), Holding(NONE, 0)]
    assert agree(world) == Agreement(step=5, source=0, receivers=(1, 2, 3))


def test_live_state_wins_over_a_newer_checkpoint() -> None:
    world = [Holding(DISK, 9), Holding(LIVE, 4), Holding(LIVE, 4)]
    assert agree(world) == Agreement(step=4, source=1, receivers=(0,))


def test_checkpoints_are_read_only_where_no_rank_holds_live_state() -> None:
    assert must_read_checkpoints([Holding(NONE, 0, True), Holding(NONE, 0)])
    assert not must_read_checkpoints([Holding(NONE, 0, True), Holding(LIVE, 3)])
    assert not must_read_checkpoints([Holding(NONE, 0, True), Holding(SUSPECT, 3)])
    assert not must_read_checkpoints([Holding(NONE, 0), Holding(DISK, 3)])


def test_an_empty_world_is_refused() -> None:
    with pytest.raises(ValueError):
        agree([])


@pytest.mark.parametrize("holding", [Holding(LIVE, 7), Holding(NONE, 0, True), Holding(SUSPECT, 123456789)])
def test_a_holding_survives_its_joining_note(holding: Holding) -> None:
    assert Holding.from_note(holding.to_note()) == holding


@pytest.mark.parametrize(
    "note", ["", "1234@5", "holding1:3:7", "holding1:9:7:0", "holding1:3:-1:0", "holding1:3:7:2", "holding2:3:7:0"]
)
def test_a_note_that_is_not_a_holding_is_refused(note: str) -> None:
    assert Holding.from_note(note) is None


# ---------------------------------------------------------------- sharded models (issue 26)

#: HSDP 2 x 2 (replicate x shard): ranks 0 and 2 hold shard 0, ranks 1 and 3 shard 1.
HSDP = (0, 1, 0, 1)
LIVE5 = Holding(Kind.LIVE, 5)


def test_a_killed_ranks_shard_comes_from_its_twin_and_nobody_else_receives() -> None:
    for victim in range(4):
        everyone = [LIVE5] * 4
        everyone[victim] = Holding(Kind.NONE, 0)
        agreed = agree_sharded(everyone, HSDP)
        twin = (victim + 2) % 4
        assert agreed.step == 5
        assert agreed.sources[HSDP[victim]] == min(r for r in range(4) if HSDP[r] == HSDP[victim] and r != victim)
        assert agreed.receivers[HSDP[victim]] == (victim,) and agreed.receivers[1 - HSDP[victim]] == ()
        assert agreed.source_for(victim) == twin and agreed.source_for(twin) is None


def test_a_rank_ahead_is_put_back_by_its_twin() -> None:
    everyone = [LIVE5, Holding(Kind.LIVE, 6), Holding(Kind.NONE, 0), LIVE5]
    agreed = agree_sharded(everyone, HSDP)
    assert (agreed.step, agreed.sources, agreed.receivers) == (5, (0, 3), ((2,), (1,)))


def test_a_suspect_rank_is_repaired_from_its_twin() -> None:
    everyone = [LIVE5, LIVE5, Holding(Kind.SUSPECT, 5), LIVE5]
    assert agree_sharded(everyone, HSDP).receivers == ((2,), ())


def test_a_fresh_world_sends_each_shard_from_its_first_replica() -> None:
    agreed = agree_sharded([Holding(Kind.NONE, 0)] * 4, HSDP)
    assert (agreed.step, agreed.sources, agreed.receivers) == (0, (0, 1), ((2,), (3,)))


def test_a_shard_with_no_live_holder_cannot_be_rebuilt_from_a_peer() -> None:
    # Pure FSDP over 4 ranks: every rank holds its own shard; rank 2 lost means shard 2 is gone.
    everyone = [LIVE5, LIVE5, Holding(Kind.NONE, 0), LIVE5]
    with pytest.raises(NoTwin, match=r"shard 2 \(ranks \[2\]\) has no live state"):
        agree_sharded(everyone, (0, 1, 2, 3))
    # The dead rank's twin one step ahead of the other shard: no step that both shards hold.
    with pytest.raises(NoTwin, match=r"steps held: \[5, 6\]"):
        agree_sharded([Holding(Kind.LIVE, 6), LIVE5, Holding(Kind.NONE, 0), LIVE5], HSDP)


def test_bad_shard_maps_are_refused() -> None:
    with pytest.raises(ValueError, match="one holding and one shard per rank"):
        agree_sharded([LIVE5] * 4, (0, 1))
    with pytest.raises(ValueError, match=r"numbered 0\.\.n-1"):
        agree_sharded([LIVE5] * 2, (0, 2))


def test_a_shard_a_step_ahead_goes_back_on_its_own_with_its_previous_state() -> None:
    # Seen in make bench-fsdp: rank 1 died between its replica's reduce-scatter and its all-reduce
    # across replicas; shard 0's ranks (0, 2) completed step 60, rank 3 (rank 1's twin) did not.
    ahead = Holding(Kind.LIVE, 61, previous=True)
    everyone = [ahead, Holding(Kind.NONE, 0), ahead, Holding(Kind.LIVE, 60, previous=True)]
    agreed = agree_sharded(everyone, HSDP)
    assert (agreed.step, agreed.sources, agreed.receivers, agreed.back) == (60, (0, 3), ((), (1,)), (0, 2))
    # Without the previous state the same world has no common step (the failure the copy removes).
    with pytest.raises(NoTwin):
        agree_sharded([Holding(Kind.LIVE, 61), Holding(Kind.NONE, 0), Holding(Kind.LIVE, 61), LIVE5], HSDP)


def test_a_rank_at_the_step_is_preferred_as_source_to_one_that_goes_back() -> None:
    everyone = [Holding(Kind.LIVE, 6, previous=True), LIVE5, LIVE5, Holding(Kind.NONE, 0)]
    agreed = agree_sharded(everyone, HSDP)
    assert (agreed.step, agreed.sources, agreed.receivers, agreed.back) == (5, (2, 1), ((), (3,)), (0,))


def test_a_holding_with_its_previous_state_round_trips_through_its_note() -> None:
    for holding in (Holding(Kind.LIVE, 7, previous=True), Holding(Kind.LIVE, 7), Holding(Kind.NONE, 0, True)):
        assert Holding.from_note(holding.to_note()) == holding
    assert Holding(Kind.LIVE, 7).to_note() == "holding1:3:7:0"  # unchanged for a rank that keeps none
    assert Holding(Kind.LIVE, 7, previous=True).steps_held() == (6, 7)


def test_survivors_at_the_same_step_resume_there_though_they_could_go_back() -> None:
    # The usual case (seen in make bench-fsdp before the highest step was taken: every survivor
    # went back a step for nothing): a rank killed mid-step, every survivor has completed step 52.
    at52 = Holding(Kind.LIVE, 52, previous=True)
    agreed = agree_sharded([at52, Holding(Kind.NONE, 0), at52, at52], HSDP)
    assert (agreed.step, agreed.sources, agreed.receivers, agreed.back) == (52, (0, 3), ((), (1,)), ())
