"""The pure judgement of progress: learned timeouts, warm-up, victims and culprits, stragglers."""

from __future__ import annotations

import pytest

from recoverd.agent.detectors.progress import HangRules, ProgressTracker
from recoverd.records import pb


def _steady(tracker: ProgressTracker, rank: int, pid: int, step_s: float, steps: int, t0: float = 0.0) -> float:
    """``steps`` progress reports ``step_s`` apart; returns the time of the last one."""
    now = t0
    for step in range(steps):
        now = t0 + step * step_s
        tracker.progress(rank, pid, step, now)
    return now


def test_a_rank_that_never_reported_is_never_judged() -> None:
    tracker = ProgressTracker()
    tracker.started(0, 100, now=0.0)
    assert tracker.timeout(0) is None
    assert tracker.hangs(now=10_000.0) == []


def test_learned_timeout_is_the_multiple_of_the_step_time_with_a_floor() -> None:
    tracker = ProgressTracker(HangRules(multiplier=3, floor_s=5, startup_s=60, warmup_steps=3))
    tracker.started(0, 100, now=0.0)
    tracker.started(1, 101, now=0.0)
    last_slow = _steady(tracker, 0, 100, step_s=4.0, steps=10)
    last_fast = _steady(tracker, 1, 101, step_s=0.1, steps=10)
    assert tracker.timeout(0) == (pytest.approx(12.0), "3 x the observed step time 4.00s")
    assert tracker.timeout(1)[0] == 5.0  # 3 x 0.1 s is below the floor
    assert tracker.hangs(now=last_fast + 4.9) == []
    assert [h.rank for h in tracker.hangs(now=last_fast + 5.1)] == [1]
    assert tracker.hangs(now=last_slow + 11.9) == []
    assert [h.rank for h in tracker.hangs(now=last_slow + 12.1)] == [0]
    assert tracker.hangs(now=last_slow + 100) == []  # each incarnation once


def test_the_start_up_allowance_covers_the_first_steps_then_the_learned_timeout_applies() -> None:
    tracker = ProgressTracker(HangRules(multiplier=3, floor_s=5, startup_s=60, warmup_steps=3))
    tracker.started(0, 100, now=0.0)
    tracker.progress(0, 100, 0, now=1.0)
    assert tracker.timeout(0)[0] == 60.0
    tracker.progress(0, 100, 1, now=50.0)  # a slow first step (compiling)
    assert tracker.hangs(now=100.0) == []  # 50 s of silence: still warming up
    tracker.progress(0, 100, 2, now=101.0)
    assert tracker.timeout(0)[0] == 60.0  # three reports: still warming up
    tracker.progress(0, 100, 3, now=102.0)
    # Warmed up; the slow warm-up intervals taught nothing: 3 x 1 s is below the floor.
    assert tracker.timeout(0) == (5.0, "the floor; 3 x step time 1.00s is less")
    assert [h.rank for h in tracker.hangs(now=107.1)] == [0]


def test_a_slow_but_progressing_rank_is_never_a_hang() -> None:
    tracker = ProgressTracker(HangRules(startup_s=1, warmup_steps=1))
    tracker.started(0, 100, now=0.0)
    now = 0.0
    for step in range(200):
        now += 2.0 + (step % 5)  # irregular, slow steps
        tracker.progress(0, 100, step, now)
        assert tracker.hangs(now + 0.01) == []


def test_the_same_step_again_is_not_progress_a_changed_step_is() -> None:
    tracker = ProgressTracker(HangRules(startup_s=1, warmup_steps=0, floor_s=5))
    tracker.started(0, 100, now=0.0)
    assert tracker.progress(0, 100, 7, now=0.0)
    for t in range(1, 10):
        assert not tracker.progress(0, 100, 7, now=float(t))  # a heartbeat thread, step not moving
    assert [h.rank for h in tracker.hangs(now=10.0)] == [0]
    tracker.started(1, 101, now=0.0)
    assert tracker.progress(1, 101, 7, now=0.0)
    assert tracker.progress(1, 101, 3, now=1.0)  # rolled back after a recovery: it moves


def test_reports_of_another_incarnation_are_ignored() -> None:
    tracker = ProgressTracker()
    tracker.started(0, 100, now=0.0)
    assert not tracker.progress(0, 999, 1, now=1.0)
    assert not tracker.progress(5, 100, 1, now=1.0)  # no such rank here
    assert tracker.timeout(0) is None


