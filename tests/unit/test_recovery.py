"""Example-based tests of the pure recovery state machine (``recoverd.coordinator.recovery``).

Every record used here is reached from DONE by real events (:func:`walk`), never built by hand, so
the tests see exactly the records the shell will see. No etcd, no clock, no I/O.
"""

from __future__ import annotations

import copy
import dataclasses
import typing

import pytest

from recoverd.coordinator.effects import EmitEvent, FinishJob, ForgetNode, PublishSignal, RecordOutcome, SendCommand
from recoverd.coordinator.inputs import (
    CapacityReturned,
    CommandedNodeLost,
    DeadlinePassed,
    DecisionMade,
    Event,
    FaultReported,
    ParticipantsChanged,
    RecoverStatusReported,
    StopCompleted,
    StrategiesReported,
)
from recoverd.coordinator.model import FaultInfo, Layout, Phase, Recovery, Timeouts
from recoverd.coordinator.recovery import TRANSITIONS, UPGRADE, step
from recoverd.coordinator.wire import wire_strategy
from recoverd.errors import IllegalTransition, StaleEpoch
from recoverd.participants import of_node
from recoverd.strategies import CHEAPER_THAN_EXIT

#: Distinct values, so a deadline armed with the wrong phase's timeout is caught.
#: fault_settle_s=0: COLLECTING lasts the whole window in these tests (the settling has its own).
T = Timeouts(fault_window_s=1.0, stop_s=2.0, strategies_s=3.0, decide_s=4.0, recover_s=5.0, fault_settle_s=0)
T0 = 100.0
ALL_STRATEGIES = (*CHEAPER_THAN_EXIT, "exit")
EVENT_TYPES: tuple[type, ...] = typing.get_args(Event)
WAITING = (Phase.STOPPING, Phase.GLOBAL_FAULT, Phase.RECOVERING)
ROUND_RESTART_PHASES = (Phase.STOPPING, Phase.GLOBAL_FAULT, Phase.DECIDING, Phase.RECOVERING)


def fault(fault_id: str = "f1", rank: int = 3, node: str = "n1", fault_type: str = "1") -> FaultInfo:
    return FaultInfo(fault_id=fault_id, rank=rank, node=node, fault_type=fault_type, detected_at=T0)


def apply(rec: Recovery, event: object, now: float) -> tuple[Recovery, list[object]]:
    return step(rec, event, now, T)  # type: ignore[arg-type]


def reasons(effects: list[object]) -> list[str]:
    return [e.reason for e in effects if isinstance(e, EmitEvent)]


def non_emit(effects: list[object]) -> list[object]:
    """The effects that act on the world (EmitEvent messages are prose, checked by reason only)."""
    return [e for e in effects if not isinstance(e, EmitEvent)]


# Targets of walk(): every phase, plus the two ways to FAILED and the two kinds of DONE.
STATES = (
    "DONE_INITIAL",
    "COLLECTING",
    "STOPPING",
    "GLOBAL_FAULT",
    "DECIDING",
    "RECOVERING",
    "DONE",
    "FAILED",
    "FAILED_GIVE_UP",
)


def walk(
    target: str,
    participants: tuple[str, ...] = ("a",),
    strategy: str = "recover-in-place",
    faults: tuple[FaultInfo, ...] | None = None,
    nodes: tuple[str, ...] = ("n0", "n1"),
    start: tuple[Recovery, float] | None = None,
) -> tuple[Recovery, float]:
    """Drive a recovery from DONE (``start``, or a fresh record) to ``target`` with real events.

    Returns (record, now). Each transition is taken at the earliest legal time (deadlines exactly
    when due), and every step is checked to land where the happy path says. Without ``faults`` the
    recovery is opened by one new fault (rank 3 on n1) whose id is fresh for ``start``: "f1" for the
    first recovery, "f2" for the second, ... (a fault id the last recovery handled opens nothing).
    To leave RECOVERING for DONE, the agents of the commanded nodes confirm as well as the
    participants (:func:`confirm_commands`).
    """
    rec, now = start or (Recovery(), T0)
    assert rec.phase is Phase.DONE
    if target == "DONE_INITIAL":
        return rec, now
    if faults is None:
        faults = (fault(f"f{rec.recovery_id + 1}"),)
    rec, _ = apply(rec, FaultReported(faults[0], frozenset(participants)), now)
    for extra in faults[1:]:
        rec, _ = apply(rec, FaultReported(extra), now)
    assert rec.phase is Phase.COLLECTING
    if target == "COLLECTING":
        return rec, now
    now = rec.deadline_at
    rec, _ = apply(rec, DeadlinePassed(rec.epoch), now)
    assert rec.phase is Phase.STOPPING
    if target == "STOPPING":
        return rec, now
    now += 0.5
    for p in participants:
        rec, _ = apply(rec, StopCompleted(rec.epoch, p), now)
    assert rec.phase is Phase.GLOBAL_FAULT
    if target == "GLOBAL_FAULT":
        return rec, now
    now += 0.5
    for p in participants:
        rec, _ = apply(rec, StrategiesReported(rec.epoch, p, ALL_STRATEGIES), now)
    assert rec.phase is Phase.DECIDING
    if target == "DECIDING":
        return rec, now
    now += 0.5
    if target == "FAILED_GIVE_UP":
        rec, _ = apply(rec, DecisionMade(rec.epoch, "", ("nothing fits",), give_up=True), now)
        assert rec.phase is Phase.FAILED
        return rec, now
    chosen = "exit" if target == "FAILED" else strategy
    rec, _ = apply(rec, DecisionMade(rec.epoch, chosen, ("because",), nodes=nodes), now)
    assert rec.phase is Phase.RECOVERING
    if target == "RECOVERING":
        return rec, now
    now += 0.5
    if target == "FAILED":
        rec, _ = apply(rec, RecoverStatusReported(rec.epoch, participants[0], 1, "exit", "boom"), now)
        assert rec.phase is Phase.FAILED
        return rec, now
    # The commanded nodes' agents confirm first, so the participants' answers finish the recovery.
    rec = confirm_commands(rec, now)
    for p in participants:
        rec, _ = apply(rec, RecoverStatusReported(rec.epoch, p, 0, strategy), now)
    assert rec.phase is Phase.DONE and target == "DONE"
    return rec, now


def plausible_event(rec: Recovery, event_type: type) -> object:
    """An event of ``event_type`` that makes sense for ``rec`` (current epoch, a real participant)."""
    who = min(rec.participants) if rec.participants else "a"
    if event_type is FaultReported:
        return FaultReported(fault("f-new", rank=7, node="n2"), frozenset({"a"}))
    if event_type is DeadlinePassed:
        return DeadlinePassed(rec.epoch)
    if event_type is StopCompleted:
        return StopCompleted(rec.epoch, who)
    if event_type is StrategiesReported:
        return StrategiesReported(rec.epoch, who, ALL_STRATEGIES)
    if event_type is DecisionMade:
        return DecisionMade(rec.epoch, "recover-in-place", ("fits",), nodes=("n0", "n1"))
    if event_type is RecoverStatusReported:
        return RecoverStatusReported(rec.epoch, who, 0, rec.strategy)
    if event_type is ParticipantsChanged:
        return ParticipantsChanged(rec.participants | {"late-joiner"})
    if event_type is CapacityReturned:
        return CapacityReturned(Layout(live=frozenset({"n0", "spare0"}), spares=("spare0",)))
    if event_type is CommandedNodeLost:
        return CommandedNodeLost(rec.epoch, rec.command_nodes or frozenset({"n1"}))
    raise AssertionError(f"no plausible event for {event_type}")  # pragma: no cover


def confirm_commands(rec: Recovery, now: float) -> Recovery:
    """In RECOVERING, the agents of the commanded nodes that are not participants confirm their
    commands (status 0). They alone never finish the recovery: the participants must answer too.
    Outside RECOVERING (no commanded nodes) this returns ``rec`` itself."""
    for node in sorted(rec.command_nodes):
        if of_node(node) not in rec.participants:
            rec, effects = apply(rec, RecoverStatusReported(rec.epoch, of_node(node), 0, rec.strategy), now)
            assert rec.phase is Phase.RECOVERING and effects == []
    return rec


def state_phase(state: str) -> Phase:
    return Phase(state.removesuffix("_INITIAL").removesuffix("_GIVE_UP"))


# ============================================================ 1. the table and its complement


def test_event_union_and_table_cover_each_other() -> None:
    assert set(EVENT_TYPES) == {
        FaultReported,
        DeadlinePassed,
        StopCompleted,
        StrategiesReported,
        DecisionMade,
        RecoverStatusReported,
        ParticipantsChanged,
        CapacityReturned,
        CommandedNodeLost,
    }
    assert {event_type for _, event_type in TRANSITIONS} == set(EVENT_TYPES)
    assert {phase for phase, _ in TRANSITIONS} == set(Phase) - {Phase.FAILED}
    assert all(isinstance(target, Phase) for target in TRANSITIONS.values())


def test_walk_reaches_every_phase() -> None:
    assert {walk(s)[0].phase for s in STATES} == set(Phase)
    assert {state_phase(s) for s in STATES} == set(Phase)


CROSS = [(s, e) for s in STATES for e in EVENT_TYPES]


@pytest.mark.parametrize(("state", "event_type"), CROSS, ids=[f"{s}-{e.__name__}" for s, e in CROSS])
def test_every_phase_event_pair(state: str, event_type: type) -> None:
    rec, now = walk(state, participants=("a", "b"))
    assert rec.phase is state_phase(state)
    event = plausible_event(rec, event_type)
    before = copy.deepcopy(rec)
    later = (rec.deadline_at or now) + 0.25
    if (rec.phase, event_type) in TRANSITIONS:
        new, effects = apply(rec, event, later)
        assert isinstance(effects, list)
        assert new.phase is TRANSITIONS[rec.phase, event_type] or new.phase is rec.phase
    else:
        with pytest.raises(IllegalTransition) as info:
            apply(rec, event, later)
        assert info.value.reason == "illegal_transition"
        assert event_type.__name__ in str(info.value)
        assert rec == before
    # Records are frozen: nothing can have been changed in place either way.
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.phase = Phase.DONE  # type: ignore[misc]


def guarded_case(phase: Phase, event_type: type) -> tuple[Recovery, object, float]:
    """A record in ``phase`` and an event of ``event_type`` for which the guard holds."""
    if event_type is ParticipantsChanged and phase in WAITING:
        # Two participants, one answered (and in RECOVERING the commanded agent too): losing the
        # other one completes the phase.
        rec, now = walk(phase.name, participants=("a", "b"))
        rec = confirm_commands(rec, now)
        report = {
            Phase.STOPPING: StopCompleted(rec.epoch, "a"),
            Phase.GLOBAL_FAULT: StrategiesReported(rec.epoch, "a", ALL_STRATEGIES),
            Phase.RECOVERING: RecoverStatusReported(rec.epoch, "a", 0),
        }[phase]
        rec, _ = apply(rec, report, now)
        return rec, ParticipantsChanged(frozenset({"a"})), now
    rec, now = walk(phase.name)
    if event_type is CapacityReturned:
        rec = dataclasses.replace(rec, isolated=((3, "n1"),))  # a downgrade isolated rank 3
    if event_type is RecoverStatusReported:
        rec = confirm_commands(rec, now)  # so that the participant's answer is the last one required
    event = plausible_event(rec, event_type)
    if event_type is DeadlinePassed:
        now = rec.deadline_at
    return rec, event, now


