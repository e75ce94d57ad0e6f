"""Strategy choice: a pure function from the facts of a recovery to a decision with its reasons.

``choose(request) -> Decision`` has no I/O and no clock (``now`` is an input). Rules, from
MindCluster's ``chooseStrategy`` (reference/mindcluster-contract.md section 6):

* candidates in priority order: retry, recover-in-place, recover, elastic-training, dump, exit;
  the first one left is chosen;
* ``retry`` is the first choice only when every fault is retryable (UCE "0", HCCL "2"): one normal
  fault (type "1") rules it out and the ladder recover-in-place -> recover -> elastic-training ->
  dump -> exit follows;
* ``retry``, ``recover``, ``elastic-training`` and ``dump`` need every participant to have reported
  them (elastic-training: the job must say it can continue with fewer data-parallel replicas);
* ``recover`` needs an idle spare node for each faulty node (``Request.spares``); the decision
  names the moves (faulty node -> spare), every rank of a faulty node moving with it. Rank 0's node
  is never moved (its host is the job's MASTER_ADDR), as a downgrade never drops it;
  a strategy must be in the policy's allowed list, and ``exit`` is always available;
* the fallback chains: a strategy that already failed in this recovery is skipped; after a failed
  ``retry`` the ladder continues with recover-in-place; after a failed recover-in-place, recover or
  elastic-training (or an upgrade) only dump -> exit remain; after a failed dump only exit; after a failed exit
  the job gives up (killMaster);
* a lost node (its agent's lease expired) rules out recover-in-place: nobody is there to restart;
* a rank that exited with ``STATE_LOST_EXIT_CODE`` (its state cannot be rebuilt by its peers: a
  sharded model's shard with no twin and no RAM copy) rules out every strategy that keeps live
  ranks: only `exit`, from the job's checkpoint, helps;
* ranks that run no recoverd client (``Request.plain_nodes``: their node's declaration leaves
  recover-in-place out) rule it out too, and ``recover``: a plain script's rank restarted or moved
  alone cannot rejoin its running group, it would wait in ``init_process_group`` (docs/adr/0041);
  ``exit`` restarts every rank, moving a lost node's ranks to a spare;
  while a lost node has no spare to go to, the selector waits (no decision) until
  ``replacement_wait_until`` for an agent to replace it (a new agent for its node rank registers
  as a spare), unless elastic-training can go on without it; past that it gives up. An `exit`
  chosen with lost nodes and spares moves their ranks to the spares (``moves``), so it never waits
  for a dead node's agent;
* ``allow_rank0_in_place: false`` rules out recover-in-place when rank 0's node has a fault;
  elastic-training (downgrade) is never used then, as upstream;
* budgets: at most ``max`` uses of a strategy per ``window_s`` (the policy's ``budgets``;
  recover-in-place counted per rank, defaulting to ``max_rank_restarts``; exit is the job's restart
  budget, defaulting to ``max_job_restarts``, both over ``restart_window_s``). An exhausted budget
  moves to the next strategy; only an exhausted exit budget gives up: the job fails rather than
  crash-looping forever.

Every candidate gets a reason, chosen or not, so ``recoverctl decisions`` can show why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from recoverd.strategies import (
    ALL_STRATEGIES,
    KEEP_LIVE_STATE,
    RETRYABLE_FAULT_TYPES,
    STATE_LOST_EXIT_CODE,
    TRAITS,
    UPGRADE,
)

__all__ = ["ALL_STRATEGIES", "EXPECTED_COST_S", "Decision", "Outcome", "PolicyView", "Request", "choose"]

_NEEDS_EVERY_PARTICIPANT = frozenset(s for s, t in TRAITS.items() if t.needs_every_participant)
#: Strategies whose executors exist in this version; the others are refused with that reason.
_IMPLEMENTED = frozenset(ALL_STRATEGIES)
#: What is left after a strategy failed (upstream's chooseStrategy fallbacks); anything else: exit.
_AFTER_FAILED = {
    "retry": ("recover-in-place", "recover", "elastic-training", "dump", "exit"),
    "recover-in-place": ("dump", "exit"),
    "recover": ("dump", "exit"),
    "elastic-training": ("dump", "exit"),
    UPGRADE: ("dump", "exit"),
}

#: Rough cost of each strategy in seconds, shown with decisions (measured figures come from bench/).
EXPECTED_COST_S = {name: traits.expected_cost_s for name, traits in TRAITS.items()}


@dataclass(frozen=True, slots=True)
class PolicyView:
    """The parts of a job's policy the selector reads."""

    strategies: tuple[str, ...] = ("exit",)
    max_rank_restarts: int = 3
    max_job_restarts: int = 3
    restart_window_s: float = 600.0
    #: (strategy, max, window_s): per-strategy budgets; recover-in-place's and exit's override the
    #: two fields above.
    budgets: tuple[tuple[str, int, float], ...] = ()
    allow_rank0_in_place: bool = True

    def budget(self, strategy: str) -> tuple[int, float] | None:
        """(max uses, window in seconds) for ``strategy``, or None when it has no budget."""
        for name, count, window in self.budgets:
            if name == strategy:
                return count, window
        if strategy == "recover-in-place":
            return self.max_rank_restarts, self.restart_window_s
        if strategy == "exit":
            return self.max_job_restarts, self.restart_window_s
        return None


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
    #: Nodes of the faulty ranks, and the node rank 0 runs on ("" = unknown: rank 0 faulty counts).
    fault_nodes: tuple[str, ...] = ()
    rank0_node: str = ""
    #: Live spare nodes holding no ranks, in the order they should be used.
    spares: tuple[str, ...] = ()
    #: Faulty ranks whose node is unknown (not in any rank table): `recover` cannot move them.
    unplaced_ranks: tuple[int, ...] = ()
    #: Faulty nodes whose agent is gone (lease expired): nothing there can be restarted in place.
    lost_nodes: tuple[str, ...] = ()
    #: Nodes an operator is draining (``recoverctl drain``): their ranks must move, never restart there.
    drained_nodes: tuple[str, ...] = ()
    #: Nodes whose ranks run no recoverd client and cannot rejoin their group alone (ADR 0041).
    plain_nodes: tuple[str, ...] = ()
    #: Faulty ranks that exited saying their state cannot be rebuilt by their peers
    #: (``STATE_LOST_EXIT_CODE``): only a restart of every rank from the checkpoint helps.
    state_lost_ranks: tuple[int, ...] = ()
    #: Wall-clock time until which a lost node with no spare waits for an agent to replace it
    #: (0: no wait, the old behaviour: `exit` commands the lost node and waits for its agent).
    replacement_wait_until: float = 0.0


