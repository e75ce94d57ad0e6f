"""Crash-loop backoff: which lives count, and how long the next start waits (pure)."""

from __future__ import annotations

from recoverd.agent.crashloop import EARLY_S, CrashLoop


def test_one_early_failure_restarts_at_once_then_the_wait_doubles_to_its_cap() -> None:
    loop = CrashLoop(base_s=1.0, max_s=5.0)
    waits = []
    for _ in range(6):
        loop.ended(3, 0.4, failed=True)
        waits.append(loop.delay_s(3))
    assert waits == [0.0, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert loop.delay_s(2) == 0.0  # per rank


def test_a_long_life_a_success_or_a_stop_by_the_agent_ends_the_streak() -> None:
    loop = CrashLoop()
    for ended in ((EARLY_S + 1, True), (60.0, False), (0.1, False)):
        loop.ended(0, 0.2, failed=True)
        loop.ended(0, 0.2, failed=True)
        assert loop.delay_s(0) == 1.0
        loop.ended(0, ended[0], failed=ended[1])
        assert loop.streak(0) == 0 and loop.delay_s(0) == 0.0


def test_a_zero_cap_turns_the_backoff_off() -> None:
    loop = CrashLoop(max_s=0.0)
    for _ in range(4):
        loop.ended(1, 0.1, failed=True)
    assert loop.streak(1) == 4 and loop.delay_s(1) == 0.0


def test_the_wait_is_not_part_of_the_life_it_delayed() -> None:
    """A life that waited 20 s and failed 1 s into its own run is early; its process lived 21 s."""
    loop = CrashLoop(base_s=20.0, max_s=20.0)
    loop.ended(0, 0.5, failed=True)
    loop.ended(0, 0.5, failed=True)
    assert loop.starting(0) == 20.0
    loop.ended(0, 21.0, failed=True)
    assert loop.streak(0) == 3
    assert loop.starting(0) == 20.0
    loop.ended(0, 20.0 + EARLY_S + 1, failed=True)  # ran 11 s after its wait: not early
    assert loop.streak(0) == 0 and loop.starting(0) == 0.0