@pytest.mark.parametrize(("phase", "event_type"), list(TRANSITIONS), ids=[f"{p}-{e.__name__}" for p, e in TRANSITIONS])
def test_guarded_transition_enters_table_target(phase: Phase, event_type: type) -> None:
    rec, event, now = guarded_case(phase, event_type)
    new, _ = apply(rec, event, now)
    target = TRANSITIONS[phase, event_type]
    assert new.phase is target
    if target is Phase.COLLECTING and event_type is FaultReported:
        # COLLECTING ends fault_settle_s after the last fault, within the window.
        assert new.deadline_at == T.collect_deadline(new.opened_at, now)
    else:
        assert new.deadline_at == (now + T.for_phase(target) if target is not Phase.DONE else None) or (
            target is phase and new.deadline_at == rec.deadline_at
        )
    if target is not phase or (phase, event_type) == (Phase.STOPPING, FaultReported):
        assert new.phase_log[-1] == (target, now, new.epoch)
        assert new.reported == frozenset()


def test_failed_is_terminal() -> None:
    for state in ("FAILED", "FAILED_GIVE_UP"):
        rec, now = walk(state)
        assert rec.deadline_at is None
        for event_type in EVENT_TYPES:
            with pytest.raises(IllegalTransition):
                apply(rec, plausible_event(rec, event_type), now + 1000)


def test_illegal_transition_is_checked_before_the_epoch() -> None:
    # A stale report in a phase with no rule for it is illegal first (the table check comes first).
    rec, now = walk("DONE")
    with pytest.raises(IllegalTransition):
        apply(rec, StopCompleted(rec.epoch - 1, "a"), now)


# ============================================================ 2. happy path and exit path


def test_single_agent_recover_in_place_happy_path() -> None:
    rec = Recovery()
    assert (rec.phase, rec.epoch, rec.recovery_id, rec.deadline_at, rec.phase_log) == (
        Phase.DONE,
        0,
        0,
        None,
        (),
    )
    wire = ((3, "1"),)
    # The only participant is the agent of the faulty node: it answers both as the participant and
    # as the commanded node's agent.
    agent = of_node("n1")

    rec, effects = apply(rec, FaultReported(fault(), frozenset({agent})), 100.0)
    assert (rec.phase, rec.epoch, rec.recovery_id, rec.opened_at) == (Phase.COLLECTING, 1, 1, 100.0)
    assert rec.deadline_at == 100.0 + T.fault_window_s
    assert rec.participants == {agent} and rec.fault_ranks == (3,)
    assert reasons(effects) == ["recovery_opened"] and non_emit(effects) == []

    rec, effects = apply(rec, DeadlinePassed(1), 101.0)
    assert (rec.phase, rec.epoch, rec.deadline_at) == (Phase.STOPPING, 1, 101.0 + T.stop_s)
    assert effects == [PublishSignal("stopTrain", ("stop_train",), wire)]

    rec, effects = apply(rec, StopCompleted(1, agent), 101.5)
    assert (rec.phase, rec.epoch, rec.deadline_at) == (Phase.GLOBAL_FAULT, 1, 101.5 + T.strategies_s)
    assert effects == [PublishSignal("globalFault", ("on_global_rank",), wire)]

    rec, effects = apply(rec, StrategiesReported(1, agent, ("retry", "recover-in-place", "exit")), 102.0)
    assert (rec.phase, rec.epoch, rec.deadline_at) == (Phase.DECIDING, 1, 102.0 + T.decide_s)
    assert rec.supported == {"retry", "recover-in-place", "exit"}
    assert effects == []

    rec, effects = apply(rec, DecisionMade(1, "recover-in-place", ("cheapest fit",), nodes=("n0", "n1")), 103.0)
    assert (rec.phase, rec.epoch, rec.deadline_at) == (Phase.RECOVERING, 1, 103.0 + T.recover_s)
    assert (rec.strategy, rec.decision_reasons, rec.command_seq) == ("recover-in-place", ("cheapest fit",), 1)
    assert rec.command_nodes == {"n1"}
    assert reasons(effects) == ["strategy_decided"]
    assert non_emit(effects) == [
        PublishSignal(
            "changeStrategy",
            ("change_strategy", "fault_nodes_restart"),
            wire,
            change_strategy="recover",
            extra_params="recover-in-place",
        ),
        SendCommand("n1", "RESTART_RANKS", (3,), 1, "recover-in-place"),
    ]
    assert isinstance(effects[0], EmitEvent)  # the decision is announced before it is acted on

    rec, effects = apply(rec, RecoverStatusReported(1, agent, 0, "recover-in-place"), 104.0)
    assert (rec.phase, rec.epoch, rec.deadline_at, rec.outcome) == (Phase.DONE, 1, None, "succeeded")
    assert rec.command_nodes == frozenset()
    assert non_emit(effects) == [RecordOutcome("recover-in-place", (3,), ok=True)]
    assert reasons(effects) == ["recovery_done"]
    assert rec.phase_log == (
        (Phase.COLLECTING, 100.0, 1),
        (Phase.STOPPING, 101.0, 1),
        (Phase.GLOBAL_FAULT, 101.5, 1),
        (Phase.DECIDING, 102.0, 1),
        (Phase.RECOVERING, 103.0, 1),
        (Phase.DONE, 104.0, 1),
    )

    # A second recovery: new id, new epoch, and command seqs keep increasing across recoveries.
    rec, _ = apply(rec, FaultReported(fault("f2", rank=5, node="n0")), 200.0)
    assert (rec.phase, rec.epoch, rec.recovery_id, rec.participants) == (Phase.COLLECTING, 2, 2, {agent})
    assert rec.faults == (fault("f2", rank=5, node="n0"),) and rec.phase_log == ((Phase.COLLECTING, 200.0, 2),)
    rec, _ = apply(rec, DeadlinePassed(2), 201.0)
    rec, _ = apply(rec, StopCompleted(2, agent), 201.0)
    rec, _ = apply(rec, StrategiesReported(2, agent, ALL_STRATEGIES), 201.0)
    rec, effects = apply(rec, DecisionMade(2, "recover-in-place"), 201.0)
    assert [e for e in effects if isinstance(e, SendCommand)] == [
        SendCommand("n0", "RESTART_RANKS", (5,), 2, "recover-in-place")
    ]
    # n0's agent is not a participant, but it was commanded: the participant alone is not enough.
    assert rec.command_nodes == {"n0"}
    rec, effects = apply(rec, RecoverStatusReported(2, agent, 0, "recover-in-place"), 202.0)
    assert (rec.phase, rec.reported, effects) == (Phase.RECOVERING, {agent}, [])
    rec, effects = apply(rec, RecoverStatusReported(2, of_node("n0"), 0, "recover-in-place"), 203.0)
    assert (rec.phase, rec.outcome) == (Phase.DONE, "succeeded")
    assert non_emit(effects) == [RecordOutcome("recover-in-place", (5,), ok=True)]


def test_exit_restarts_every_decision_node_and_every_fault_node() -> None:
    rec, now = walk("DECIDING", faults=(fault("f1", 3, "n1"), fault("f2", 9, "n9")))
    rec, effects = apply(rec, DecisionMade(rec.epoch, "exit", ("last resort",), nodes=("n2", "n0", "n1")), now)
    assert rec.phase is Phase.RECOVERING and rec.strategy == "exit"
    assert non_emit(effects) == [
        PublishSignal("changeStrategy", ("change_strategy",), ((3, "1"), (9, "1")), "exit", ""),
        SendCommand("n0", "RESTART_ALL", (), 1, "exit"),
        SendCommand("n1", "RESTART_ALL", (), 2, "exit"),
        SendCommand("n2", "RESTART_ALL", (), 3, "exit"),
        SendCommand("n9", "RESTART_ALL", (), 4, "exit"),
    ]
    assert rec.command_seq == 4
    # Every restarted node's agent must confirm, besides the participant.
    assert rec.command_nodes == {"n0", "n1", "n2", "n9"}
    rec, effects = apply(rec, RecoverStatusReported(rec.epoch, "a", 0, "exit"), now + 1)
    assert (rec.phase, rec.reported, effects) == (Phase.RECOVERING, {"a"}, [])
    for node in ("n9", "n0", "n2"):
        rec, effects = apply(rec, RecoverStatusReported(rec.epoch, of_node(node), 0, "exit"), now + 1)
        assert rec.phase is Phase.RECOVERING and effects == []
    assert rec.reported == {"a", "agent.n0", "agent.n2", "agent.n9"}
    rec, effects = apply(rec, RecoverStatusReported(rec.epoch, "agent.n1", 0, "exit"), now + 2)
    assert rec.phase is Phase.DONE
    assert non_emit(effects) == [RecordOutcome("exit", (3, 9), ok=True)]


def test_restart_ranks_groups_ranks_by_node_in_node_order() -> None:
    faults = (fault("f1", 5, "n2"), fault("f2", 1, "n1"), fault("f3", 4, "n2"), fault("f4", 4, "n2"))
    rec, now = walk("DECIDING", faults=faults)
    rec2, effects = apply(rec, DecisionMade(rec.epoch, "recover-in-place"), now)
    assert [e for e in effects if isinstance(e, SendCommand)] == [
        SendCommand("n1", "RESTART_RANKS", (1,), 1, "recover-in-place"),
        SendCommand("n2", "RESTART_RANKS", (4, 5), 2, "recover-in-place"),
    ]
    assert rec2.fault_ranks == (1, 4, 5)


@pytest.mark.parametrize("strategy", ["retry", "dump"])
def test_strategies_carried_out_by_the_job_send_no_command(strategy: str) -> None:
    """retry (step rollback) and dump (save) are the job's own: no process is restarted."""
    rec, now = walk("DECIDING", faults=(fault("f1", 5, "n2"),))
    rec, effects = apply(rec, DecisionMade(rec.epoch, strategy), now)
    assert rec.phase is Phase.RECOVERING and rec.command_nodes == frozenset()
    assert [e for e in effects if isinstance(e, SendCommand)] == []
    signal = next(e for e in effects if isinstance(e, PublishSignal))
    assert (signal.actions, signal.change_strategy, signal.extra_params) == (("change_strategy",), strategy, "")


def dump_in_progress(participants: tuple[str, ...] = ("a", "b")) -> tuple[Recovery, float]:
    """A dump decided for rank 3 on n1 and rank 9 on n9, in a job of nodes n0..n2."""
    rec, now = walk("DECIDING", participants=participants, faults=(fault("f1", 3, "n1"), fault("f2", 9, "n9")))
    rec, _ = apply(rec, DecisionMade(rec.epoch, "dump", ("cheapest left",), nodes=("n2", "n0", "n1")), now)
    assert rec.phase is Phase.RECOVERING and rec.strategy == "dump" and rec.command_nodes == frozenset()
    assert rec.job_nodes == ("n0", "n1", "n2")
    return rec, now


