"""The restarted agent's adoption plan (pure): one process per rank, never a reused PID."""

from __future__ import annotations

from recoverd.agent.launcher import FoundRank
from recoverd.agent.readopt import plan_adoption
from recoverd.records import pb, ts_from_s


def status(rank: int, pid: int, started: float, state: int = pb.RANK_RUNNING, generation: int = 0) -> pb.RankStatus:
    return pb.RankStatus(rank=rank, pid=pid, started_at=ts_from_s(started), state=state, generation=generation)


def test_live_ranks_are_adopted_with_their_pids() -> None:
    recorded = [status(0, 100, 1000.0), status(1, 101, 1000.2, generation=3)]
    found = [FoundRank(0, 100, 1000.0, 0), FoundRank(1, 101, 1000.3, 3)]
    plan = plan_adoption(recorded, found, {0, 1})
    assert sorted(plan.adopt) == [0, 1] and plan.adopt[1][1].pid == 101
    assert not plan.died and not plan.start and not plan.stop


def test_a_reused_pid_is_not_adopted_and_the_rank_died() -> None:
    plan = plan_adoption([status(0, 100, 1000.0)], [FoundRank(0, 100, 1900.0, 0)], {0})
    assert not plan.adopt and list(plan.died) == [0]
    assert [f.pid for f in plan.stop] == [100]  # a process of this run and node that is no rank's incarnation


def test_a_vanished_rank_died() -> None:
    plan = plan_adoption([status(2, 102, 1000.0)], [], {2})
    assert list(plan.died) == [2] and not plan.stop


def test_duplicates_and_old_warm_spares_are_stopped() -> None:
    recorded = [status(0, 100, 1000.0)]
    found = [FoundRank(0, 100, 1000.0, 0), FoundRank(0, 150, 1001.0, 0), FoundRank(-1, 160, 1002.0, -1)]
    plan = plan_adoption(recorded, found, {0})
    assert list(plan.adopt) == [0]
    assert sorted(f.pid for f in plan.stop) == [150, 160]


def test_a_warm_spare_made_a_rank_is_adopted() -> None:
    plan = plan_adoption([status(1, 120, 1000.0)], [FoundRank(-1, 120, 1000.0, -1)], {1})
    assert list(plan.adopt) == [1]


def test_finished_and_failed_ranks_are_kept_stopped_ones_started() -> None:
    recorded = [
        status(0, 100, 1000.0, pb.RANK_SUCCEEDED),
        status(1, 101, 1000.0, pb.RANK_FAILED),
        status(2, 102, 1000.0, pb.RANK_STOPPED),
    ]
    plan = plan_adoption(recorded, [], {0, 1, 2, 3})
    assert sorted(plan.keep) == [0, 1]
    assert plan.start == (2, 3)


def test_ranks_this_node_no_longer_holds_are_stopped_not_adopted() -> None:
    # Rank 1 moved to a spare while the agent was away: the node holds only rank 0 now.
    recorded = [status(0, 100, 1000.0), status(1, 101, 1000.0)]
    found = [FoundRank(0, 100, 1000.0, 0), FoundRank(1, 101, 1000.0, 0)]
    plan = plan_adoption(recorded, found, {0})
    assert list(plan.adopt) == [0] and [f.pid for f in plan.stop] == [101]
