"""The strategy selector is a pure function: a table of cases, each with the reason it must give."""

from __future__ import annotations

import pytest

from recoverd.strategy.selector import Outcome, PolicyView, Request, choose

RIP = PolicyView(strategies=("recover-in-place", "exit"), max_rank_restarts=2, max_job_restarts=2, restart_window_s=60)
EXIT_ONLY = PolicyView(strategies=("exit",), max_job_restarts=2, restart_window_s=60)
NOW = 1000.0


def rip_outcome(rank: int, at: float, ok: bool = True) -> Outcome:
    return Outcome("recover-in-place", (rank,), at, ok)


def exit_outcome(at: float) -> Outcome:
    return Outcome("exit", (0,), at, True)


CASES = [
    # name, request, expected strategy ("" = give up), a phrase the reasons must contain
    ("policy allows recover-in-place", Request((2,), policy=RIP, now=NOW), "recover-in-place", "recover-in-place: yes"),
    (
        "default policy is exit",
        Request((2,), policy=EXIT_ONLY, now=NOW),
        "exit",
        "recover-in-place: no, not allowed by the job's policy",
    ),
    (
        "exit is appended when the policy omits it",
        Request((2,), policy=PolicyView(("recover-in-place",)), now=NOW),
        "recover-in-place",
        "recover-in-place: yes",
    ),
    (
        "a failed recover-in-place falls back to exit",
        Request((2,), policy=RIP, failed=("recover-in-place",), now=NOW),
        "exit",
        "recover-in-place: no, already failed in this recovery",
    ),
    (
        "rank budget spent escalates to exit",
        Request((2,), policy=RIP, history=(rip_outcome(2, NOW - 10), rip_outcome(2, NOW - 5)), now=NOW),
        "exit",
        "rank 2 was restarted in place 2 time(s)",
    ),
    (
        "another rank's restarts do not count",
        Request((2,), policy=RIP, history=(rip_outcome(1, NOW - 10), rip_outcome(1, NOW - 5)), now=NOW),
        "recover-in-place",
        "recover-in-place: yes",
    ),
    (
        "restarts outside the window do not count",
        Request((2,), policy=RIP, history=(rip_outcome(2, NOW - 100), rip_outcome(2, NOW - 90)), now=NOW),
        "recover-in-place",
        "recover-in-place: yes",
    ),
    (
        "job budget spent gives up",
        Request((2,), policy=EXIT_ONLY, history=(exit_outcome(NOW - 20), exit_outcome(NOW - 10)), now=NOW),
        "",
        "give up",
    ),
    (
        "exit that failed in this recovery gives up",
        Request((2,), policy=EXIT_ONLY, failed=("exit",), now=NOW),
        "",
        "exit already failed",
    ),
    (
        "retry needs every participant to report it",
        Request((2,), fault_types=("0",), policy=PolicyView(("retry", "exit")), supported=frozenset({"exit"}), now=NOW),
        "exit",
        "retry: no, not reported by every participant",
    ),
    (
        "retry is never for a non-retryable fault",
        Request(
            (2,), fault_types=("1",), policy=PolicyView(("retry", "exit")), supported=frozenset({"retry"}), now=NOW
        ),
        "exit",
        "retry: no, a fault is not retryable",
    ),
    (
        "recover and dump need every participant",
        Request((2,), policy=PolicyView(("recover", "dump", "exit")), supported=frozenset({"exit"}), now=NOW),
        "exit",
        "recover: no, not reported by every participant",
    ),
    (
        "strategies not built yet are refused with that reason",
        Request((2,), policy=PolicyView(("elastic-training", "exit")), now=NOW),
        "exit",
        "elastic-training: no, not implemented in this version",
    ),
]


@pytest.mark.parametrize(("name", "request_", "strategy", "phrase"), CASES, ids=[c[0] for c in CASES])
def test_choose(name: str, request_: Request, strategy: str, phrase: str) -> None:
    decision = choose(request_)
    assert decision.strategy == strategy, decision.reasons
    assert decision.give_up is (strategy == "")
    assert any(phrase in reason for reason in decision.reasons), decision.reasons
    if strategy:
        assert decision.candidates[0] == strategy
        assert decision.expected_cost_s > 0


def test_every_strategy_gets_a_reason() -> None:
    decision = choose(Request((1,), policy=RIP, now=NOW))
    for strategy in ("retry", "recover-in-place", "recover", "elastic-training", "dump"):
        assert any(reason.startswith(f"{strategy}:") for reason in decision.reasons)


def test_choose_is_pure() -> None:
    request = Request((2,), policy=RIP, history=(rip_outcome(2, NOW - 1),), now=NOW)
    assert choose(request) == choose(request)