def test_saved_dump_is_followed_by_exit_of_every_rank_in_a_new_round() -> None:
    """upstream's dump_exit: once every client saved its checkpoint, every rank restarts."""
    rec, now = dump_in_progress()
    dump_epoch, dump_seq = rec.epoch, rec.command_seq
    rec, effects = apply(rec, RecoverStatusReported(dump_epoch, "a", 0, "dump"), now + 1)
    assert (rec.phase, rec.epoch, rec.reported, effects) == (Phase.RECOVERING, dump_epoch, {"a"}, [])
    rec, effects = apply(rec, RecoverStatusReported(dump_epoch, "b", 0, "dump"), now + 2)
    assert rec.phase is Phase.RECOVERING and rec.strategy == "exit"
    assert rec.epoch == dump_epoch + 1 and rec.reported == frozenset()
    assert rec.phase_log[-2:] == ((Phase.RECOVERING, now, dump_epoch), (Phase.RECOVERING, now + 2, dump_epoch + 1))
    assert rec.deadline_at == now + 2 + T.recover_s
    assert rec.decision_reasons == ("dump saved; exit restarts every rank (dump_exit)",)
    assert non_emit(effects) == [
        RecordOutcome("dump", (3, 9), ok=True),
        PublishSignal("changeStrategy", ("change_strategy",), ((3, "1"), (9, "1")), "exit", "dump_exit"),
        SendCommand("n0", "RESTART_ALL", (), dump_seq + 1, "exit"),
        SendCommand("n1", "RESTART_ALL", (), dump_seq + 2, "exit"),
        SendCommand("n2", "RESTART_ALL", (), dump_seq + 3, "exit"),
        SendCommand("n9", "RESTART_ALL", (), dump_seq + 4, "exit"),
    ]
    assert reasons(effects) == ["dump_saved", "strategy_decided"]
    assert rec.command_seq == dump_seq + 4 and rec.command_nodes == {"n0", "n1", "n2", "n9"}
    # The dump's answers are not taken for the restart's: they name the old epoch.
    with pytest.raises(StaleEpoch):
        apply(rec, RecoverStatusReported(dump_epoch, "a", 0, "dump"), now + 3)
    # The exit completes like any exit: the participants and every restarted node's agent confirm.
    rec = confirm_commands(rec, now + 3)
    rec, effects = apply(rec, RecoverStatusReported(rec.epoch, "a", 0, "exit"), now + 3)
    assert rec.phase is Phase.RECOVERING and effects == []
    rec, effects = apply(rec, RecoverStatusReported(rec.epoch, "b", 0, "exit"), now + 4)
    assert rec.phase is Phase.DONE and rec.outcome == "succeeded"
    assert non_emit(effects) == [RecordOutcome("exit", (3, 9), ok=True)]


def test_saved_dump_completed_by_losing_the_last_participant_also_exits() -> None:
    rec, now = dump_in_progress()
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "a", 0, "dump"), now + 1)
    rec, effects = apply(rec, ParticipantsChanged(frozenset({"a"})), now + 2)
    assert rec.phase is Phase.RECOVERING and rec.strategy == "exit" and rec.participants == {"a"}
    assert non_emit(effects)[0] == RecordOutcome("dump", (3, 9), ok=True)
    assert [c.node for c in effects if isinstance(c, SendCommand)] == ["n0", "n1", "n2", "n9"]


def test_exit_after_a_dump_that_fails_fails_the_job() -> None:
    rec, now = dump_in_progress(participants=("a",))
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "a", 0, "dump"), now + 1)
    assert rec.strategy == "exit"
    rec, effects = apply(rec, RecoverStatusReported(rec.epoch, "agent.n2", 1, "exit", "boom"), now + 2)
    assert rec.phase is Phase.FAILED
    assert non_emit(effects)[:2] == [RecordOutcome("exit", (3, 9), ok=False), PublishSignal("killMaster", ())]
    assert FinishJob(succeeded=False, reason="exit failed: agent.n2 reported code 1: boom") in effects


def test_exit_after_a_dump_not_confirmed_in_time_fails_the_job() -> None:
    rec, now = dump_in_progress(participants=("a",))
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "a", 0, "dump"), now + 1)
    assert rec.deadline_at is not None
    rec, _ = apply(rec, DeadlinePassed(rec.epoch), rec.deadline_at)
    assert rec.phase is Phase.FAILED and rec.outcome.startswith("failed: exit failed: exit not confirmed in time")


def test_failed_dump_falls_back_to_deciding() -> None:
    """A dump that could not save (407) is recorded failed; the selector then picks exit."""
    rec, now = dump_in_progress()
    dump_epoch = rec.epoch
    rec, effects = apply(rec, RecoverStatusReported(dump_epoch, "a", 407, "dump", "save failed"), now + 1)
    assert rec.phase is Phase.DECIDING and rec.epoch == dump_epoch + 1 and rec.strategy == ""
    assert rec.failed_strategies == (("dump", "a reported code 407: save failed"),)
    assert non_emit(effects) == [RecordOutcome("dump", (3, 9), ok=False)]
    assert [e for e in effects if isinstance(e, SendCommand)] == []


@pytest.mark.parametrize(
    ("code", "also"),
    [(405, ()), (406, ("retry", "recover-in-place", "recover", "elastic-training")), (407, ()),
     (499, ("retry", "recover-in-place", "recover", "elastic-training", "dump")),
     (201, ("retry", "recover-in-place", "recover", "elastic-training", "dump"))],
)  # fmt: skip
def test_recover_status_codes_rule_out_what_upstream_says(code: int, also: tuple[str, ...]) -> None:
    rec, now = walk("DECIDING", participants=("a",))
    rec, _ = apply(rec, DecisionMade(rec.epoch, "retry"), now)
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "a", code, "retry", "boom"), now + 1)
    assert rec.phase is Phase.DECIDING
    assert [name for name, _ in rec.failed_strategies] == ["retry", *[s for s in also if s != "retry"]]


def test_stop_complete_404_fails_the_job() -> None:
    rec, now = walk("STOPPING", participants=("a",))
    rec, effects = apply(rec, StopCompleted(rec.epoch, "a", 404), now)
    assert rec.phase is Phase.FAILED
    assert any(isinstance(e, FinishJob) and not e.succeeded and "404" in e.reason for e in effects)


@pytest.mark.parametrize(
    ("strategy", "wire"),
    [
        ("recover-in-place", ("recover", "recover-in-place", ("fault_nodes_restart",))),
        ("elastic-training", ("downgrade", '{"scale-in-strategy": "DP"}', ())),
        ("retry", ("retry", "", ())),
        ("recover", ("recover", "", ())),
        ("dump", ("dump", "", ())),
        ("exit", ("exit", "", ())),
    ],
)
def test_wire_strategy(strategy: str, wire: tuple[str, str, tuple[str, ...]]) -> None:
    assert wire_strategy(strategy) == wire
    rec, now = walk("DECIDING")
    moves = (("n1", "s0"),) if strategy == "recover" else ()
    _, effects = apply(rec, DecisionMade(rec.epoch, strategy, moves=moves), now)
    signal = next(e for e in effects if isinstance(e, PublishSignal))
    assert (signal.change_strategy, signal.extra_params, signal.actions) == (
        wire[0],
        wire[1],
        ("change_strategy", *wire[2]),
    )


# ============================================================ 3. waiting phases need everyone


def report_for(phase: Phase, rec: Recovery, who: str) -> object:
    if phase is Phase.STOPPING:
        return StopCompleted(rec.epoch, who)
    if phase is Phase.GLOBAL_FAULT:
        return StrategiesReported(rec.epoch, who, ALL_STRATEGIES)
    return RecoverStatusReported(rec.epoch, who, 0, rec.strategy)


NEXT = {Phase.STOPPING: Phase.GLOBAL_FAULT, Phase.GLOBAL_FAULT: Phase.DECIDING, Phase.RECOVERING: Phase.DONE}


@pytest.mark.parametrize("phase", WAITING, ids=str)
def test_waiting_phase_needs_every_participant(phase: Phase) -> None:
    rec, now = walk(phase.name, participants=("a", "b"))
    assert rec.reported == frozenset()
    if phase is Phase.RECOVERING:
        # The commanded node's agent is required too; its answer alone finishes nothing.
        rec, effects = apply(rec, report_for(phase, rec, "agent.n1"), now)
        assert (rec.phase, rec.reported, effects) == (phase, {"agent.n1"}, [])
    before = rec.reported

    one, effects = apply(rec, report_for(phase, rec, "a"), now + 0.1)
    assert (one.phase, one.epoch, one.reported, effects) == (phase, rec.epoch, before | {"a"}, [])
    assert one.deadline_at == rec.deadline_at and one.phase_log == rec.phase_log

    again, effects = apply(one, report_for(phase, one, "a"), now + 0.2)
    assert again is one and effects == []

    stranger, effects = apply(one, report_for(phase, one, "z"), now + 0.2)
    assert stranger is one and effects == []

    two, effects = apply(one, report_for(phase, one, "b"), now + 0.3)
    assert two.phase is NEXT[phase] and two.epoch == rec.epoch and two.reported == frozenset()
    assert two.phase_log[-1] == (NEXT[phase], now + 0.3, rec.epoch)
    assert effects or NEXT[phase] is Phase.DECIDING


@pytest.mark.parametrize("phase", WAITING, ids=str)
def test_non_participant_report_before_anyone_changes_nothing(phase: Phase) -> None:
    rec, now = walk(phase.name, participants=("a",))
    new, effects = apply(rec, report_for(phase, rec, "z"), now)
    assert new is rec and effects == []


# ============================================================ 4. deadlines


DEADLINE_PHASES = (Phase.COLLECTING, Phase.STOPPING, Phase.GLOBAL_FAULT, Phase.DECIDING, Phase.RECOVERING)


@pytest.mark.parametrize("phase", DEADLINE_PHASES, ids=str)
def test_deadline_is_now_plus_phase_timeout_and_not_early(phase: Phase) -> None:
    rec, _ = walk(phase.name)
    entered_at = rec.phase_log[-1][1]
    assert rec.deadline_at == entered_at + T.for_phase(phase)
    for early in (entered_at, rec.deadline_at - 1e-6):
        new, effects = apply(rec, DeadlinePassed(rec.epoch), early)
        assert new is rec and effects == []


def test_timeouts_for_phase() -> None:
    assert [T.for_phase(p) for p in Phase] == [1.0, 2.0, 3.0, 4.0, 5.0, None, None]
    assert list(Phase)[-2:] == [Phase.DONE, Phase.FAILED]


def test_collecting_deadline_starts_stopping() -> None:
    rec, _ = walk("COLLECTING", faults=(fault("f1", 3), fault("f2", 1, fault_type="0")))
    now = rec.deadline_at + 0.5
    new, effects = apply(rec, DeadlinePassed(rec.epoch), now)
    assert (new.phase, new.epoch, new.deadline_at) == (Phase.STOPPING, rec.epoch, now + T.stop_s)
    assert effects == [PublishSignal("stopTrain", ("stop_train",), ((1, "0"), (3, "1")))]


@pytest.mark.parametrize("phase", [Phase.STOPPING, Phase.GLOBAL_FAULT], ids=str)
def test_stop_or_strategies_deadline_leaves_only_exit(phase: Phase) -> None:
    rec, _ = walk(phase.name, participants=("a", "b"))
    rec, _ = apply(rec, report_for(phase, rec, "a"), rec.deadline_at - 0.5)
    now = rec.deadline_at
    new, effects = apply(rec, DeadlinePassed(rec.epoch), now)
    assert (new.phase, new.epoch, new.deadline_at) == (Phase.DECIDING, rec.epoch + 1, now + T.decide_s)
    assert tuple(name for name, _ in new.failed_strategies) == CHEAPER_THAN_EXIT
    assert all("deadline" in why and "'b'" in why for _, why in new.failed_strategies)
    assert reasons(effects) == ["escalated"] and non_emit(effects) == []
    assert new.phase_log[-1] == (Phase.DECIDING, now, rec.epoch + 1)


