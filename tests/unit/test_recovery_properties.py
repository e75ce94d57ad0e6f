"""Property tests of the recovery state machine: random event sequences keep its invariants.

Events are drawn against the current record (mostly its epoch, its participants and the agents of
its commanded nodes, sometimes stale epochs, strangers, repeated fault ids), so sequences get deep
into the walk instead of bouncing off IllegalTransition in DONE. The same generator runs under
Hypothesis (shrinking, edge cases) and under a seeded ``random.Random`` (to assert that every table entry is exercised).

Participants are drawn both as abstract names ("a", "b", like clients: the agents are then extra
reporters in RECOVERING) and as agents ("agent.n0", ...: a commanded node may then be lost).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recoverd.coordinator.effects import FinishJob, PublishSignal, RecordOutcome, SendCommand
from recoverd.coordinator.inputs import (
    CapacityReturned,
    CommandedNodeLost,
    DeadlinePassed,
    DecisionMade,
    FaultReported,
    ParticipantsChanged,
    RecoverStatusReported,
    StopCompleted,
    StrategiesReported,
)
from recoverd.coordinator.model import ACTIVE_PHASES, FaultInfo, Layout, Phase, Recovery, Timeouts
from recoverd.coordinator.recovery import TRANSITIONS, UPGRADE
from recoverd.coordinator.recovery import step as core_step
from recoverd.coordinator.wire import DUMP_EXIT
from recoverd.errors import IllegalTransition, StaleEpoch
from recoverd.participants import of_node
from recoverd.strategies import CHEAPER_THAN_EXIT

T = Timeouts(fault_window_s=0.5, stop_s=1.0, strategies_s=1.5, decide_s=2.0, recover_s=2.5)
PEOPLE = ("a", "b", "c", "agent.n0", "agent.n1")
GROUPS: tuple[frozenset[str], ...] = (
    frozenset(),
    frozenset("a"),
    frozenset("ab"),
    frozenset("abc"),
    frozenset("bc"),
    frozenset({"agent.n0", "agent.n1", "agent.n2"}),
    frozenset({"agent.n0", "agent.n1"}),
)
WAITING_PHASES = (Phase.STOPPING, Phase.GLOBAL_FAULT, Phase.RECOVERING)
#: The phase a waiting phase moves on to when everyone required answered (same epoch).
NEXT = {Phase.STOPPING: Phase.GLOBAL_FAULT, Phase.GLOBAL_FAULT: Phase.DECIDING, Phase.RECOVERING: Phase.DONE}
STRATEGIES = (*CHEAPER_THAN_EXIT, "exit")
OFFERS = (STRATEGIES, ("retry", "exit"), ("recover-in-place", "exit"), ("exit",), ())
NODE_SETS: tuple[tuple[str, ...], ...] = ((), ("n0",), ("n0", "n1", "n2", "n3"))
#: Phases in which no strategy is in progress (a failed one is recorded and cleared).
NO_STRATEGY_PHASES = frozenset({Phase.COLLECTING, Phase.STOPPING, Phase.GLOBAL_FAULT, Phase.DECIDING})
REPORTS = (StopCompleted, StrategiesReported, RecoverStatusReported)
KINDS = ("fault", "deadline", "stop", "strategies", "decision", "recover", "participants", "capacity")
#: The event that moves each phase on; drawn more often so sequences get deep (and come round again).
PROGRESS = {
    Phase.DONE: "fault",
    Phase.COLLECTING: "deadline",
    Phase.STOPPING: "stop",
    Phase.GLOBAL_FAULT: "strategies",
    Phase.DECIDING: "decision",
    Phase.RECOVERING: "recover",
    Phase.FAILED: "participants",
}

Pick = Callable[[Sequence[Any]], Any]


def commanded_agents(rec: Recovery) -> frozenset[str]:
    return frozenset(of_node(n) for n in rec.command_nodes)


def dump_exit(prev: Recovery, new: Recovery) -> bool:
    """The one step that stays in RECOVERING: a saved `dump` followed by its `exit` (a new round)."""
    return (
        prev.phase is Phase.RECOVERING
        and prev.strategy == "dump"
        and new.phase is Phase.RECOVERING
        and (new.epoch != prev.epoch)
    )


def required(rec: Recovery) -> frozenset[str]:
    """Who must answer ``rec``'s phase: the participants and, in RECOVERING, the commanded agents."""
    return rec.participants | commanded_agents(rec)


