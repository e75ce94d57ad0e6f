"""A lost node with no standing spare: the pure parts (selector, recovery walk, exit placement).

End to end against a real etcd and real agents: tests/integration/test_node_replacement.py.
"""

from __future__ import annotations

import dataclasses

from recoverd.coordinator.effects import EmitEvent, FinishJob, ForgetNode, RecordOutcome, SendCommand
from recoverd.coordinator.inputs import DeadlinePassed, DecisionMade, FaultReported
from recoverd.coordinator.model import FaultInfo, Layout, Phase, Recovery, Timeouts
from recoverd.coordinator.recovery import step
from recoverd.policy import DEFAULT_REPLACEMENT_WAIT_S, parse_policy, replacement_wait_s
from recoverd.records import pb
from recoverd.strategy.selector import PolicyView, Request, choose

LOST_AT = 1000.0
LOST = tuple(FaultInfo(f"lost.n1.r{r}.g0.c0", r, "n1", source="lease", detected_at=LOST_AT) for r in (2, 3))
TIMEOUTS = Timeouts(decide_s=30.0, replacement_s=120.0)


def _request(now: float, spares: tuple[str, ...] = (), strategies: tuple[str, ...] = ("exit",)) -> Request:
    return Request(
        fault_ranks=(2, 3),
        policy=PolicyView(strategies=strategies),
        supported=frozenset({"recover-in-place", "recover", "exit"}),
        now=now,
        fault_nodes=("n1",),
        rank0_node="n0",
        spares=spares,
        lost_nodes=("n1",),
        replacement_wait_until=LOST_AT + 120.0,
    )


def test_a_lost_node_with_no_spare_waits_for_its_replacement() -> None:
    decision = choose(_request(LOST_AT + 5))
    assert decision.is_waiting and not decision.strategy and not decision.give_up
    assert decision.reasons[-1].startswith("wait: node(s) ['n1'] lost with no spare; waiting 115s more")


def test_past_the_wait_the_selector_gives_up_saying_why() -> None:
    decision = choose(_request(LOST_AT + 121))
    assert decision.give_up and not decision.is_waiting
    assert "give up: node(s) ['n1'] lost and no agent replaced them in time" in decision.reasons[-1]


def test_no_wait_configured_keeps_the_old_choice() -> None:
    decision = choose(dataclasses.replace(_request(LOST_AT + 5), replacement_wait_until=0.0))
    assert decision.strategy == "exit" and decision.moves == ()


def test_with_a_replacement_exit_moves_the_lost_nodes_ranks_there() -> None:
    decision = choose(_request(LOST_AT + 5, spares=("n1b",)))
    assert (decision.strategy, decision.moves) == ("exit", (("n1", "n1b"),))
    assert decision.reasons[-1].endswith("n1 -> n1b")


def test_with_a_replacement_and_recover_allowed_the_ranks_move_and_survivors_stay() -> None:
    decision = choose(_request(LOST_AT + 5, spares=("n1b",), strategies=("recover", "exit")))
    assert (decision.strategy, decision.moves) == ("recover", (("n1", "n1b"),))


def test_elastic_training_goes_on_without_waiting() -> None:
    request = dataclasses.replace(
        _request(LOST_AT + 5, strategies=("elastic-training", "exit")),
        supported=frozenset({"elastic-training", "exit"}),
    )
    assert choose(request).strategy == "elastic-training"


def _deciding(now: float) -> Recovery:
    rec = Recovery(
        epoch=1, recovery_id=1, opened_at=LOST_AT, faults=LOST, participants=frozenset({"agents"}), phase=Phase.DONE
    )
    # COLLECTING -> STOPPING -> ... DECIDING, entered through the walk so its deadline is the walk's.
    rec = dataclasses.replace(rec, phase=Phase.GLOBAL_FAULT, deadline_at=now)
    new, _ = step(rec, DeadlinePassed(1), now, TIMEOUTS)
    assert new.phase is Phase.DECIDING
    return new