def test_deciding_deadline_applies_exit() -> None:
    rec, _ = walk("DECIDING", faults=(fault("f1", 3, "n1"), fault("f2", 4, "n2")))
    now = rec.deadline_at + 1
    # Without the job's nodes, exit still restarts every node that holds a fault.
    new, effects = apply(rec, DeadlinePassed(rec.epoch), now)
    assert (new.phase, new.epoch, new.strategy) == (Phase.RECOVERING, rec.epoch, "exit")
    assert new.deadline_at == now + T.recover_s
    assert "exit" in new.decision_reasons[0]
    assert [e for e in effects if isinstance(e, SendCommand)] == [
        SendCommand("n1", "RESTART_ALL", (), 1, "exit"),
        SendCommand("n2", "RESTART_ALL", (), 2, "exit"),
    ]


def test_deciding_deadline_exit_restarts_every_job_node_and_every_fault_node() -> None:
    rec, _ = walk("DECIDING", faults=(fault("f1", 3, "n1"), fault("f2", 9, "n9")))
    now = rec.deadline_at
    new, effects = apply(rec, DeadlinePassed(rec.epoch, nodes=("n2", "n0", "n1")), now)
    assert (new.phase, new.epoch, new.strategy, new.command_seq) == (Phase.RECOVERING, rec.epoch, "exit", 4)
    assert non_emit(effects) == [
        PublishSignal("changeStrategy", ("change_strategy",), ((3, "1"), (9, "1")), "exit", ""),
        SendCommand("n0", "RESTART_ALL", (), 1, "exit"),
        SendCommand("n1", "RESTART_ALL", (), 2, "exit"),
        SendCommand("n2", "RESTART_ALL", (), 3, "exit"),
        SendCommand("n9", "RESTART_ALL", (), 4, "exit"),
    ]
    assert reasons(effects) == ["strategy_decided"]


@pytest.mark.parametrize("phase", [Phase.COLLECTING, Phase.STOPPING, Phase.GLOBAL_FAULT, Phase.RECOVERING], ids=str)
def test_deadline_nodes_matter_only_for_the_deciding_deadline(phase: Phase) -> None:
    rec, _ = walk(phase.name)
    plain = apply(rec, DeadlinePassed(rec.epoch), rec.deadline_at)
    with_nodes = apply(rec, DeadlinePassed(rec.epoch, nodes=("n0", "n5")), rec.deadline_at)
    assert with_nodes == plain
    assert not any(isinstance(e, SendCommand) for e in with_nodes[1])


def test_recovering_deadline_fails_the_strategy_and_decides_again() -> None:
    rec, _ = walk("RECOVERING", participants=("a", "b"))
    now = rec.deadline_at
    new, effects = apply(rec, DeadlinePassed(rec.epoch), now)
    assert (new.phase, new.epoch, new.deadline_at) == (Phase.DECIDING, rec.epoch + 1, now + T.decide_s)
    assert new.strategy == ""  # recorded as failed; no strategy is in progress while deciding
    assert [name for name, _ in new.failed_strategies] == ["recover-in-place"]
    # The message names everyone required who did not answer: participants and commanded agents.
    assert new.failed_strategies[0][1] == "recover-in-place not confirmed in time by ['a', 'agent.n1', 'b']"
    assert non_emit(effects) == [RecordOutcome("recover-in-place", (3,), ok=False)]
    assert reasons(effects) == ["strategy_failed"]


def test_recovering_exit_deadline_fails_the_job() -> None:
    rec, now = walk("DECIDING")
    rec, _ = apply(rec, DecisionMade(rec.epoch, "exit", nodes=("n0",)), now)
    now = rec.deadline_at + 3
    new, effects = apply(rec, DeadlinePassed(rec.epoch), now)
    assert (new.phase, new.epoch, new.deadline_at) == (Phase.FAILED, rec.epoch, None)
    assert new.outcome.startswith("failed: exit failed")
    assert non_emit(effects) == [
        RecordOutcome("exit", (3,), ok=False),
        PublishSignal("killMaster", ()),
        FinishJob(succeeded=False, reason=new.outcome.removeprefix("failed: ")),
    ]
    assert reasons(effects) == ["job_failed"]
    assert new.phase_log[-1] == (Phase.FAILED, now, rec.epoch)


def test_default_timeouts_are_used_without_an_argument() -> None:
    rec, _ = step(Recovery(), FaultReported(fault(), frozenset({"a"})), 10.0)
    assert rec.deadline_at == 10.0 + Timeouts().fault_settle_s


# ============================================================ 5. merged faults


def test_second_fault_in_collecting_is_merged_in_the_same_epoch() -> None:
    rec, now = walk("COLLECTING")
    new, effects = apply(rec, FaultReported(fault("f2", rank=1, node="n0")), now + 0.1)
    assert (new.phase, new.epoch, new.recovery_id) == (Phase.COLLECTING, rec.epoch, rec.recovery_id)
    assert new.faults == (*rec.faults, fault("f2", rank=1, node="n0"))
    assert new.fault_ranks == (1, 3)
    assert new.deadline_at == rec.deadline_at and new.phase_log == rec.phase_log  # the window is not extended
    assert reasons(effects) == ["fault_merged"] and non_emit(effects) == []


@pytest.mark.parametrize("phase", ROUND_RESTART_PHASES, ids=str)
def test_late_fault_restarts_the_round(phase: Phase) -> None:
    rec, now = walk(phase.name, participants=("a", "b"))
    if phase in WAITING:
        rec, _ = apply(rec, report_for(phase, rec, "a"), now)
    now += 0.25
    new, effects = apply(rec, FaultReported(fault("f2", rank=0, node="n0", fault_type="0")), now)
    assert (new.phase, new.epoch, new.recovery_id) == (Phase.STOPPING, rec.epoch + 1, rec.recovery_id)
    assert new.faults == (fault(), fault("f2", rank=0, node="n0", fault_type="0"))
    assert (new.reported, new.supported, new.strategy) == (frozenset(), None, "")
    assert new.deadline_at == now + T.stop_s and new.phase_log[-1] == (Phase.STOPPING, now, rec.epoch + 1)
    assert new.command_seq == rec.command_seq and new.failed_strategies == rec.failed_strategies
    assert reasons(effects) == ["fault_merged"]
    # A strategy interrupted in RECOVERING (its commands already carried out) counts for the budgets.
    interrupted = [RecordOutcome(rec.strategy, rec.fault_ranks, ok=False)] if phase is Phase.RECOVERING else []
    assert non_emit(effects) == [*interrupted, PublishSignal("stopTrain", ("stop_train",), ((0, "0"), (3, "1")))]
    # The old epoch's answers are now stale.
    with pytest.raises(StaleEpoch):
        apply(new, StopCompleted(rec.epoch, "b"), now)


@pytest.mark.parametrize("phase", (Phase.COLLECTING, *ROUND_RESTART_PHASES), ids=str)
def test_repeated_fault_id_is_ignored(phase: Phase) -> None:
    rec, now = walk(phase.name)
    for replay in (fault(), dataclasses.replace(fault(), rank=99, detail="same id, other body")):
        new, effects = apply(rec, FaultReported(replay, frozenset({"q"})), now + 1)
        assert new is rec and effects == []


def test_fault_wire_keeps_the_non_retryable_type_per_rank() -> None:
    for types, expected in [(("0", "1"), "1"), (("1", "0"), "1"), (("1", "1"), "1"), (("0", "0"), "0")]:
        faults = (fault("f1", 2, fault_type=types[0]), fault("f2", 2, fault_type=types[1]))
        rec, _ = walk("COLLECTING", faults=faults)
        _, effects = apply(rec, DeadlinePassed(rec.epoch), rec.deadline_at)
        assert effects == [PublishSignal("stopTrain", ("stop_train",), ((2, expected),))]


def test_merged_round_can_complete_with_all_faults() -> None:
    rec, now = walk("RECOVERING")
    rec, _ = apply(rec, FaultReported(fault("f2", rank=6, node="n2")), now)
    rec, _ = apply(rec, StopCompleted(rec.epoch, "a"), now)
    rec, _ = apply(rec, StrategiesReported(rec.epoch, "a", ("recover-in-place",)), now)
    rec, effects = apply(rec, DecisionMade(rec.epoch, "recover-in-place"), now)
    assert [e for e in effects if isinstance(e, SendCommand)] == [
        SendCommand("n1", "RESTART_RANKS", (3,), 2, "recover-in-place"),
        SendCommand("n2", "RESTART_RANKS", (6,), 3, "recover-in-place"),
    ]
    assert rec.command_nodes == {"n1", "n2"}
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "a", 0), now)
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "agent.n2", 0), now)
    assert rec.phase is Phase.RECOVERING and rec.reported == {"a", "agent.n2"}
    rec, effects = apply(rec, RecoverStatusReported(rec.epoch, "agent.n1", 0), now)
    assert rec.phase is Phase.DONE and rec.epoch == 2
    assert non_emit(effects) == [RecordOutcome("recover-in-place", (3, 6), ok=True)]


# ============================================================ 6. stale epochs


def epoch_events(epoch: int) -> list[object]:
    return [
        StopCompleted(epoch, "a"),
        StrategiesReported(epoch, "a", ALL_STRATEGIES),
        DecisionMade(epoch, "retry"),
        RecoverStatusReported(epoch, "a", 0),
        DeadlinePassed(epoch),
        CommandedNodeLost(epoch, frozenset({"n1"})),
    ]


STALE_CASES = [
    (s, type(e))
    for s in ("COLLECTING", *[p.name for p in ROUND_RESTART_PHASES])
    for e in epoch_events(0)
    if (Phase[s], type(e)) in TRANSITIONS
]


@pytest.mark.parametrize(("state", "event_type"), STALE_CASES, ids=[f"{s}-{e.__name__}" for s, e in STALE_CASES])
@pytest.mark.parametrize("delta", [-1, +1, -5])
def test_stale_epoch_raises_and_changes_nothing(state: str, event_type: type, delta: int) -> None:
    # A second recovery puts the record at epoch 2, so epoch 1 is a real earlier epoch.
    rec, now = walk(state, start=walk("DONE"))
    assert rec.epoch == 2
    event = next(e for e in epoch_events(rec.epoch + delta) if type(e) is event_type)
    before = copy.deepcopy(rec)
    with pytest.raises(StaleEpoch) as info:
        apply(rec, event, now + 1000)
    assert info.value.reason == "stale_epoch"
    assert f"current epoch is {rec.epoch}" in str(info.value)
    assert rec == before


def test_stale_epoch_cases_cover_each_epoch_carrying_pair() -> None:
    epoch_types = {type(e) for e in epoch_events(0)}
    assert {(p, e) for p, e in TRANSITIONS if e in epoch_types} == {(Phase[s], e) for s, e in STALE_CASES}


# ============================================================ 7. non-zero codes and give-up


def test_stop_failure_escalates_to_exit_only() -> None:
    rec, now = walk("STOPPING", participants=("a", "b"))
    new, effects = apply(rec, StopCompleted(rec.epoch, "b", code=2), now + 0.5)
    assert (new.phase, new.epoch, new.deadline_at) == (Phase.DECIDING, rec.epoch + 1, now + 0.5 + T.decide_s)
    assert tuple(n for n, _ in new.failed_strategies) == CHEAPER_THAN_EXIT
    assert all("b could not stop (code 2)" in why for _, why in new.failed_strategies)
    assert reasons(effects) == ["escalated"] and non_emit(effects) == []