def draw_event(rec: Recovery, pick: Pick) -> tuple[object, bool, float]:
    """One event for ``rec``; returns (event, jump_to_deadline, dt)."""
    kind = pick((*KINDS, *[PROGRESS[rec.phase]] * 5))
    epoch = rec.epoch + pick((0, 0, 0, 0, 0, 0, 0, -1, 1))
    who = pick((*sorted(rec.participants) * 3, *sorted(commanded_agents(rec)) * 3, *PEOPLE, "stranger"))
    dt = pick((0.0, 0.01, 0.2, 0.7, 3.0))
    code = pick((0, 0, 0, 0, 0, 1, 137))
    if kind == "fault":
        info = FaultInfo(
            fault_id=f"f{pick(range(6))}",
            rank=pick(range(4)),
            node=pick(("n0", "n1", "n2")),
            fault_type=pick(("0", "1")),
            source=pick(("agent", "agent", "lease")),  # "lease": a node known lost before its command
        )
        return FaultReported(info, pick(GROUPS)), False, dt
    if kind == "deadline":
        return DeadlinePassed(epoch, pick(NODE_SETS)), pick((True, True, False)), dt
    if kind == "stop":
        return StopCompleted(epoch, who, code), False, dt
    if kind == "strategies":
        return StrategiesReported(epoch, who, pick(OFFERS)), False, dt
    if kind == "decision":
        strategy = pick((*STRATEGIES, "exit", ""))
        give_up = pick((False, False, False, False, False, True))
        nodes = pick(NODE_SETS)
        spares = tuple((n, f"spare-{n}") for n in sorted({f.node for f in rec.faults}))
        moves = pick((spares, spares, ())) if strategy == "recover" else ()
        return DecisionMade(epoch, strategy, ("drawn",), give_up, nodes, moves), False, dt
    if kind == "recover":
        return RecoverStatusReported(epoch, who, code, rec.strategy), False, dt
    if kind == "capacity":
        spares = pick(((), ("s0",), ("s0", "s1")))
        return CapacityReturned(Layout(live=frozenset({"n0", *spares}), spares=spares)), False, dt
    if rec.command_nodes and pick((False, False, True)):
        # What the shell sends after the participants changed when a commanded node's agent is gone
        # (sometimes naming nodes that do not count: not commanded, or strangers).
        commanded = sorted(rec.command_nodes)
        nodes = pick((frozenset(commanded), frozenset(commanded[:1]), frozenset({"n0", "n9"}), frozenset()))
        return CommandedNodeLost(epoch, nodes), False, dt
    # Sometimes every participant that has not answered yet is lost (the guard of a completion by
    # ParticipantsChanged, which random groups rarely hit once commanded agents must answer too).
    return ParticipantsChanged(pick((*GROUPS, rec.participants & rec.reported))), False, dt


