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
    (
        "a rank whose state its peers cannot rebuild restarts the job from its checkpoint",
        Request((1, 2), policy=RIP, state_lost_ranks=(2,), now=NOW),
        "exit",
        "recover-in-place: no, rank(s) [2] exited with code 86: their state cannot be rebuilt from their peers",
    ),
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
        "a downgrade needs the participants' word (a plain script cannot shrink its world)",
        Request((2,), policy=PolicyView(("elastic-training", "exit")), now=NOW),
        "exit",
        "elastic-training: no, not reported by every participant",
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


# ---------------------------------------------------------------- the whole ladder (issue 5)
# With every strategy treated as implemented, the table checks upstream's chooseStrategy chains.
ALL = ("retry", "recover-in-place", "recover", "elastic-training", "dump", "exit")
EVERYONE = frozenset(ALL)
IMPLEMENTED_ALL = frozenset(ALL)
LADDER = PolicyView(strategies=ALL)


def ladder(**kw: object) -> Request:
    base: dict[str, object] = {"fault_ranks": (2,), "fault_types": ("1",), "policy": LADDER, "supported": EVERYONE}
    base.update(kw)
    return Request(now=NOW, **base)  # type: ignore[arg-type]


LADDER_CASES = [
    # name, request, expected strategy, expected candidates, a phrase the reasons must contain
    ("first choice: retry for retryable faults", ladder(fault_types=("0", "2")), "retry", ALL, "retry: yes"),
    (
        "a normal fault rules out retry: the ladder starts at recover-in-place",
        ladder(fault_types=("0", "1")),
        "recover-in-place",
        ALL[1:],
        "retry: no, a fault is not retryable",
    ),
    (
        "after a failed retry: recover-in-place -> recover -> downgrade -> dump -> exit",
        ladder(fault_types=("0",), failed=("retry",)),
        "recover-in-place",
        ALL[1:],
        "retry: no, already failed",
    ),
    (
        "after failed retry and recover-in-place: dump -> exit",
        ladder(failed=("retry", "recover-in-place")),
        "dump",
        ("dump", "exit"),
        "recover: no, after a failed recover-in-place the fallback chain continues only with dump -> exit",
    ),
    (
        "after a failed recover: dump -> exit",
        ladder(failed=("recover",)),
        "dump",
        ("dump", "exit"),
        "recover-in-place: no, after a failed recover",
    ),
    (
        "after a failed recover-in-place: dump, not recover",
        ladder(failed=("recover-in-place",)),
        "dump",
        ("dump", "exit"),
        "elastic-training: no, after a failed recover-in-place",
    ),
    (
        "after a failed downgrade: dump -> exit",
        ladder(failed=("elastic-training",)),
        "dump",
        ("dump", "exit"),
        "retry: no, after a failed elastic-training",
    ),
    ("after a failed dump: exit", ladder(failed=("dump",)), "exit", ("exit",), "after a failed dump"),
    (
        "recover unsupported by a participant: downgrade",
        ladder(
            policy=PolicyView(("recover", "elastic-training", "exit")),
            supported=frozenset({"elastic-training", "exit"}),
            spares=("s0",),
        ),
        "elastic-training",
        ("elastic-training", "exit"),
        "recover: no, not reported by every participant",
    ),
    (
        "no idle spare: recover is refused and the job downgrades",
        ladder(policy=PolicyView(("recover", "elastic-training", "exit")), fault_nodes=("n1",)),
        "elastic-training",
        ("elastic-training", "exit"),
        "recover: no, 1 faulty node(s) ['n1'] need as many idle spare nodes; 0 available []",
    ),
    (
        "two faulty nodes, one spare: recover is refused",
        ladder(policy=PolicyView(("recover", "exit")), fault_nodes=("n1", "n2"), spares=("s0",)),
        "exit",
        ("exit",),
        "need as many idle spare nodes; 1 available ['s0']",
    ),
    (
        "downgrade not reported by the clients: exit",
        ladder(policy=PolicyView(("elastic-training", "exit")), supported=frozenset({"recover", "exit"})),
        "exit",
        ("exit",),
        "elastic-training: no, not reported by every participant",
    ),
    (
        "a lost node rules out recover-in-place: recover to a spare",
        ladder(fault_nodes=("n1",), lost_nodes=("n1",), spares=("s0",)),
        "recover",
        ("recover", "elastic-training", "dump", "exit"),
        "recover-in-place: no, node(s) ['n1'] lost: no agent there to restart ranks in place",
    ),
    (
        "a drained node rules out retry and recover-in-place: recover to a spare",
        ladder(fault_types=("0",), fault_nodes=("n1",), drained_nodes=("n1",), spares=("s0",)),
        "recover",
        ("recover", "elastic-training", "dump", "exit"),
        "recover-in-place: no, node(s) ['n1'] being drained: their ranks must move off them",
    ),
    (
        "a faulty rank on an unknown node cannot be moved",
        ladder(policy=PolicyView(("recover", "exit")), unplaced_ranks=(2,), spares=("s0",)),
        "exit",
        ("exit",),
        "recover: no, the node of rank(s) [2] is unknown: nothing to act on",
    ),
    (
        "unsupported by one client: dump falls to exit",
        ladder(policy=PolicyView(("dump", "exit")), supported=frozenset({"retry", "exit"})),
        "exit",
        ("exit",),
        "dump: no, not reported by every participant",
    ),
    (
        "rank 0's node faulty and allow_rank0_in_place false: recover",
        ladder(
            policy=PolicyView(ALL, allow_rank0_in_place=False),
            fault_ranks=(3,),
            fault_nodes=("n0",),
            rank0_node="n0",
            spares=("s0",),
        ),
        "dump",
        ("dump", "exit"),
        "recover-in-place: no, rank 0's node (n0) has a fault and the policy says allow_rank0_in_place: false",
    ),
    (
        "rank 0 itself faulty counts even when its node is unknown",
        ladder(policy=PolicyView(ALL, allow_rank0_in_place=False), fault_ranks=(0,), spares=("s0",)),
        "dump",
        ("dump", "exit"),
        "recover: no, rank 0's node has a fault, and rank 0's node is the job's MASTER_ADDR: it is never moved",
    ),
    (
        "another node's fault: rank 0's node may stay in place",
        ladder(
            policy=PolicyView(ALL, allow_rank0_in_place=False),
            fault_ranks=(5,),
            fault_nodes=("n1",),
            rank0_node="n0",
            spares=("s0",),
        ),
        "recover-in-place",
        ALL[1:],
        "recover-in-place: yes",
    ),
    (
        "rank-0 node fault with the default policy: in place is fine",
        ladder(fault_ranks=(0,), fault_nodes=("n0",), rank0_node="n0", spares=("s0",)),
        "recover-in-place",
        ("recover-in-place", "dump", "exit"),
        "recover-in-place: yes",
    ),
    (
        "recover-in-place budget spent (per rank): recover, not exit",
        ladder(
            policy=PolicyView(ALL, budgets=(("recover-in-place", 1, 60.0),)),
            history=(rip_outcome(2, NOW - 10),),
        ),
        "recover",
        ("recover", "elastic-training", "dump", "exit"),
        "rank 2 was restarted in place 1 time(s) within 60s (budget 1)",
    ),
    (
        "recover budget spent job-wide: elastic-training",
        ladder(
            policy=PolicyView(("recover", "elastic-training", "exit"), budgets=(("recover", 2, 300.0),)),
            history=(Outcome("recover", (7,), NOW - 50, True), Outcome("recover", (8,), NOW - 40, False)),
        ),
        "elastic-training",
        ("elastic-training", "exit"),
        "recover: no, 2 use(s) of recover within 300s (budget 2)",
    ),
    (
        "dump budget spent: exit",
        ladder(
            policy=PolicyView(("dump", "exit"), budgets=(("dump", 1, 300.0),)),
            history=(Outcome("dump", (1,), NOW - 5, True),),
        ),
        "exit",
        ("exit",),
        "dump: no, 1 use(s) of dump within 300s (budget 1)",
    ),
    (
        "budget outside its window does not count",
        ladder(
            policy=PolicyView(("dump", "exit"), budgets=(("dump", 1, 30.0),)),
            history=(Outcome("dump", (1,), NOW - 50, True),),
        ),
        "dump",
        ("dump", "exit"),
        "dump: yes",
    ),
    (
        "an exit budget from the budgets map overrides max_job_restarts",
        ladder(
            policy=PolicyView(("exit",), max_job_restarts=1, budgets=(("exit", 3, 60.0),)),
            history=(exit_outcome(NOW - 20),),
        ),
        "exit",
        ("exit",),
        "exit: yes",
    ),
    (
        "mixed fault types (UCE and HCCL) stay retryable",
        ladder(fault_types=("0", "2", "0")),
        "retry",
        ALL,
        "retry: yes",
    ),
    (
        "retry allowed but only exit otherwise: a normal fault goes to exit",
        ladder(policy=PolicyView(("retry",)), fault_types=("1",)),
        "exit",
        ("exit",),
        "recover-in-place: no, not allowed",
    ),
]