def test_escalation_does_not_list_an_already_failed_strategy_twice() -> None:
    rec, now = walk("RECOVERING")
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "a", 1, message="oom"), now)
    assert [n for n, _ in rec.failed_strategies] == ["recover-in-place"]
    rec, _ = apply(rec, FaultReported(fault("f2", 1, "n0")), now)
    rec, _ = apply(rec, StopCompleted(rec.epoch, "a", code=9), now)
    names = [n for n, _ in rec.failed_strategies]
    assert sorted(names) == sorted(CHEAPER_THAN_EXIT) and len(names) == len(set(names))
    assert rec.failed_strategies[0] == ("recover-in-place", "a reported code 1: oom")


def test_recover_failure_falls_back_to_deciding() -> None:
    rec, now = walk("RECOVERING", participants=("a", "b"))
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "a", 0), now)
    new, effects = apply(rec, RecoverStatusReported(rec.epoch, "b", 7, message="no spare device"), now + 1)
    assert (new.phase, new.epoch, new.reported, new.strategy) == (Phase.DECIDING, rec.epoch + 1, frozenset(), "")
    assert new.failed_strategies == (("recover-in-place", "b reported code 7: no spare device"),)
    assert non_emit(effects) == [RecordOutcome("recover-in-place", (3,), ok=False)]
    assert reasons(effects) == ["strategy_failed"]
    # The selector falls back a level: the next decision answers the new epoch.
    newer, effects = apply(new, DecisionMade(new.epoch, "exit", nodes=("n0",)), now + 2)
    assert newer.phase is Phase.RECOVERING and newer.strategy == "exit"
    assert [e.seq for e in effects if isinstance(e, SendCommand)] == [2, 3]


def test_recover_failure_message_may_be_empty() -> None:
    rec, now = walk("RECOVERING")
    new, _ = apply(rec, RecoverStatusReported(rec.epoch, "a", 1), now)
    assert new.failed_strategies == (("recover-in-place", "a reported code 1"),)


def test_exit_failure_fails_the_job() -> None:
    rec, now = walk("RECOVERING", strategy="exit")
    new, effects = apply(rec, RecoverStatusReported(rec.epoch, "a", 1, "exit", "cannot relaunch"), now)
    assert new.phase is Phase.FAILED and new.deadline_at is None
    assert [type(e) for e in effects] == [RecordOutcome, PublishSignal, FinishJob, EmitEvent]
    assert effects[1] == PublishSignal("killMaster", ())
    assert effects[2] == FinishJob(False, "exit failed: a reported code 1: cannot relaunch")


@pytest.mark.parametrize(
    "decision",
    [DecisionMade(1, "", ("nothing left",), give_up=True), DecisionMade(1, "retry", give_up=True), DecisionMade(1, "")],
    ids=["give-up", "give-up-with-strategy", "empty-strategy"],
)
def test_give_up_fails_the_job(decision: DecisionMade) -> None:
    rec, now = walk("DECIDING")
    assert rec.strategy == ""
    new, effects = apply(rec, decision, now)
    assert (new.phase, new.epoch, new.deadline_at) == (Phase.FAILED, rec.epoch, None)
    assert new.decision_reasons == decision.reasons
    why = "; ".join(decision.reasons) or "no strategy left"
    # No strategy was in progress, so there is no strategy outcome to record (the job's failure is
    # FinishJob's to record); in particular no RecordOutcome("none", ...) placeholder.
    assert non_emit(effects) == [
        PublishSignal("killMaster", ()),
        FinishJob(succeeded=False, reason=why),
    ]
    assert reasons(effects) == ["job_failed"]
    assert new.outcome == f"failed: {why}"


def test_give_up_after_a_failed_strategy_records_it_once() -> None:
    rec, now = walk("RECOVERING")
    rec, first = apply(rec, RecoverStatusReported(rec.epoch, "a", 1), now)
    assert (rec.phase, rec.strategy) == (Phase.DECIDING, "")
    assert [n for n, _ in rec.failed_strategies] == ["recover-in-place"]
    rec, second = apply(rec, DecisionMade(rec.epoch, "", ("nothing left",), give_up=True), now)
    assert rec.phase is Phase.FAILED
    assert [e for e in first if isinstance(e, RecordOutcome)] == [RecordOutcome("recover-in-place", (3,), ok=False)]
    assert non_emit(second) == [PublishSignal("killMaster", ()), FinishJob(succeeded=False, reason="nothing left")]


def test_give_up_after_a_failed_strategy_and_a_late_fault_records_nothing_more() -> None:
    rec, now = walk("RECOVERING")
    rec, first = apply(rec, RecoverStatusReported(rec.epoch, "a", 1), now)
    rec, _ = apply(rec, FaultReported(fault("f2", 1, "n0")), now)
    rec, _ = apply(rec, StopCompleted(rec.epoch, "a"), now)
    rec, _ = apply(rec, StrategiesReported(rec.epoch, "a", ALL_STRATEGIES), now)
    assert (rec.phase, rec.strategy) == (Phase.DECIDING, "")
    rec, second = apply(rec, DecisionMade(rec.epoch, "", give_up=True), now)
    assert rec.phase is Phase.FAILED
    assert [e for e in first + second if isinstance(e, RecordOutcome)] == [
        RecordOutcome("recover-in-place", (3,), ok=False)
    ]


# ============================================================ 8. participants change


@pytest.mark.parametrize("phase", WAITING, ids=str)
def test_losing_the_only_missing_participant_completes_the_phase(phase: Phase) -> None:
    rec, event, now = guarded_case(phase, ParticipantsChanged)
    new, effects = apply(rec, event, now)
    assert new.phase is NEXT[phase] and new.participants == {"a"}
    if phase is Phase.STOPPING:
        assert effects == [PublishSignal("globalFault", ("on_global_rank",), ((3, "1"),))]
    if phase is Phase.RECOVERING:
        assert non_emit(effects) == [RecordOutcome("recover-in-place", (3,), ok=True)]


@pytest.mark.parametrize("phase", WAITING, ids=str)
def test_joining_or_losing_an_unanswered_participant_keeps_waiting(phase: Phase) -> None:
    rec, now = walk(phase.name, participants=("a", "b", "c"))
    rec, _ = apply(rec, report_for(phase, rec, "a"), now)
    new, effects = apply(rec, ParticipantsChanged(frozenset({"b", "c", "d"})), now)
    assert (new.phase, new.participants, new.reported, effects) == (phase, {"b", "c", "d"}, frozenset(), [])
    assert new.deadline_at == rec.deadline_at and new.epoch == rec.epoch
    newer, _ = apply(new, ParticipantsChanged(frozenset({"b", "c"})), now)
    assert newer.phase is phase and newer.participants == {"b", "c"}


@pytest.mark.parametrize("state", ["DONE_INITIAL", "DONE"])
def test_participants_change_in_done_is_bookkeeping_only(state: str) -> None:
    rec, now = walk(state)
    new, effects = apply(rec, ParticipantsChanged(frozenset({"x", "y"})), now + 5)
    assert effects == [] and new.participants == {"x", "y"}
    assert dataclasses.replace(new, participants=rec.participants) == rec
    same, effects = apply(new, ParticipantsChanged(frozenset({"x", "y"})), now + 6)
    assert same is new and effects == []
    # The next recovery starts with the participants known in DONE when the fault names none.
    opened, _ = apply(new, FaultReported(fault("f9")), now + 7)
    assert opened.participants == {"x", "y"}


@pytest.mark.parametrize("phase", [Phase.COLLECTING, Phase.DECIDING], ids=str)
def test_participants_change_outside_waiting_phases_only_updates_the_set(phase: Phase) -> None:
    rec, now = walk(phase.name, participants=("a", "b"))
    new, effects = apply(rec, ParticipantsChanged(frozenset({"a"})), now)
    assert effects == [] and dataclasses.replace(new, participants=rec.participants) == rec


def test_fault_participants_replace_the_known_set_when_opening() -> None:
    rec, now = walk("DONE", participants=("a", "b"))
    opened, _ = apply(rec, FaultReported(fault("f9"), frozenset({"c"})), now)
    assert opened.participants == {"c"}


# ============================================================ 9. supported strategies


def test_supported_is_the_intersection_of_every_answer() -> None:
    rec, now = walk("GLOBAL_FAULT", participants=("a", "b", "c"))
    assert rec.supported is None
    rec, _ = apply(rec, StrategiesReported(rec.epoch, "a", ("retry", "recover-in-place", "exit")), now)
    assert rec.supported == {"retry", "recover-in-place", "exit"}
    rec, _ = apply(rec, StrategiesReported(rec.epoch, "z", ("dump",)), now)  # not a participant
    assert rec.supported == {"retry", "recover-in-place", "exit"}
    rec, _ = apply(rec, StrategiesReported(rec.epoch, "b", ("recover-in-place", "exit", "dump")), now)
    assert rec.supported == {"recover-in-place", "exit"}
    rec, _ = apply(rec, StrategiesReported(rec.epoch, "b", ("retry",)), now)  # duplicate: ignored
    assert rec.supported == {"recover-in-place", "exit"}
    rec, _ = apply(rec, StrategiesReported(rec.epoch, "c", ("exit", "recover-in-place", "elastic-training")), now)
    assert rec.phase is Phase.DECIDING and rec.supported == {"recover-in-place", "exit"}


def test_supported_may_become_empty_and_is_reset_by_a_new_round() -> None:
    rec, now = walk("GLOBAL_FAULT", participants=("a", "b"))
    rec, _ = apply(rec, StrategiesReported(rec.epoch, "a", ("retry",)), now)
    rec, _ = apply(rec, StrategiesReported(rec.epoch, "b", ("exit",)), now)
    assert rec.phase is Phase.DECIDING and rec.supported == frozenset()
    rec, _ = apply(rec, FaultReported(fault("f2", 1)), now)
    assert rec.supported is None


# ============================================================ 10. nobody left to answer


@pytest.mark.parametrize("phase", WAITING, ids=str)
def test_losing_every_participant_waits_for_the_deadline(phase: Phase) -> None:
    rec, now = walk(phase.name, participants=("a", "b"))
    rec, _ = apply(rec, report_for(phase, rec, "a"), now)
    new, effects = apply(rec, ParticipantsChanged(frozenset()), now + 0.1)
    # Nobody is left to answer, and that is not an answer: the phase keeps waiting.
    assert (new.phase, new.epoch, new.participants, new.reported, effects) == (
        phase,
        rec.epoch,
        frozenset(),
        frozenset(),
        [],
    )
    assert new.deadline_at == rec.deadline_at and new.phase_log == rec.phase_log
    # Reports from the departed change nothing.
    for who in ("a", "b"):
        same, effects = apply(new, report_for(phase, new, who), now + 0.2)
        assert same is new and effects == []
    if phase is Phase.RECOVERING:
        # The commanded agent is still required: its answer is recorded, but with no participant
        # left it does not finish the recovery.
        confirmed, effects = apply(new, report_for(phase, new, "agent.n1"), now + 0.2)
        assert (confirmed.phase, confirmed.reported, effects) == (phase, {"agent.n1"}, [])
    # The deadline escalates as for any unanswered phase.
    later, effects = apply(new, DeadlinePassed(new.epoch), new.deadline_at)
    assert (later.phase, later.epoch) == (Phase.DECIDING, new.epoch + 1)
    if phase is Phase.RECOVERING:
        assert later.failed_strategies == (
            ("recover-in-place", "recover-in-place not confirmed in time by ['agent.n1']"),
        )
        assert non_emit(effects) == [RecordOutcome("recover-in-place", (3,), ok=False)]
    else:
        assert tuple(n for n, _ in later.failed_strategies) == CHEAPER_THAN_EXIT
        assert reasons(effects) == ["escalated"] and non_emit(effects) == []