class Checker:
    """Applies events and checks every invariant after each step; counts what it exercised."""

    def __init__(self) -> None:
        self.rec = Recovery()
        self.now = 1000.0
        self.last_seq = 0
        self.finished = 0
        self.taken: set[tuple[Phase, type, Phase]] = set()
        self.errors: set[type] = set()
        self.seen: set[str] = set()

    def feed(self, event: object, jump: bool, dt: float) -> None:
        prev = self.rec
        self.now += dt
        if jump and prev.deadline_at is not None:
            self.now = max(self.now, prev.deadline_at)
        now = self.now
        key = (prev.phase, type(event))
        try:
            new, effects = core_step(prev, event, now, T)  # type: ignore[arg-type]
        except IllegalTransition:
            assert key not in TRANSITIONS, f"{key} is in the table but was refused"
            self.errors.add(IllegalTransition)
            new, effects = prev, []
        except StaleEpoch:
            assert key in TRANSITIONS
            assert getattr(event, "epoch", prev.epoch) != prev.epoch
            self.errors.add(StaleEpoch)
            new, effects = prev, []
        else:
            assert key in TRANSITIONS, f"{key} is not in the table but was accepted"
            assert getattr(event, "epoch", prev.epoch) == prev.epoch
            self.taken.add((*key, new.phase))
        self.check(prev, new, effects, event, now)
        self.note(prev, new, effects, event)
        self.rec = new

    def note(self, prev: Recovery, new: Recovery, effects: list[object], event: object) -> None:
        """Name the cases the fixed rules are about, so seeded walks can show they reach them."""
        if isinstance(event, FaultReported) and prev.phase is Phase.DONE and new is prev and prev.faults:
            self.seen.add("replayed fault after DONE")
        if isinstance(event, (StopCompleted, RecoverStatusReported)) and event.code and new is prev:
            if prev.phase in (Phase.STOPPING, Phase.RECOVERING) and event.epoch == prev.epoch:
                self.seen.add("non-zero report that is not news")
        if isinstance(event, DeadlinePassed) and prev.phase is Phase.DECIDING and new is not prev and event.nodes:
            self.seen.add("deciding deadline with job nodes")
        if new.phase in (Phase.STOPPING, Phase.GLOBAL_FAULT, Phase.RECOVERING) and not new.participants:
            self.seen.add("waiting with no participant")
        if isinstance(event, DecisionMade) and new.phase is Phase.FAILED and prev.phase is not Phase.FAILED:
            self.seen.add("give-up")
        if prev.phase is Phase.RECOVERING and new.phase is Phase.FAILED:
            self.seen.add("exit failed")
            if [(p, e) for p, _, e in prev.phase_log[-2:]] == [
                (Phase.RECOVERING, prev.epoch - 1),
                (Phase.RECOVERING, prev.epoch),
            ]:
                self.seen.add("exit after dump failed")
        if dump_exit(prev, new):
            self.seen.add("dump saved, exit follows")
        if isinstance(event, RecoverStatusReported) and new is not prev and prev.phase is Phase.RECOVERING:
            if event.participant not in prev.participants:
                self.seen.add("a commanded agent that is not a participant answered")
        if new.phase is Phase.RECOVERING and new.participants and new.participants <= new.reported:
            self.seen.add("every participant answered, a commanded agent has not")
        if isinstance(event, ParticipantsChanged) and prev.phase is Phase.RECOVERING:
            if commanded_agents(prev) & prev.participants - event.participants:
                self.seen.add("a commanded agent was lost")
        if isinstance(event, DeadlinePassed) and prev.phase is Phase.RECOVERING and new is not prev:
            if commanded_agents(prev) - prev.participants - prev.reported:
                self.seen.add("recovering deadline waiting for a commanded agent")
        if isinstance(event, CommandedNodeLost) and prev.phase is Phase.RECOVERING and event.epoch == prev.epoch:
            if new is not prev:
                self.seen.add("a commanded node died before confirming")
            elif event.nodes & prev.command_nodes - {n for n in prev.command_nodes if of_node(n) in prev.reported}:
                self.seen.add("a commanded node known lost before its command is awaited")

    def check(self, prev: Recovery, new: Recovery, effects: list[object], event: object, now: float) -> None:
        key = (prev.phase, type(event))
        after_dump = dump_exit(prev, new)
        upgrade = prev.phase is Phase.DONE and new.phase is Phase.RECOVERING
        # Monotone counters.
        assert new.epoch >= prev.epoch
        assert new.recovery_id >= prev.recovery_id
        assert new.command_seq >= prev.command_seq
        # FAILED is terminal: nothing is ever accepted there.
        if prev.phase is Phase.FAILED:
            assert new is prev and effects == []
        # A step that changes nothing returns the same object and no effects (replays are harmless).
        if new == prev:
            assert new is prev, "an unchanged record must be returned as itself"
            assert effects == []
        # The phase entered is the table's target, or stays, or is a guard's failure branch.
        if new.phase is not prev.phase:
            assert new.phase in {TRANSITIONS[key], Phase.DECIDING, Phase.FAILED}
        # The only step that re-enters RECOVERING: everyone confirmed a `dump` (a report or a lost
        # participant completing the phase), and its `exit` follows in the next epoch.
        if prev.phase is Phase.RECOVERING and new.phase is Phase.RECOVERING and new.phase_log != prev.phase_log:
            assert after_dump
            assert isinstance(event, (RecoverStatusReported, ParticipantsChanged))
            assert new.strategy == "exit" and new.epoch == prev.epoch + 1
            assert new.recovery_id == prev.recovery_id and new.faults == prev.faults
        # Answers: only from those required (the participants, and in RECOVERING the agents of the
        # commanded nodes); commanded nodes are awaited only in RECOVERING.
        assert new.reported <= required(new)
        if new.phase not in WAITING_PHASES:
            assert new.reported == frozenset()
        if new.phase is not Phase.RECOVERING:
            assert new.command_nodes == frozenset()
        # Deadlines: armed in every active phase, none at rest.
        if new.phase in ACTIVE_PHASES:
            assert new.deadline_at is not None and new.deadline_at >= new.phase_log[-1][1]
        else:
            assert new.deadline_at is None
        if new.phase_log and new.phase_log != prev.phase_log:
            entered_at = new.phase_log[-1][1]
            assert entered_at == now
            limit = T.for_phase(new.phase)
            if new.phase is Phase.COLLECTING:
                assert new.deadline_at == T.collect_deadline(now, now)  # settles unless more faults come
            else:
                assert new.deadline_at == (None if limit is None else now + limit)
        if new.phase is Phase.COLLECTING:
            # The window caps how long faults are collected, however many keep coming.
            assert new.deadline_at is not None and new.deadline_at <= new.opened_at + T.fault_window_s + 1e-9
        # Phase log: ordered in time, ends with the current phase and epoch.
        if new == Recovery(participants=new.participants):
            assert new.phase_log == ()
        else:
            assert new.phase_log, new
            assert new.phase_log[-1][0] is new.phase and new.phase_log[-1][2] == new.epoch
            times = [t for _, t, _ in new.phase_log]
            assert times == sorted(times)
            epochs = [e for _, _, e in new.phase_log]
            assert epochs == sorted(epochs)
        # Active recoveries always hold at least one fault, each fault id once.
        if new.phase in ACTIVE_PHASES:
            assert new.faults
        ids = [f.fault_id for f in new.faults]
        assert len(ids) == len(set(ids))
        # Commands: only when entering RECOVERING, one per node, seqs strictly increasing forever.
        commands = [e for e in effects if isinstance(e, SendCommand)]
        entered_recovering = new.phase is Phase.RECOVERING and new.phase_log != prev.phase_log
        if commands:
            assert entered_recovering and (prev.phase is Phase.DECIDING or after_dump or upgrade)
            seqs = [c.seq for c in commands]
            assert seqs[0] > self.last_seq and seqs == sorted(set(seqs))
            assert seqs[-1] == new.command_seq
            self.last_seq = seqs[-1]
            assert len({c.node for c in commands}) == len(commands)
            assert {c.node for c in commands} >= {f.node for f in new.faults}
            assert all(c.strategy == new.strategy for c in commands)
        if entered_recovering:
            # retry and dump are carried out by the job itself: no process is restarted.
            assert bool(commands) == (new.strategy not in ("retry", "dump"))
            assert new.command_nodes == {c.node for c in commands}
        elif new.phase is Phase.RECOVERING:
            assert new.command_nodes == prev.command_nodes
        # changeStrategy goes out exactly when entering RECOVERING; after a dump it is dump_exit's.
        signals = [e for e in effects if isinstance(e, PublishSignal) and e.signal_type == "changeStrategy"]
        assert len(signals) == (1 if entered_recovering else 0)
        for signal in signals:
            assert (signal.extra_params == DUMP_EXIT) == after_dump
            if after_dump:
                assert signal.change_strategy == "exit"
        # The job is finished at most once, and only by entering FAILED.
        finishes = [e for e in effects if isinstance(e, FinishJob)]
        self.finished += len(finishes)
        assert self.finished <= 1
        if finishes:
            assert new.phase is Phase.FAILED and prev.phase is not Phase.FAILED
        if new.phase is Phase.FAILED and prev.phase is not Phase.FAILED:
            assert len(finishes) == 1
        # A new fault after COLLECTING restarts the round; a fault id the record already holds (in an
        # active phase, or the finished recovery's in DONE: a replay) changes nothing.
        event_type = key[1]
        if isinstance(event, FaultReported) and event.fault.fault_id in {f.fault_id for f in prev.faults}:
            assert new is prev and effects == []
        if event_type is FaultReported and prev.phase in ACTIVE_PHASES and new is not prev:
            if prev.phase is Phase.COLLECTING:
                settles = T.collect_deadline(prev.opened_at, now)  # quiet for fault_settle_s, within the window
                assert (new.phase, new.epoch, new.deadline_at) == (prev.phase, prev.epoch, settles)
            else:
                assert (new.phase, new.epoch, new.deadline_at) == (Phase.STOPPING, prev.epoch + 1, now + T.stop_s)
            assert new.faults[:-1] == prev.faults
        # Epoch bumps come with entering STOPPING or DECIDING (a new round) or opening a recovery.
        # ... or with a saved `dump`'s `exit` (RECOVERING again, a new round).
        if new.epoch != prev.epoch:
            assert new.epoch == prev.epoch + 1
            assert new.phase in (Phase.COLLECTING, Phase.STOPPING, Phase.DECIDING) or after_dump or upgrade
            assert (new.recovery_id == prev.recovery_id + 1) == (new.phase is Phase.COLLECTING or upgrade)
        # A report is news exactly when it comes from someone required who has not answered this
        # phase yet (in RECOVERING that includes a commanded agent that is no participant, even a
        # lost one): news always changes the record, anything else changes nothing, whatever its code.
        if isinstance(event, REPORTS) and key in TRANSITIONS and event.epoch == prev.epoch:
            news = event.participant in required(prev) and event.participant not in prev.reported
            if news:
                assert new is not prev
                if event.participant not in prev.participants:
                    assert prev.phase is Phase.RECOVERING and event.participant in commanded_agents(prev)
            else:
                assert new is prev and effects == []
        # A waiting phase completes exactly when everyone required answered (and someone is left).
        if prev.phase in WAITING_PHASES and key in TRANSITIONS and getattr(event, "epoch", prev.epoch) == prev.epoch:
            after = prev
            answered = prev.reported
            if isinstance(event, ParticipantsChanged):
                after = dataclasses.replace(prev, participants=event.participants)
            elif isinstance(event, REPORTS) and event.participant in required(prev):
                answered = prev.reported | {event.participant}
            completed = (new.phase is NEXT[prev.phase] and new.epoch == prev.epoch) or after_dump
            if completed:
                assert after.participants and required(after) <= answered
                assert commanded_agents(prev) <= answered
            elif isinstance(event, (ParticipantsChanged, *REPORTS)) and getattr(event, "code", 0) == 0:
                assert not (after.participants and required(after) <= answered)
        # A commanded node lost before confirming fails the strategy at once, unless the recovery
        # already knew it as lost (lease faults) when it was commanded; nothing else counts.
        if isinstance(event, CommandedNodeLost) and key in TRANSITIONS and event.epoch == prev.epoch:
            known_lost = {f.node for f in prev.faults if f.source == "lease"}
            died = sorted(
                n for n in prev.command_nodes & event.nodes if of_node(n) not in prev.reported and n not in known_lost
            )
            if died:
                assert new.phase in (Phase.DECIDING, Phase.FAILED) and new.epoch == prev.epoch + (
                    new.phase is Phase.DECIDING
                )
                why = new.failed_strategies[-1][1] if new.phase is Phase.DECIDING else new.outcome
                assert why.endswith(f"commanded node(s) {died} lost before confirming (lease expired)"), why
            else:
                assert new is prev and effects == []
        # A missed RECOVERING deadline names everyone required who did not answer.
        if isinstance(event, DeadlinePassed) and prev.phase is Phase.RECOVERING and new is not prev:
            missing = sorted(required(prev) - prev.reported)
            why = new.failed_strategies[-1][1] if new.phase is Phase.DECIDING else new.outcome
            assert why.endswith(f"not confirmed in time by {missing}"), why
        # A strategy is in progress exactly in RECOVERING; a failed one is recorded and cleared.
        if new.phase in NO_STRATEGY_PHASES:
            assert new.strategy == ""
        if new.phase is Phase.RECOVERING:
            assert new.strategy
        # Outcomes: one per strategy attempt, recorded when it leaves RECOVERING (success to DONE,
        # failure to DECIDING, to FAILED after `exit`, or interrupted by a merged fault to STOPPING;
        # a saved `dump` succeeds into its `exit`), never a placeholder like "none". A round
        # interrupted only by a lost node's lease faults is the same incident seen late: not counted.
        outcomes = [e for e in effects if isinstance(e, RecordOutcome)]
        late_node_loss = (
            new.phase is Phase.STOPPING
            and bool(new.faults[len(prev.faults) :])
            and all(f.source == "lease" for f in new.faults[len(prev.faults) :])
        )
        left_recovering = (
            prev.phase is Phase.RECOVERING
            and not late_node_loss
            and new.phase
            in (
                Phase.DONE,
                Phase.DECIDING,
                Phase.FAILED,
                Phase.STOPPING,
            )
        )
        assert len(outcomes) == (1 if left_recovering or after_dump else 0)
        for outcome in outcomes:
            assert outcome.strategy == prev.strategy and outcome.strategy in (*STRATEGIES, UPGRADE)
            assert outcome.ranks == prev.fault_ranks
            assert outcome.ok == (new.phase is Phase.DONE or after_dump)
            if new.phase is Phase.FAILED:
                assert outcome.strategy == "exit"
        # Success needs someone to confirm it: losing every participant never completes a phase.
        if new.phase is not prev.phase and prev.phase in (Phase.STOPPING, Phase.GLOBAL_FAULT, Phase.RECOVERING):
            if new.phase in (Phase.GLOBAL_FAULT, Phase.DECIDING, Phase.DONE) and new.epoch == prev.epoch:
                assert new.participants
        if after_dump:
            assert new.participants
        if new.phase is Phase.DONE and prev.phase is Phase.RECOVERING:
            assert new.participants and new.outcome == "succeeded"
            assert new.command_nodes == frozenset()
            assert bool(prev.command_nodes) == (prev.strategy not in ("retry", "dump"))
            assert prev.strategy != "dump", "a saved dump is followed by its exit, never DONE by itself"
        # An upgrade starts isolated ranks on idle spares, one isolated node per spare, in a new round.
        if isinstance(event, CapacityReturned) and new is not prev:
            assert prev.phase is Phase.DONE and prev.isolated and event.layout.spares
            assert new.phase is Phase.RECOVERING and new.strategy == UPGRADE and new.epoch == prev.epoch + 1
            assert all(c.action == "START_RANKS" and c.node in event.layout.spares for c in commands)
            assert set(new.isolated) < set(prev.isolated)
            assert {r for c in commands for r in c.ranks} == {r for r, _ in prev.isolated} - {
                r for r, _ in new.isolated
            }
        # A dump remembers every node its decision named, for the exit after it; nothing else keeps
        # the job's node names in the record (at 512 nodes they would be most of it).
        if isinstance(event, DecisionMade) and new.phase is Phase.RECOVERING and prev.phase is Phase.DECIDING:
            if event.strategy == "dump":
                assert set(new.job_nodes) == set(prev.job_nodes) | set(event.nodes)
            else:
                assert new.job_nodes == ()
        # The exit after a dump restarts every node of the job (and every fault node), all ranks.
        if after_dump:
            named = set(prev.job_nodes) | {f.node for f in new.faults}
            assert [c.node for c in commands] == sorted(named)
            assert all(c.action == "RESTART_ALL" and c.strategy == "exit" for c in commands)
            assert all(c.ranks == isolated_on(prev, c.node) for c in commands)
        # `exit` restarts every node the decision (or the deciding deadline) named, plus every fault node.
        if commands and isinstance(event, (DecisionMade, DeadlinePassed)):
            # Drawn decisions carry no layout: the nodes they name (and the fault nodes) count as
            # alive; an isolated node is not assumed back unless named.
            job_nodes = set(event.nodes) | {f.node for f in new.faults}
            fault_nodes = sorted({f.node for f in new.faults})
            if new.strategy == "exit":
                assert [c.node for c in commands] == sorted(job_nodes)
                # Ranks a downgrade isolated come back on their node when it is alive.
                assert all(c.action == "RESTART_ALL" and c.ranks == isolated_on(prev, c.node) for c in commands)
                assert new.isolated == tuple((r, n) for r, n in prev.isolated if n not in job_nodes)
            elif new.strategy == "recover":
                # Each faulty node's ranks start on its spare and are released where they were.
                spare_of = dict(event.moves)  # type: ignore[union-attr]
                expected = [(spare_of[n], "START_RANKS") for n in fault_nodes] + [
                    (n, "RELEASE_RANKS") for n in fault_nodes
                ]
                assert sorted((c.node, c.action) for c in commands) == sorted(expected)
            else:
                assert [c.node for c in commands] == fault_nodes
                action = "RESTART_RANKS" if new.strategy == "recover-in-place" else "RELEASE_RANKS"
                assert all(c.action == action for c in commands)