@pytest.mark.parametrize(
    ("name", "request_", "strategy", "candidates", "phrase"), LADDER_CASES, ids=[c[0] for c in LADDER_CASES]
)
def test_ladder(name: str, request_: Request, strategy: str, candidates: tuple[str, ...], phrase: str) -> None:
    decision = choose(request_, implemented=IMPLEMENTED_ALL)
    assert decision.strategy == strategy, decision.reasons
    assert decision.candidates == candidates, decision.reasons
    assert any(phrase in reason for reason in decision.reasons), decision.reasons
    # One reason per strategy: why not (priority order), then why this one, then the next fallbacks.
    assert [r.split(":")[0] for r in decision.reasons] == [s for s in ALL if s not in candidates] + list(candidates)


def test_exit_budget_spent_still_gives_up() -> None:
    decision = choose(
        ladder(policy=PolicyView(("dump", "exit"), budgets=(("exit", 1, 60.0),)), failed=("dump",),
               history=(exit_outcome(NOW - 1),)),
        implemented=IMPLEMENTED_ALL,
    )  # fmt: skip
    assert decision.give_up and decision.strategy == ""
    assert "give up: 1 exit(s) within 60s reached the job budget of 1" in decision.reasons


def test_recover_names_one_spare_per_faulty_node() -> None:
    decision = choose(
        ladder(policy=PolicyView(("recover", "exit")), fault_nodes=("n1", "n3"), spares=("s0", "s1", "s2"))
    )
    assert decision.strategy == "recover"
    assert decision.moves == (("n1", "s0"), ("n3", "s1"))
    assert any("n1 -> s0, n3 -> s1" in reason for reason in decision.reasons), decision.reasons
    # Only `recover` moves anything.
    assert choose(ladder(fault_nodes=("n1",), spares=("s0",))).moves == ()