def test_losing_every_participant_in_recovering_is_not_a_successful_recovery() -> None:
    rec, now = walk("RECOVERING")
    new, effects = apply(rec, ParticipantsChanged(frozenset()), now)
    assert new.phase is Phase.RECOVERING and new.outcome == ""
    assert not any(isinstance(e, RecordOutcome) for e in effects)


@pytest.mark.parametrize("phase", WAITING, ids=str)
def test_a_participant_joining_an_empty_phase_must_answer_it(phase: Phase) -> None:
    rec, now = walk(phase.name, participants=("a",))
    rec, _ = apply(rec, ParticipantsChanged(frozenset()), now)
    joined, effects = apply(rec, ParticipantsChanged(frozenset({"c"})), now + 0.1)
    assert (joined.phase, joined.participants, joined.reported, effects) == (phase, {"c"}, frozenset(), [])
    done, effects = apply(joined, report_for(phase, joined, "c"), now + 0.2)
    if phase is Phase.RECOVERING:
        # The newcomer's answer is not enough: the commanded node's agent has not confirmed yet.
        assert (done.phase, done.reported, effects) == (phase, {"c"}, [])
        done, effects = apply(done, report_for(phase, done, "agent.n1"), now + 0.3)
    assert done.phase is NEXT[phase]
    if phase is Phase.RECOVERING:
        assert non_emit(effects) == [RecordOutcome("recover-in-place", (3,), ok=True)]


def test_a_recovery_opened_with_no_participants_waits_for_its_deadline() -> None:
    rec, now = walk("COLLECTING", participants=())
    assert rec.participants == frozenset()
    rec, _ = apply(rec, DeadlinePassed(rec.epoch), rec.deadline_at)
    assert rec.phase is Phase.STOPPING
    same, effects = apply(rec, ParticipantsChanged(frozenset()), now + 1.5)
    assert same is rec and effects == []
    new, effects = apply(rec, DeadlinePassed(rec.epoch), rec.deadline_at)
    assert new.phase is Phase.DECIDING and reasons(effects) == ["escalated"]


# ============================================================ 11. replayed faults after DONE


@pytest.mark.parametrize("state", ["DONE", "DONE_AFTER_MERGE"])
def test_replayed_fault_after_done_does_not_reopen(state: str) -> None:
    if state == "DONE":
        rec, now = walk("DONE")
    else:
        rec, now = walk("DONE", faults=(fault("f1"), fault("f2", 5, "n0")))
    for old in rec.faults:
        for replay in (old, dataclasses.replace(old, rank=99, detail="same id, other body")):
            new, effects = apply(rec, FaultReported(replay, frozenset({"q"})), now + 1)
            assert new is rec and effects == []


def test_a_new_fault_after_done_opens_the_next_recovery() -> None:
    rec, now = walk("DONE")
    new, effects = apply(rec, FaultReported(fault("f2")), now + 1)
    assert (new.phase, new.epoch, new.recovery_id) == (Phase.COLLECTING, rec.epoch + 1, rec.recovery_id + 1)
    assert new.faults == (fault("f2"),) and reasons(effects) == ["recovery_opened"]
    # Only the last recovery's fault ids are remembered: after the second one, "f1" is new again.
    second, now = walk("DONE", start=walk("DONE"))
    assert [f.fault_id for f in second.faults] == ["f2"] and second.recovery_id == 2
    reopened, _ = apply(second, FaultReported(fault("f1")), now + 1)
    assert (reopened.phase, reopened.recovery_id) == (Phase.COLLECTING, 3)


def test_walk_from_done_uses_a_fresh_fault_id() -> None:
    first, now = walk("DONE")
    second, _ = walk("COLLECTING", start=(first, now))
    assert [f.fault_id for f in first.faults] == ["f1"]
    assert [f.fault_id for f in second.faults] == ["f2"] and second.recovery_id == 2


# ============================================================ 12. reports that are not news


def not_news_report(phase: Phase, rec: Recovery, who: str, code: int) -> object:
    if phase is Phase.STOPPING:
        return StopCompleted(rec.epoch, who, code)
    if phase is Phase.GLOBAL_FAULT:
        return StrategiesReported(rec.epoch, who, () if code else ("dump",))
    return RecoverStatusReported(rec.epoch, who, code, rec.strategy, "late")


NOT_NEWS = [(p, c) for p in WAITING for c in (0, 1, 137)]


@pytest.mark.parametrize(("phase", "code"), NOT_NEWS, ids=[f"{p}-{c}" for p, c in NOT_NEWS])
def test_a_non_participant_report_changes_nothing_whatever_its_code(phase: Phase, code: int) -> None:
    rec, now = walk(phase.name, participants=("a", "b"))
    for state in (rec, apply(rec, report_for(phase, rec, "a"), now)[0]):
        new, effects = apply(state, not_news_report(phase, state, "z", code), now + 0.1)
        assert new is state and effects == []


@pytest.mark.parametrize(("phase", "code"), NOT_NEWS, ids=[f"{p}-{c}" for p, c in NOT_NEWS])
def test_a_second_answer_from_the_same_participant_changes_nothing_whatever_its_code(phase: Phase, code: int) -> None:
    rec, now = walk(phase.name, participants=("a", "b"))
    rec, _ = apply(rec, report_for(phase, rec, "a"), now)
    assert rec.reported == {"a"}
    new, effects = apply(rec, not_news_report(phase, rec, "a", code), now + 0.1)
    assert new is rec and effects == []


def test_non_participant_stop_failure_changes_nothing() -> None:
    rec, now = walk("STOPPING", participants=("a",))
    new, effects = apply(rec, StopCompleted(rec.epoch, "z", code=1), now)
    assert new is rec and effects == []


def test_non_participant_recover_failure_changes_nothing() -> None:
    rec, now = walk("RECOVERING", participants=("a",))
    new, effects = apply(rec, RecoverStatusReported(rec.epoch, "z", 1), now)
    assert new is rec and effects == []


def test_a_departed_participant_failure_changes_nothing() -> None:
    rec, now = walk("RECOVERING", participants=("a", "b"))
    rec, _ = apply(rec, ParticipantsChanged(frozenset({"a"})), now)
    new, effects = apply(rec, RecoverStatusReported(rec.epoch, "b", 1, rec.strategy, "gone"), now)
    assert new is rec and effects == []


# ============================================================ 13. commanded agents must confirm


def test_with_client_participants_the_commanded_agent_must_confirm_too() -> None:
    rec, now = walk("DECIDING", participants=("client.c1",))
    assert rec.command_nodes == frozenset()
    rec, effects = apply(rec, DecisionMade(rec.epoch, "recover-in-place", ("fits",), nodes=("n0", "n1")), now)
    assert rec.phase is Phase.RECOVERING
    assert [(e.node, e.ranks) for e in effects if isinstance(e, SendCommand)] == [("n1", (3,))]
    assert rec.command_nodes == {"n1"}

    # The client's status alone does not finish the recovery.
    rec, effects = apply(rec, RecoverStatusReported(rec.epoch, "client.c1", 0, "recover-in-place"), now + 0.1)
    assert (rec.phase, rec.reported, rec.outcome, effects) == (Phase.RECOVERING, {"client.c1"}, "", [])
    # An agent of a node that got no command is not asked; its report is not news.
    same, effects = apply(rec, RecoverStatusReported(rec.epoch, of_node("n0"), 0, "recover-in-place"), now + 0.2)
    assert same is rec and effects == []

    # The commanded node's agent confirms: done.
    done, effects = apply(rec, RecoverStatusReported(rec.epoch, of_node("n1"), 0, "recover-in-place"), now + 0.3)
    assert (done.phase, done.outcome, done.reported, done.command_nodes) == (
        Phase.DONE,
        "succeeded",
        frozenset(),
        frozenset(),
    )
    assert non_emit(effects) == [RecordOutcome("recover-in-place", (3,), ok=True)]
    assert reasons(effects) == ["recovery_done"]


def test_with_client_participants_the_agent_may_confirm_first() -> None:
    rec, now = walk("RECOVERING", participants=("client.c1",))
    rec, effects = apply(rec, RecoverStatusReported(rec.epoch, "agent.n1", 0, rec.strategy), now)
    assert (rec.phase, rec.reported, effects) == (Phase.RECOVERING, {"agent.n1"}, [])
    again, effects = apply(rec, RecoverStatusReported(rec.epoch, "agent.n1", 1, rec.strategy, "late"), now)
    assert again is rec and effects == []  # a second answer is not news, whatever its code
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "client.c1", 0, rec.strategy), now + 0.1)
    assert (rec.phase, rec.outcome) == (Phase.DONE, "succeeded")


def test_a_commanded_agent_that_is_not_a_participant_can_fail_the_strategy() -> None:
    rec, now = walk("RECOVERING", participants=("client.c1",))
    new, effects = apply(rec, RecoverStatusReported(rec.epoch, "agent.n1", 3, rec.strategy, "relaunch failed"), now)
    assert (new.phase, new.epoch, new.command_nodes) == (Phase.DECIDING, rec.epoch + 1, frozenset())
    assert new.failed_strategies == (("recover-in-place", "agent.n1 reported code 3: relaunch failed"),)
    assert non_emit(effects) == [RecordOutcome("recover-in-place", (3,), ok=False)]


@pytest.mark.parametrize("phase", [Phase.STOPPING, Phase.GLOBAL_FAULT], ids=str)
def test_agents_are_not_asked_outside_recovering_when_clients_participate(phase: Phase) -> None:
    rec, now = walk(phase.name, participants=("client.c1",))
    same, effects = apply(rec, report_for(phase, rec, "agent.n1"), now)
    assert same is rec and effects == []


def test_a_lost_commanded_node_leaves_only_the_deadline() -> None:
    rec, now = walk("RECOVERING", participants=("agent.n0", "agent.n1"))
    assert rec.command_nodes == {"n1"}
    # n1's agent is lost; n0's agent answers: everyone still a participant has answered, but the
    # command sent to n1 is unconfirmed, so the recovery is not done.
    rec, effects = apply(rec, ParticipantsChanged(frozenset({"agent.n0"})), now + 0.1)
    assert (rec.phase, rec.participants, effects) == (Phase.RECOVERING, {"agent.n0"}, [])
    rec, effects = apply(rec, RecoverStatusReported(rec.epoch, "agent.n0", 0, rec.strategy), now + 0.2)
    assert (rec.phase, rec.reported, rec.outcome, effects) == (Phase.RECOVERING, {"agent.n0"}, "", [])
    early, effects = apply(rec, DeadlinePassed(rec.epoch), rec.deadline_at - 0.01)
    assert early is rec and effects == []

    now = rec.deadline_at + 0.5
    new, effects = apply(rec, DeadlinePassed(rec.epoch), now)
    assert (new.phase, new.epoch, new.strategy, new.command_nodes) == (
        Phase.DECIDING,
        rec.epoch + 1,
        "",
        frozenset(),
    )
    assert new.failed_strategies == (("recover-in-place", "recover-in-place not confirmed in time by ['agent.n1']"),)
    assert non_emit(effects) == [RecordOutcome("recover-in-place", (3,), ok=False)]
    assert reasons(effects) == ["strategy_failed"]