@dataclass(frozen=True, slots=True)
class Decision:
    strategy: str
    reasons: tuple[str, ...]
    give_up: bool = False
    candidates: tuple[str, ...] = ()
    expected_cost_s: float = 0.0
    #: `recover`: (faulty node, spare node) pairs; `exit`: (lost node, spare node) pairs.
    moves: tuple[tuple[str, str], ...] = ()
    #: No decision yet: a lost node waits for its replacement (``reasons`` say which and how long).
    is_waiting: bool = False


def _recent(history: Sequence[Outcome], now: float, window_s: float) -> list[Outcome]:
    return [o for o in history if now - o.closed_at <= window_s]


def _chain(failed: Sequence[str]) -> tuple[tuple[str, ...], str]:
    """The strategies the fallback chains still allow after ``failed``, and the failure that limits them."""
    left: tuple[str, ...] = ALL_STRATEGIES
    limiting = ""
    for strategy in failed:
        after = _AFTER_FAILED.get(strategy, ("exit",))
        narrowed = tuple(s for s in left if s in after)
        if narrowed != left:
            left, limiting = narrowed, strategy
    return left, limiting


def choose(request: Request, *, implemented: frozenset[str] = _IMPLEMENTED) -> Decision:
    """Pick the cheapest strategy that is allowed, supported, left by the fallback chain and within budget.

    ``implemented``: the strategies with executors (tests pass all of them to check the chains).
    """
    policy = request.policy
    allowed = (*[s for s in policy.strategies if s != "exit"], "exit")
    reasons: list[str] = []
    candidates: list[str] = []
    for strategy in ALL_STRATEGIES:
        verdict = _rule_out(strategy, request, allowed, implemented)
        if verdict:
            reasons.append(f"{strategy}: no, {verdict}")
            continue
        candidates.append(strategy)
    unreplaced = request.lost_nodes[len(request.spares) :]
    if unreplaced and request.replacement_wait_until > 0 and "elastic-training" not in candidates:
        # Nothing can run the lost node's ranks: wait for an agent to replace it, or give up.
        if request.now < request.replacement_wait_until:
            left = request.replacement_wait_until - request.now
            reasons.append(
                f"wait: node(s) {list(unreplaced)} lost with no spare; waiting {left:.0f}s more for an agent"
                " to replace them (a new agent for the same node rank, or a --spare)"
            )
            return Decision("", tuple(reasons), is_waiting=True)
        reasons.append(
            f"give up: node(s) {list(unreplaced)} lost and no agent replaced them in time"
            " (the policy's deadlines.replacement): nowhere to run their ranks"
        )
        return Decision("", tuple(reasons), give_up=True)
    if not candidates:
        if "exit" in request.failed:
            reasons.append("give up: exit already failed in this recovery")
        else:
            count, window = policy.budget("exit") or (policy.max_job_restarts, policy.restart_window_s)
            exits = sum(1 for o in _recent(request.history, request.now, window) if o.strategy == "exit")
            reasons.append(f"give up: {exits} exit(s) within {window:g}s reached the job budget of {count}")
        return Decision("", tuple(reasons), give_up=True)
    chosen = candidates[0]
    moves: tuple[tuple[str, str], ...] = ()
    if chosen == "recover":
        moves = tuple(zip(request.fault_nodes, request.spares, strict=False))
    elif chosen == "exit":
        # Every rank restarts; a lost node's ranks restart on a spare (its replacement).
        moves = tuple(zip(request.lost_nodes, request.spares, strict=False))
    where = "; " + ", ".join(f"{a} -> {b}" for a, b in moves) if moves else ""
    reasons.append(f"{chosen}: yes, the cheapest strategy left (about {EXPECTED_COST_S[chosen]:g}s){where}")
    reasons.extend(f"{s}: possible, after {chosen} in priority order" for s in candidates[1:])
    return Decision(
        chosen, tuple(reasons), candidates=tuple(candidates), expected_cost_s=EXPECTED_COST_S[chosen], moves=moves
    )