def test_every_strategy_is_implemented_in_this_version() -> None:
    for strategy in ALL:
        policy = PolicyView((strategy, "exit"))
        request = ladder(policy=policy, fault_types=("0",), fault_nodes=("n1",), spares=("s0",))
        assert choose(request).strategy == strategy
        assert not any("not implemented" in r for r in choose(request).reasons)


def test_ranks_that_run_no_client_are_never_restarted_alone() -> None:
    """ADR 0041: a plain script's rank restarted alone would wait in init_process_group for good."""
    plain = Request((2,), policy=RIP, now=NOW, fault_nodes=("n0",), plain_nodes=("n0", "n1"))
    decision = choose(plain)
    assert decision.strategy == "exit"
    why = next(r for r in decision.reasons if r.startswith("recover-in-place: no"))
    assert "n0, n1 run no recoverd client" in why and "init_process_group" in why and "independent_ranks" in why
    # Nor moved alone to a spare: the moved ranks could not rejoin the survivors either.
    moving = choose(
        Request((2,), policy=PolicyView(("recover", "exit")), now=NOW, fault_nodes=("n1",), spares=("s0",),
                supported=frozenset({"recover", "exit"}),
                plain_nodes=("n0", "n1"))
    )  # fmt: skip
    assert moving.strategy == "exit" and any(r.startswith("recover: no, the ranks on") for r in moving.reasons)
    # A job of a hundred plain nodes: the reason names a few, not all of them.
    many = choose(Request((2,), policy=RIP, now=NOW, plain_nodes=tuple(f"n{i}" for i in range(100))))
    assert "n0, n1, n2, n3 and 96 more" in next(r for r in many.reasons if r.startswith("recover-in-place: no"))
    # Nothing else changes: ranks that can rejoin are restarted alone as before.
    assert choose(Request((2,), policy=RIP, now=NOW, fault_nodes=("n0",))).strategy == "recover-in-place"