def test_a_lost_commanded_agent_that_still_reports_is_news() -> None:
    rec, now = walk("RECOVERING", participants=("agent.n0", "agent.n1"))
    rec, _ = apply(rec, ParticipantsChanged(frozenset({"agent.n0"})), now)
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "agent.n0", 0, rec.strategy), now)
    # No longer a participant, but its node was commanded: its confirmation still counts.
    done, effects = apply(rec, RecoverStatusReported(rec.epoch, "agent.n1", 0, rec.strategy), now + 0.1)
    assert (done.phase, done.outcome) == (Phase.DONE, "succeeded")
    assert non_emit(effects) == [RecordOutcome("recover-in-place", (3,), ok=True)]


def test_participants_changed_keeps_the_commanded_agents_reports() -> None:
    rec, now = walk("RECOVERING", participants=("agent.n0", "agent.n1", "agent.n2"))
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "agent.n1", 0, rec.strategy), now)
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "agent.n2", 0, rec.strategy), now)
    # n1 (commanded) and n2 (not commanded) are lost after answering: only n1's answer is kept.
    rec, effects = apply(rec, ParticipantsChanged(frozenset({"agent.n0"})), now + 0.1)
    assert (rec.phase, rec.reported, effects) == (Phase.RECOVERING, {"agent.n1"}, [])
    done, _ = apply(rec, RecoverStatusReported(rec.epoch, "agent.n0", 0, rec.strategy), now + 0.2)
    assert done.phase is Phase.DONE


def test_losing_the_last_unanswered_participant_still_needs_the_commanded_agent() -> None:
    rec, now = walk("RECOVERING", participants=("client.c1", "client.c2"))
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "client.c1", 0, rec.strategy), now)
    rec, effects = apply(rec, ParticipantsChanged(frozenset({"client.c1"})), now + 0.1)
    assert (rec.phase, rec.reported, effects) == (Phase.RECOVERING, {"client.c1"}, [])
    done, effects = apply(rec, RecoverStatusReported(rec.epoch, "agent.n1", 0, rec.strategy), now + 0.2)
    assert done.phase is Phase.DONE


# A commanded node that dies before confirming fails the strategy at its lease's expiry (the shell
# sends CommandedNodeLost for every commanded node it does not see live), not at the deadline.

LOST_WHY = "commanded node(s) ['n1'] lost before confirming (lease expired)"


def test_a_commanded_node_lost_before_confirming_fails_the_strategy_at_once() -> None:
    rec, now = walk("RECOVERING", participants=("agent.n0", "agent.n1"))
    assert rec.command_nodes == {"n1"} and now + 0.1 < rec.deadline_at
    rec, _ = apply(rec, ParticipantsChanged(frozenset({"agent.n0"})), now + 0.1)  # the same pass, first
    new, effects = apply(rec, CommandedNodeLost(rec.epoch, frozenset({"n1"})), now + 0.1)
    assert (new.phase, new.epoch, new.strategy, new.command_nodes) == (
        Phase.DECIDING,
        rec.epoch + 1,
        "",
        frozenset(),
    )
    assert new.deadline_at == now + 0.1 + T.decide_s
    assert new.failed_strategies == (("recover-in-place", LOST_WHY),)
    assert non_emit(effects) == [RecordOutcome("recover-in-place", (3,), ok=False)]
    assert reasons(effects) == ["strategy_failed"]


def test_a_commanded_node_lost_during_an_exit_fails_the_job() -> None:
    rec, now = walk("RECOVERING", participants=("agent.n0",), strategy="exit", nodes=("n0", "n1"))
    new, effects = apply(rec, CommandedNodeLost(rec.epoch, frozenset({"n1"})), now + 0.1)
    assert new.phase is Phase.FAILED and new.outcome == f"failed: exit failed: {LOST_WHY}"
    assert FinishJob(succeeded=False, reason=f"exit failed: {LOST_WHY}") in effects
    assert PublishSignal("killMaster", ()) in effects


def test_the_spare_of_a_recover_lost_before_starting_the_ranks_fails_the_recover() -> None:
    rec, now = walk("DECIDING")  # rank 3 on n1 failed
    decision = DecisionMade(rec.epoch, "recover", ("spare",), nodes=("n0", "n1"), moves=(("n1", "s0"),), layout=LAYOUT)
    rec, _ = apply(rec, decision, now)
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "agent.n1", 0, "recover"), now)  # n1 released its ranks
    new, effects = apply(rec, CommandedNodeLost(rec.epoch, frozenset({"s0"})), now + 1)
    assert (new.phase, new.epoch) == (Phase.DECIDING, rec.epoch + 1)
    assert new.failed_strategies == (("recover", "commanded node(s) ['s0'] lost before confirming (lease expired)"),)
    assert non_emit(effects) == [RecordOutcome("recover", (2, 3), ok=False)]


@pytest.mark.parametrize(
    "nodes",
    [frozenset({"n0"}), frozenset({"n7"}), frozenset()],
    ids=["a node not commanded", "a stranger", "nobody"],
)
def test_losing_a_node_that_was_not_commanded_changes_nothing(nodes: frozenset[str]) -> None:
    rec, now = walk("RECOVERING", participants=("agent.n0", "agent.n1"))
    same, effects = apply(rec, CommandedNodeLost(rec.epoch, nodes), now)
    assert same is rec and effects == []


def test_a_commanded_node_lost_after_confirming_changes_nothing() -> None:
    # Its ranks, if they run, are lost-node faults of their own (the shell reports those first).
    rec, now = walk("RECOVERING", participants=("agent.n0", "agent.n1"))
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "agent.n1", 0, rec.strategy), now)
    same, effects = apply(rec, CommandedNodeLost(rec.epoch, frozenset({"n1"})), now + 0.1)
    assert same is rec and effects == []
    done, _ = apply(rec, RecoverStatusReported(rec.epoch, "agent.n0", 0, rec.strategy), now + 0.2)
    assert done.phase is Phase.DONE


def test_a_node_lost_before_it_was_commanded_is_awaited_until_the_deadline() -> None:
    """An `exit` commands every node still holding ranks, a lost one too: its agent may come back and
    carry the command out (docs/adr/0023), so its absence is not news, and the deadline decides."""
    lost = FaultInfo("lost.n1.r3.g0.c0", 3, "n1", source="lease", detected_at=T0)
    rec, now = walk("RECOVERING", participants=("agent.n0",), strategy="exit", faults=(lost,))
    assert rec.command_nodes == {"n0", "n1"}
    same, effects = apply(rec, CommandedNodeLost(rec.epoch, frozenset({"n1"})), now + 0.1)
    assert same is rec and effects == []
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "agent.n1", 0, "exit"), now + 1)  # it came back
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "agent.n0", 0, "exit"), now + 1)
    assert (rec.phase, rec.outcome) == (Phase.DONE, "succeeded")


def test_only_the_nodes_not_known_lost_count() -> None:
    lost = FaultInfo("lost.n1.r3.g0.c0", 3, "n1", source="lease", detected_at=T0)
    rec, now = walk("RECOVERING", participants=("agent.n0",), strategy="exit", faults=(lost,), nodes=("n0", "n2"))
    new, _ = apply(rec, CommandedNodeLost(rec.epoch, frozenset({"n1", "n2"})), now)
    assert new.phase is Phase.FAILED
    assert "commanded node(s) ['n2'] lost before confirming" in new.outcome


@pytest.mark.parametrize("state", STATES)
def test_command_nodes_are_empty_outside_recovering(state: str) -> None:
    rec, _ = walk(state, participants=("a", "b"))
    if rec.phase is Phase.RECOVERING:
        assert rec.command_nodes == {"n1"}
    else:
        assert rec.command_nodes == frozenset()


@pytest.mark.parametrize("strategy", ALL_STRATEGIES)
def test_command_nodes_are_the_nodes_sent_a_command(strategy: str) -> None:
    rec, now = walk("DECIDING", faults=(fault("f1", 3, "n1"), fault("f2", 4, "n3")))
    moves = (("n1", "s1"), ("n3", "s3")) if strategy == "recover" else ()
    new, effects = apply(rec, DecisionMade(rec.epoch, strategy, nodes=("n0", "n1", "n2"), moves=moves), now)
    sent = {e.node for e in effects if isinstance(e, SendCommand)}
    assert new.phase is Phase.RECOVERING and new.command_nodes == sent
    expected = {
        "exit": {"n0", "n1", "n2", "n3"},
        "retry": set(),
        "dump": set(),
        "recover": {"n1", "n3", "s1", "s3"},
    }.get(strategy, {"n1", "n3"})
    assert sent == expected


def test_command_nodes_of_the_deciding_deadline_exit() -> None:
    rec, _ = walk("DECIDING")
    new, effects = apply(rec, DeadlinePassed(rec.epoch, nodes=("n0", "n2")), rec.deadline_at)
    assert (new.phase, new.strategy) == (Phase.RECOVERING, "exit")
    assert new.command_nodes == {e.node for e in effects if isinstance(e, SendCommand)} == {"n0", "n1", "n2"}


def test_command_nodes_are_cleared_whenever_recovering_is_left() -> None:
    rec, now = walk("RECOVERING", strategy="exit", nodes=("n0", "n1", "n2"))
    assert rec.command_nodes == {"n0", "n1", "n2"}
    # A late fault restarts the round: the commands of the old round are no longer awaited.
    restarted, _ = apply(rec, FaultReported(fault("f2", 6, "n2")), now)
    assert (restarted.phase, restarted.command_nodes) == (Phase.STOPPING, frozenset())
    # A failed strategy goes back to DECIDING with none awaited; the next decision names its own.
    failed, _ = apply(rec, DeadlinePassed(rec.epoch), rec.deadline_at)
    assert (failed.phase, failed.command_nodes) == (Phase.FAILED, frozenset())  # exit failed
    rec, now = walk("RECOVERING", strategy="retry")
    back, _ = apply(rec, RecoverStatusReported(rec.epoch, "a", 1), now)
    assert (back.phase, back.command_nodes) == (Phase.DECIDING, frozenset())
    again, _ = apply(back, DecisionMade(back.epoch, "exit", nodes=("n0",)), now)
    assert again.command_nodes == {"n0", "n1"} and again.reported == frozenset()


def test_job_nodes_survive_the_stored_record() -> None:
    from recoverd.coordinator.codec import recovery_from_pb, recovery_to_pb

    rec, _ = dump_in_progress()
    back = recovery_from_pb(recovery_to_pb(rec))
    assert back.job_nodes == ("n0", "n1", "n2") and back == rec


# ============================================================ node-wide strategies: recover, downgrade, upgrade

LAYOUT = Layout(
    placement=(("n0", (0, 1)), ("n1", (2, 3))),
    live=frozenset({"n0", "n1", "s0"}),
    spares=("s0",),
)


def commands_of(effects: list[object]) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(e.node, e.action, e.ranks) for e in effects if isinstance(e, SendCommand)]