def isolated_on(rec: Recovery, node: str) -> tuple[int, ...]:
    return tuple(sorted(rank for rank, where in rec.isolated if where == node))


def picker(seed: int) -> Pick:
    """Choices for one step from one drawn integer, read digit by digit in mixed radix."""
    state = [seed]

    def pick(options: Sequence[Any]) -> Any:
        state[0], index = divmod(state[0], len(options))
        return options[index]

    return pick


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=0, max_value=2**64), min_size=20, max_size=60))
def test_random_event_sequences_keep_the_invariants(steps: list[int]) -> None:
    checker = Checker()
    for seed in steps:
        checker.feed(*draw_event(checker.rec, picker(seed)))


def test_seeded_walks_exercise_every_table_entry() -> None:
    """The generator is not degenerate: seeded walks take every (phase, event) entry of the table,
    reach every phase, hit both kinds of refusal, and reach the cases the fixed rules are about
    (:meth:`Checker.note`), under the same invariant checks."""
    rng = random.Random(20240611)
    taken: set[tuple[Phase, type, Phase]] = set()
    errors: set[type] = set()
    seen: set[str] = set()
    for _ in range(400):
        checker = Checker()
        for _ in range(60):
            checker.feed(*draw_event(checker.rec, rng.choice))
        taken |= checker.taken
        errors |= checker.errors
        seen |= checker.seen
    assert {(p, e) for p, e, _ in taken} == set(TRANSITIONS)
    assert {(p, e, target) for p, e, target in taken if (p, e) in TRANSITIONS} >= {
        (p, e, target) for (p, e), target in TRANSITIONS.items()
    }
    assert {target for _, _, target in taken} == set(Phase)
    assert errors == {IllegalTransition, StaleEpoch}
    assert seen == {
        "replayed fault after DONE",
        "non-zero report that is not news",
        "deciding deadline with job nodes",
        "waiting with no participant",
        "give-up",
        "exit failed",
        "a commanded agent that is not a participant answered",
        "every participant answered, a commanded agent has not",
        "a commanded agent was lost",
        "recovering deadline waiting for a commanded agent",
        "dump saved, exit follows",
        "exit after dump failed",
        "a commanded node died before confirming",
        "a commanded node known lost before its command is awaited",
    }
