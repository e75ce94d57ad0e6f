"""Strategy choice: a pure function from the facts of a recovery to a decision with its reasons.

``choose(request) -> Decision`` has no I/O and no clock (``now`` is an input). Rules, from
MindCluster's ``chooseStrategy`` (reference/mindcluster-contract.md section 6):

* candidates in priority order: retry, recover-in-place, recover, elastic-training, dump, exit;
* ``retry``, ``recover`` and ``dump`` need every participant to have reported them;
  ``recover-in-place`` and ``elastic-training`` need the job's policy to allow them;
  a strategy must be in the policy's allowed list, and ``exit`` is always available;
* a strategy that already failed in this recovery is skipped (the fallback ladder);
* restart budgets: a rank restarted in place ``max_rank_restarts`` times within
  ``restart_window_s`` rules out recover-in-place (escalates to exit); ``max_job_restarts`` exits
  within the window give up: the job fails rather than crash-looping forever.

Every candidate gets a reason, chosen or not, so ``recoverctl decisions`` can show why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["ALL_STRATEGIES", "EXPECTED_COST_S", "Decision", "Outcome", "PolicyView", "Request", "choose"]

ALL_STRATEGIES = ("retry", "recover-in-place", "recover", "elastic-training", "dump", "exit")
_NEEDS_EVERY_PARTICIPANT = frozenset({"retry", "recover", "dump"})
#: Strategies whose executors exist in this version; the others are refused with that reason.
_IMPLEMENTED = frozenset({"recover-in-place", "exit"})
_RETRYABLE_FAULT_TYPES = frozenset({"0", "2"})

#: Rough cost of each strategy in seconds, shown with decisions (measured figures come from bench/).
EXPECTED_COST_S = {
    "retry": 1.0,
    "recover-in-place": 3.0,
    "recover": 10.0,
    "elastic-training": 10.0,
    "dump": 60.0,
    "exit": 30.0,
}


@dataclass(frozen=True, slots=True)
class PolicyView:
    """The parts of a job's policy the selector reads."""

    strategies: tuple[str, ...] = ("exit",)
    max_rank_restarts: int = 3
    max_job_restarts: int = 3
    restart_window_s: float = 600.0


@dataclass(frozen=True, slots=True)
class Outcome:
    """One finished (or failed) recovery from the job's history."""

    strategy: str
    ranks: tuple[int, ...]
    closed_at: float
    ok: bool


@dataclass(frozen=True, slots=True)
class Request:
    """Everything the choice depends on."""

    fault_ranks: tuple[int, ...]
    fault_types: tuple[str, ...] = ()
    policy: PolicyView = field(default_factory=PolicyView)
    supported: frozenset[str] | None = None
    failed: tuple[str, ...] = ()
    history: tuple[Outcome, ...] = ()
    now: float = 0.0


@dataclass(frozen=True, slots=True)
class Decision:
    strategy: str
    reasons: tuple[str, ...]
    give_up: bool = False
    candidates: tuple[str, ...] = ()
    expected_cost_s: float = 0.0


def _recent(history: Sequence[Outcome], now: float, window_s: float) -> list[Outcome]:
    return [o for o in history if now - o.closed_at <= window_s]


def choose(request: Request) -> Decision:
    """Pick the cheapest strategy that is allowed, supported, not yet failed and within budget."""
    policy = request.policy
    allowed = (*[s for s in policy.strategies if s != "exit"], "exit")
    recent = _recent(request.history, request.now, policy.restart_window_s)
    reasons: list[str] = []
    candidates: list[str] = []
    for strategy in ALL_STRATEGIES:
        verdict = _rule_out(strategy, request, allowed, recent)
        if verdict:
            reasons.append(f"{strategy}: no, {verdict}")
            continue
        candidates.append(strategy)
    if not candidates:
        exits = sum(1 for o in recent if o.strategy == "exit")
        reasons.append(
            f"give up: {exits} exit(s) within {policy.restart_window_s:g}s reached the job budget of"
            f" {policy.max_job_restarts}"
            if "exit" not in request.failed
            else "give up: exit already failed in this recovery"
        )
        return Decision("", tuple(reasons), give_up=True)
    chosen = candidates[0]
    reasons.append(f"{chosen}: yes, the cheapest strategy left (about {EXPECTED_COST_S[chosen]:g}s)")
    return Decision(chosen, tuple(reasons), candidates=tuple(candidates), expected_cost_s=EXPECTED_COST_S[chosen])


def _rule_out(strategy: str, request: Request, allowed: Sequence[str], recent: Sequence[Outcome]) -> str:
    """Why ``strategy`` cannot be used now, or "" when it can."""
    policy = request.policy
    if strategy not in allowed:
        return "not allowed by the job's policy"
    if strategy in request.failed:
        return "already failed in this recovery"
    if strategy in _NEEDS_EVERY_PARTICIPANT and (request.supported is None or strategy not in request.supported):
        return "not reported by every participant"
    if strategy == "retry" and not set(request.fault_types) <= _RETRYABLE_FAULT_TYPES:
        return "a fault is not retryable (only UCE '0' and HCCL '2' are)"
    if strategy not in _IMPLEMENTED:
        return "not implemented in this version of recoverd"
    if strategy == "recover-in-place":
        for rank in request.fault_ranks:
            restarts = sum(1 for o in recent if o.strategy == strategy and rank in o.ranks)
            if restarts >= policy.max_rank_restarts:
                return (
                    f"rank {rank} was restarted in place {restarts} time(s) within {policy.restart_window_s:g}s"
                    f" (budget {policy.max_rank_restarts})"
                )
    if strategy == "exit":
        exits = sum(1 for o in recent if o.strategy == "exit")
        if exits >= policy.max_job_restarts:
            return f"{exits} exit(s) within {policy.restart_window_s:g}s (budget {policy.max_job_restarts})"
    return ""