def test_deciding_waits_as_long_as_the_replacement_wait_from_the_loss() -> None:
    assert _deciding(LOST_AT + 2).deadline_at == LOST_AT + 120.0
    # A later round (a survivor crashed meanwhile) waits against the same bound, not a new one.
    assert _deciding(LOST_AT + 100).deadline_at == LOST_AT + 130.0


def test_at_the_deadline_an_unreplaced_lost_node_fails_the_job_saying_why() -> None:
    rec = _deciding(LOST_AT + 2)
    layout = Layout(placement=(("n0", (0, 1)), ("n1", (2, 3))), live=frozenset({"n0"}))
    new, effects = step(rec, DeadlinePassed(rec.epoch, ("n0", "n1"), layout), LOST_AT + 121, TIMEOUTS)
    assert new.phase is Phase.FAILED
    assert "node(s) ['n1'] lost and no agent replaced them within 120s" in new.outcome
    assert any(isinstance(e, FinishJob) for e in effects)


def test_an_exit_with_a_replacement_starts_the_lost_ranks_there_and_forgets_the_lost_node() -> None:
    rec = _deciding(LOST_AT + 2)
    layout = Layout(
        placement=(("n0", (0, 1)), ("n1", (2, 3))), live=frozenset({"n0", "n1b"}), spares=("n1b",), world_size=4,
        nproc_per_node=2,
    )  # fmt: skip
    decision = DecisionMade(
        rec.epoch, "exit", ("exit",), nodes=("n0", "n1", "n1b"), moves=(("n1", "n1b"),), layout=layout
    )
    new, effects = step(rec, decision, LOST_AT + 10, TIMEOUTS)
    commands = sorted((e.node, e.action, e.ranks) for e in effects if isinstance(e, SendCommand))
    assert commands == [("n0", "RESTART_ALL", ()), ("n1b", "START_RANKS", (2, 3))]
    assert [e.node for e in effects if isinstance(e, ForgetNode)] == ["n1"]
    assert new.command_nodes == frozenset({"n0", "n1b"})


def test_a_lost_nodes_late_lease_faults_do_not_count_the_interrupted_round() -> None:
    """The survivors crash at once and an `exit` runs; node n1's lease expires ~2 s later: the same
    incident, so the interrupted exit is not recorded as a spent restart."""
    crash = FaultInfo("n0.r0", 0, "n0", detected_at=LOST_AT)
    rec = Recovery(
        phase=Phase.RECOVERING, epoch=2, recovery_id=1, opened_at=LOST_AT, faults=(crash,), strategy="exit",
        participants=frozenset({"agents"}), command_nodes=frozenset({"n0", "n1"}), deadline_at=LOST_AT + 60,
    )  # fmt: skip
    new, effects = step(rec, FaultReported(LOST[0], more=LOST[1:]), LOST_AT + 2, TIMEOUTS)
    assert new.phase is Phase.STOPPING and not [e for e in effects if isinstance(e, RecordOutcome)]
    assert any(isinstance(e, EmitEvent) and e.reason == "fault_merged" for e in effects)
    # Any other fault still counts the interrupted round (a crash loop must spend the budget).
    other = FaultInfo("n0.r1", 1, "n0", detected_at=LOST_AT + 2)
    _, effects = step(rec, FaultReported(other), LOST_AT + 2, TIMEOUTS)
    assert [e.strategy for e in effects if isinstance(e, RecordOutcome)] == ["exit"]


def test_the_policy_sets_the_wait_and_zero_turns_it_off() -> None:
    assert replacement_wait_s(pb.Policy()) == DEFAULT_REPLACEMENT_WAIT_S == 120.0
    assert replacement_wait_s(parse_policy("deadlines: {replacement: 45}").to_pb()) == 45.0
    assert replacement_wait_s(parse_policy("deadlines: {replacement: 0}").to_pb()) == 0.0


def test_a_stored_wait_that_is_no_duration_falls_back_to_the_default() -> None:
    for bad in (float("nan"), float("inf"), -5.0):
        policy = pb.Policy()
        policy.deadlines.replacement_s = bad
        assert replacement_wait_s(policy) == DEFAULT_REPLACEMENT_WAIT_S