def test_a_rank_waiting_in_a_collective_is_given_longer_a_stopped_one_is_not() -> None:
    rules = HangRules(multiplier=3, floor_s=5, startup_s=1, warmup_steps=0, victim_factor=2)
    tracker = ProgressTracker(rules)
    for rank in (0, 1, 2):
        tracker.started(rank, 100 + rank, now=0.0)
        tracker.progress(rank, 100 + rank, 0, now=0.0)
    tracker.progress(0, 100, 0, now=0.5, waiting=True)  # the victim: waits for a peer
    tracker.progress(2, 102, 0, now=0.5, waiting=True)  # waits too, but its process is stopped
    stopped = {102}
    assert tracker.next_deadline(now=1.0) == 5.0  # rank 1's (and the stopped rank 2's) timeout
    hung = tracker.hangs(now=5.5, is_stopped=lambda pid: pid in stopped)
    assert tracker.next_deadline(now=5.5) == 10.0  # the victim's longer one; no busy loop
    assert [(h.rank, h.waiting, h.stopped) for h in hung] == [(1, False, False), (2, True, True)]
    assert tracker.hangs(now=9.9) == []
    late = tracker.hangs(now=10.1)
    assert [h.rank for h in late] == [0] and "waiting in a collective" in late[0].basis


def test_nobody_is_judged_during_a_recovery_and_everyone_warms_up_after_it() -> None:
    tracker = ProgressTracker(HangRules(multiplier=3, floor_s=5, startup_s=30, warmup_steps=2))
    tracker.started(0, 100, now=0.0)
    _steady(tracker, 0, 100, step_s=1.0, steps=10)
    tracker.pause()
    assert tracker.hangs(now=1_000.0) == []
    tracker.resume(now=1_000.0)
    assert tracker.hangs(now=1_029.0) == []  # the start-up allowance again
    assert [h.rank for h in tracker.hangs(now=1_031.0)] == [0]


def test_a_fixed_timeout_from_the_policy_replaces_the_learned_one() -> None:
    tracker = ProgressTracker(HangRules(timeout_s=2.0, startup_s=1, warmup_steps=0))
    tracker.started(0, 100, now=0.0)
    _steady(tracker, 0, 100, step_s=10.0, steps=5)
    assert tracker.timeout(0) == (2.0, "fixed by the job's policy")


def test_disabled_rules_find_no_hang() -> None:
    tracker = ProgressTracker(HangRules(enabled=False, startup_s=1, warmup_steps=0))
    tracker.started(0, 100, now=0.0)
    tracker.progress(0, 100, 0, now=0.0)
    assert tracker.hangs(now=1e6) == []


def test_rules_from_the_policy_fill_in_defaults_for_what_is_unset() -> None:
    rules = HangRules.from_pb(pb.HangPolicy(floor_s=2.0, log_pattern="step (?P<step>\\d+)"))
    assert (rules.floor_s, rules.multiplier, rules.startup_s, rules.enabled) == (2.0, 3.0, 300.0, True)
    assert rules.log_pattern
    assert not HangRules.from_pb(pb.HangPolicy(enabled=False)).enabled


def test_a_persistently_slower_rank_is_a_straggler_once_and_cleared_once() -> None:
    tracker = ProgressTracker(HangRules(straggler_ratio=1.5, straggler_window_s=10, warmup_steps=1))
    for rank in range(4):
        tracker.started(rank, 100 + rank, now=0.0)
    changes = []
    for tick in range(1, 61):
        now = float(tick)
        for rank in range(4):
            busy = 0.9 if (rank == 2 and tick <= 30) else 0.4  # rank 2 does its work 2.25x slower
            tracker.progress(rank, 100 + rank, tick, now, busy_s=busy)
        changes += [(now, c.rank, c.slow) for c in tracker.stragglers(now)]
    assert [(r, slow) for _, r, slow in changes] == [(2, True), (2, False)]
    flagged_at = changes[0][0]
    assert flagged_at >= 11.0  # only after a whole window of being slow


def test_ranks_in_lockstep_are_not_stragglers() -> None:
    tracker = ProgressTracker(HangRules(straggler_ratio=1.5, straggler_window_s=5))
    for rank in range(8):
        tracker.started(rank, 100 + rank, now=0.0)
    for tick in range(1, 30):
        for rank in range(8):
            tracker.progress(rank, 100 + rank, tick, float(tick) + rank * 0.001)
        assert tracker.stragglers(float(tick) + 0.5) == []