def _names(nodes: Sequence[str], shown: int = 4) -> str:
    """At most ``shown`` node names, then how many more (a reason must not grow with the job)."""
    more = f" and {len(nodes) - shown} more" if len(nodes) > shown else ""
    return ", ".join(nodes[:shown]) + more


def _rank0_node_faulty(request: Request) -> bool:
    if 0 in request.fault_ranks:
        return True
    return bool(request.rank0_node) and request.rank0_node in request.fault_nodes


def _rule_out(strategy: str, request: Request, allowed: Sequence[str], implemented: frozenset[str]) -> str:
    """Why ``strategy`` cannot be used now, or "" when it can."""
    policy = request.policy
    if strategy not in allowed:
        return "not allowed by the job's policy"
    if strategy in request.failed:
        return "already failed in this recovery"
    left, limiting = _chain(request.failed)
    if strategy not in left:
        return f"after a failed {limiting} the fallback chain continues only with {' -> '.join(left)}"
    if strategy in _NEEDS_EVERY_PARTICIPANT and (request.supported is None or strategy not in request.supported):
        return "not reported by every participant"
    if strategy == "retry" and not set(request.fault_types) <= RETRYABLE_FAULT_TYPES:
        return "a fault is not retryable (only UCE '0' and HCCL '2' are)"
    if strategy in KEEP_LIVE_STATE and request.state_lost_ranks:
        return (
            f"rank(s) {list(request.state_lost_ranks)} exited with code {STATE_LOST_EXIT_CODE}: their state cannot be"
            " rebuilt from their peers (a shard with no twin and no RAM copy; the rank's log says why), so every rank"
            " restarts from the job's checkpoint"
        )
    if strategy in ("recover-in-place", "retry") and request.drained_nodes:
        return f"node(s) {list(request.drained_nodes)} being drained: their ranks must move off them"
    if strategy == "recover-in-place" and request.lost_nodes:
        return f"node(s) {list(request.lost_nodes)} lost: no agent there to restart ranks in place"
    if strategy in ("recover-in-place", "recover") and request.plain_nodes:
        return (
            f"the ranks on node(s) {_names(request.plain_nodes)} run no recoverd client: a plain script's rank"
            " restarted or moved alone cannot rejoin its running group (it would wait in init_process_group),"
            " so every rank is restarted; a job whose ranks never talk to each other says independent_ranks"
            " (docs/policy.md)"
        )
    if strategy == "recover-in-place" and not policy.allow_rank0_in_place and _rank0_node_faulty(request):
        where = f" ({request.rank0_node})" if request.rank0_node else ""
        return f"rank 0's node{where} has a fault and the policy says allow_rank0_in_place: false"
    if strategy == "recover" and _rank0_node_faulty(request):
        return "rank 0's node has a fault, and rank 0's node is the job's MASTER_ADDR: it is never moved"
    if strategy in ("recover", "elastic-training") and request.unplaced_ranks:
        return f"the node of rank(s) {list(request.unplaced_ranks)} is unknown: nothing to act on"
    if strategy == "recover":
        if request.unplaced_ranks:
            return f"the node of rank(s) {list(request.unplaced_ranks)} is unknown: nothing to move"
        if len(request.spares) < len(request.fault_nodes):
            return (
                f"{len(request.fault_nodes)} faulty node(s) {list(request.fault_nodes)} need as many idle spare"
                f" nodes; {len(request.spares)} available {list(request.spares)}"
            )
    if strategy == "elastic-training" and _rank0_node_faulty(request):
        return "rank 0's node has a fault (a downgrade never drops rank 0)"
    budget = policy.budget(strategy)
    if budget is not None:
        count, window = budget
        recent = [o for o in _recent(request.history, request.now, window) if o.strategy == strategy]
        if strategy == "recover-in-place":
            for rank in request.fault_ranks:
                restarts = sum(1 for o in recent if rank in o.ranks)
                if restarts >= count:
                    return f"rank {rank} was restarted in place {restarts} time(s) within {window:g}s (budget {count})"
        elif len(recent) >= count:
            what = "exit(s)" if strategy == "exit" else f"use(s) of {strategy}"
            return f"{len(recent)} {what} within {window:g}s (budget {count})"
    if strategy not in implemented:
        return "not implemented in this version of recoverd"
    return ""