def test_recover_moves_every_rank_of_the_faulty_node_to_the_spare() -> None:
    rec, now = walk("DECIDING")  # rank 3 on n1 failed
    decision = DecisionMade(rec.epoch, "recover", ("spare",), nodes=("n0", "n1"), moves=(("n1", "s0"),), layout=LAYOUT)
    rec, effects = apply(rec, decision, now)
    # Node-wide expansion: rank 2 shares the faulty node, so it moves too.
    assert rec.fault_ranks == (2, 3)
    assert commands_of(effects) == [("s0", "START_RANKS", (2, 3)), ("n1", "RELEASE_RANKS", (2, 3))]
    assert rec.command_nodes == {"s0", "n1"}
    change = next(e for e in effects if isinstance(e, PublishSignal))
    assert (change.change_strategy, change.fault_ranks) == ("recover", ((2, "1"), (3, "1")))
    assert not any(isinstance(e, ForgetNode) for e in effects)
    # The spare's and the released node's agents confirm, then the participant: done.
    for who in ("agent.s0", "agent.n1"):
        rec, _ = apply(rec, RecoverStatusReported(rec.epoch, who, 0, "recover"), now)
    rec, effects = apply(rec, RecoverStatusReported(rec.epoch, "a", 0, "recover"), now)
    assert rec.phase is Phase.DONE
    assert RecordOutcome("recover", (2, 3), ok=True) in effects


def test_recover_of_a_lost_node_forgets_it() -> None:
    rec, now = walk("DECIDING")
    lost = dataclasses.replace(LAYOUT, live=frozenset({"n0", "s0"}))
    decision = DecisionMade(rec.epoch, "recover", (), nodes=("n0", "n1"), moves=(("n1", "s0"),), layout=lost)
    rec, effects = apply(rec, decision, now)
    # The lost node is told to give its ranks up (should its agent come back), but not awaited.
    assert commands_of(effects) == [("s0", "START_RANKS", (2, 3)), ("n1", "RELEASE_RANKS", (2, 3))]
    assert rec.command_nodes == {"s0"}
    assert ForgetNode("n1") in effects
    assert "n1" not in rec.job_nodes  # a later exit must not wait for the lost node's agent


def test_downgrade_releases_the_faulty_node_and_isolates_its_ranks() -> None:
    rec, now = walk("DECIDING")
    decision = DecisionMade(rec.epoch, "elastic-training", (), nodes=("n0", "n1"), layout=LAYOUT)
    rec, effects = apply(rec, decision, now)
    assert commands_of(effects) == [("n1", "RELEASE_RANKS", (2, 3))]
    assert rec.isolated == ((2, "n1"), (3, "n1"))
    change = next(e for e in effects if isinstance(e, PublishSignal))
    assert (change.change_strategy, change.extra_params) == ("downgrade", '{"scale-in-strategy": "DP"}')
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "agent.n1", 0), now)
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "a", 0), now)
    assert rec.phase is Phase.DONE and rec.isolated == ((2, "n1"), (3, "n1"))
    # The isolation outlives this recovery: the next one opens with it.
    later, _ = apply(rec, FaultReported(fault("f9", rank=1, node="n0"), frozenset({"a"})), now + 1)
    assert later.isolated == rec.isolated


def test_capacity_returned_brings_isolated_ranks_back_on_a_spare() -> None:
    rec, now = walk("DONE")
    rec = dataclasses.replace(rec, isolated=((2, "n1"), (3, "n1")))
    assert apply(rec, CapacityReturned(dataclasses.replace(LAYOUT, spares=())), now) == (rec, [])
    new, effects = apply(rec, CapacityReturned(LAYOUT), now + 1)
    assert (new.phase, new.strategy, new.epoch, new.recovery_id) == (
        Phase.RECOVERING,
        UPGRADE,
        rec.epoch + 1,
        rec.recovery_id + 1,
    )
    assert commands_of(effects) == [("s0", "START_RANKS", (2, 3))]
    assert new.isolated == () and new.fault_ranks == (2, 3)
    change = next(e for e in effects if isinstance(e, PublishSignal))
    assert (change.change_strategy, change.extra_params) == ("upgrade", '{"scale-out-strategy": "DP"}')
    new, _ = apply(new, RecoverStatusReported(new.epoch, "agent.s0", 0), now + 1)
    new, effects = apply(new, RecoverStatusReported(new.epoch, "a", 0), now + 1)
    assert new.phase is Phase.DONE
    assert RecordOutcome(UPGRADE, (2, 3), ok=True) in effects


def test_recover_without_a_live_spare_fails_the_job() -> None:
    rec, now = walk("DECIDING")
    gone = dataclasses.replace(LAYOUT, live=frozenset({"n0", "n1"}))
    decision = DecisionMade(rec.epoch, "recover", (), nodes=("n0", "n1"), moves=(("n1", "s0"),), layout=gone)
    rec, _ = apply(rec, decision, now)
    assert rec.phase is Phase.FAILED and "no live spare for node n1" in rec.outcome


def test_a_merged_round_commands_the_node_that_holds_the_rank_now() -> None:
    # Ranks 2 and 3 moved from n1 to s0; rank 3 fails again there: s0 restarts it, not n1.
    rec, now = walk("DECIDING")
    moved = Layout(placement=(("n0", (0, 1)), ("n1", ()), ("s0", (2, 3))), live=frozenset({"n0", "n1", "s0"}))
    rec, effects = apply(rec, DecisionMade(rec.epoch, "recover-in-place", (), nodes=("n0", "n1"), layout=moved), now)
    assert commands_of(effects) == [("s0", "RESTART_RANKS", (3,))]


def test_exit_sends_ranks_no_node_holds_home() -> None:
    # The spare died before it started ranks 2-3, which n1 had already released.
    rec, now = walk("DECIDING")
    layout = Layout(
        placement=(("n0", (0, 1)), ("n1", ())),
        live=frozenset({"n0", "n1"}),
        homes=((0, "n0"), (1, "n1")),
        world_size=4,
        nproc_per_node=2,
    )
    rec, effects = apply(rec, DecisionMade(rec.epoch, "exit", (), nodes=("n0", "n1"), layout=layout), now)
    assert commands_of(effects) == [("n0", "RESTART_ALL", ()), ("n1", "RESTART_ALL", (2, 3))]
    # With no home for them either, exit cannot restore the job: it fails rather than lose ranks.
    homeless = dataclasses.replace(layout, homes=((0, "n0"),))
    rec2, _ = walk("DECIDING")
    failed, _ = apply(rec2, DecisionMade(rec2.epoch, "exit", (), nodes=("n0",), layout=homeless), now)
    assert failed.phase is Phase.FAILED and "exit cannot restart ranks [2, 3]" in failed.outcome


def test_a_second_downgrade_of_the_same_ranks_isolates_them_once() -> None:
    rec, now = walk("DECIDING")
    rec = dataclasses.replace(rec, isolated=((2, "n1"), (3, "n1")))
    rec, _ = apply(rec, DecisionMade(rec.epoch, "elastic-training", (), nodes=("n0", "n1"), layout=LAYOUT), now)
    assert rec.isolated == ((2, "n1"), (3, "n1"))


def test_a_failed_upgrade_falls_back_to_the_selector() -> None:
    rec, now = walk("DONE")
    rec = dataclasses.replace(rec, isolated=((2, "n1"),))
    rec, _ = apply(rec, CapacityReturned(LAYOUT), now)
    rec, _ = apply(rec, RecoverStatusReported(rec.epoch, "agent.s0", 1, "", "could not start"), now)
    assert rec.phase is Phase.DECIDING
    assert rec.failed_strategies[-1][0] == UPGRADE


def test_exit_takes_isolated_ranks_back_where_their_agent_lives() -> None:
    rec, now = walk("DONE")
    rec = dataclasses.replace(rec, isolated=((2, "n1"), (3, "n1"), (5, "n2")))
    rec, now = walk("DECIDING", start=(rec, now), faults=(fault("f7", rank=0, node="n0"),))
    layout = dataclasses.replace(LAYOUT, live=frozenset({"n0", "n1"}))
    rec, effects = apply(rec, DecisionMade(rec.epoch, "exit", (), nodes=("n0", "n1"), layout=layout), now)
    assert commands_of(effects) == [("n0", "RESTART_ALL", ()), ("n1", "RESTART_ALL", (2, 3))]
    # n2 is gone: its rank stays isolated until a spare takes it.
    assert rec.isolated == ((5, "n2"),)


def test_faults_read_together_restart_the_round_once() -> None:
    """A lost node is 8 faults, a lease storm hundreds: one new round for all of them, not one per
    fault (each round is an epoch, a stopTrain signal listing every fault rank, and a record write)."""
    rec = Recovery(
        phase=Phase.RECOVERING, epoch=5, recovery_id=2, faults=(fault("f0", 0, "n0"),), strategy="exit",
        participants=frozenset({"agents"}),
    )  # fmt: skip
    lost = tuple(fault(f"lost.n1.r{r}", r, "n1") for r in range(8))
    new, effects = step(rec, FaultReported(lost[0], more=(*lost[1:], lost[0])), now=50.0)
    assert (new.phase, new.epoch) == (Phase.STOPPING, 6)
    assert [f.fault_id for f in new.faults] == ["f0", *(f.fault_id for f in lost)]
    assert [e for e in effects if isinstance(e, PublishSignal)] == [
        PublishSignal("stopTrain", ("stop_train",), tuple((r, "1") for r in range(8)))
    ]
    assert sum(isinstance(e, RecordOutcome) for e in effects) == 1
    # Opening a recovery with several faults collects them all, in the same epoch.
    opened, _ = step(Recovery(epoch=6), FaultReported(lost[0], more=lost[1:]), now=60.0)
    assert (opened.phase, opened.epoch, len(opened.faults)) == (Phase.COLLECTING, 7, 8)


def test_collecting_ends_when_the_faults_settle_within_the_window() -> None:
    """A burst is collected as it arrives; once quiet for fault_settle_s the recovery stops the
    ranks, without waiting out the window; a steady trickle is cut at the window."""
    timeouts = Timeouts(fault_window_s=0.2, fault_settle_s=0.03)
    rec, _ = step(Recovery(), FaultReported(fault("f1", 1), frozenset({"agents"})), 100.0, timeouts)
    assert rec.phase is Phase.COLLECTING and rec.deadline_at == pytest.approx(100.03)
    rec, _ = step(rec, FaultReported(fault("f2", 2)), 100.02, timeouts)  # in the burst: settles later
    assert rec.deadline_at == pytest.approx(100.05) and len(rec.faults) == 2
    for i, at in enumerate((100.04, 100.06, 100.08, 100.10, 100.12, 100.14, 100.16, 100.18), start=3):
        rec, _ = step(rec, FaultReported(fault(f"f{i}", i)), at, timeouts)
    assert rec.deadline_at == pytest.approx(100.2)  # the window caps a trickle
    rec, _ = step(rec, DeadlinePassed(rec.epoch), 100.2, timeouts)
    assert rec.phase is Phase.STOPPING and len(rec.faults) == 10
    whole, _ = step(
        Recovery(),
        FaultReported(fault("f1", 1), frozenset({"agents"})),
        100.0,
        Timeouts(fault_window_s=0.2, fault_settle_s=0),
    )
    assert whole.deadline_at == pytest.approx(100.2)  # --fault-settle 0: the whole window, as before