def test_a_victim_waits_at_least_the_start_up_allowance_so_a_slow_peer_restarts_nobody() -> None:
    tracker = ProgressTracker(HangRules(multiplier=3, floor_s=5, startup_s=60, warmup_steps=0))
    tracker.started(0, 100, now=0.0)
    tracker.progress(0, 100, 0, now=0.0)
    tracker.progress(0, 100, 0, now=0.5, waiting=True)  # re-forming its group: waits for a replacement
    assert tracker.hangs(now=59.0) == []
    assert [h.rank for h in tracker.hangs(now=60.5)] == [0]  # everyone waiting for good is still found


def test_a_periodic_long_step_seen_within_the_hour_is_not_a_hang() -> None:
    tracker = ProgressTracker(HangRules(multiplier=3, floor_s=5, startup_s=1, warmup_steps=0))
    tracker.started(0, 100, now=0.0)
    now, step, hangs = 0.0, 0, []
    for _minute in range(10):
        for _ in range(500):  # 50 s of 0.1 s steps, 2,500 reports between two evaluations
            now += 0.1
            step += 1
            tracker.progress(0, 100, step, now)
            hangs += tracker.hangs(now)
        now += 8.0  # an 8 s evaluation every minute
        hangs += tracker.hangs(now - 0.01)
        step += 1
        tracker.progress(0, 100, step, now)
    assert len(hangs) == 1  # only the first evaluation, before one was ever seen (the floor is 5 s)


def test_waiting_survives_the_end_of_a_recovery() -> None:
    tracker = ProgressTracker(HangRules(multiplier=3, floor_s=5, startup_s=30, warmup_steps=0))
    tracker.started(0, 100, now=0.0)
    tracker.progress(0, 100, 0, now=0.0)
    tracker.progress(0, 100, 0, now=1.0, waiting=True)
    tracker.pause()
    tracker.resume(now=10.0)
    assert tracker.hangs(now=10.0 + 59.0) == []  # still a victim: 2 x the 30 s allowance


def test_a_rank_whose_loop_is_over_is_not_judged_until_it_reports_again() -> None:
    tracker = ProgressTracker(HangRules(multiplier=3, floor_s=5, startup_s=1, warmup_steps=0))
    tracker.started(0, 100, now=0.0)
    _steady(tracker, 0, 100, step_s=0.1, steps=20)
    tracker.finished(0, 100)  # saving, tearing down its process group
    assert tracker.hangs(now=1_000.0) == [] and tracker.next_deadline(now=1_000.0) is None
    tracker.progress(0, 100, 21, now=1_000.0)  # it trains again
    assert [h.rank for h in tracker.hangs(now=1_006.0)] == [0]


def test_output_is_progress_with_a_larger_floor_unless_the_process_is_stopped() -> None:
    """ADR 0042: a plain script's output is its cadence; a silence of output_floor_s is a hang, a
    stopped process is judged with the ordinary floor."""
    rules = HangRules(multiplier=3, floor_s=5, startup_s=60, warmup_steps=3, output_floor_s=60)
    tracker = ProgressTracker(rules)
    tracker.started(0, 100, now=0.0)
    tracker.started(1, 101, now=0.0)
    now = 0.0
    for tick in range(10):
        now = tick * 0.5
        assert tracker.progress(0, 100, None, now, by_output=True)
        assert tracker.progress(1, 101, None, now, by_output=True)
    assert tracker.timeout(0) == (60.0, "the floor for a rank known only by its output; 3 x step time 0.50s is less")
    assert tracker.timeout(0, stopped=True)[0] == 5.0
    assert tracker.next_deadline(now) == pytest.approx(now + 5.0)  # a stopped one is judged then
    stopped = {101}
    assert [h.rank for h in tracker.hangs(now + 5.1, lambda pid: pid in stopped)] == [1]
    assert tracker.hangs(now + 59.9, lambda pid: pid in stopped) == []  # rank 0 runs: not yet
    assert [h.rank for h in tracker.hangs(now + 60.1, lambda pid: pid in stopped)] == [0]


def test_once_a_client_reports_its_ranks_output_is_no_longer_progress() -> None:
    tracker = ProgressTracker(HangRules(multiplier=3, floor_s=5, startup_s=60, warmup_steps=3))
    tracker.started(0, 100, now=0.0)
    assert tracker.progress(0, 100, None, 0.5, by_output=True)  # before the client: output counts
    last = _steady(tracker, 0, 100, step_s=0.5, steps=10, t0=1.0)
    assert tracker.timeout(0)[0] == 5.0  # a client's rank: the ordinary floor
    # A logging thread goes on printing while the training loop is stuck: still a hang.
    for tick in range(1, 20):
        assert not tracker.progress(0, 100, None, last + tick * 0.5, by_output=True)
    assert [h.rank for h in tracker.hangs(last + 5.1)] == [0]
