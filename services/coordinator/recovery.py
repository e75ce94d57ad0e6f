"""The recovery walk: pure, no I/O, no clock.

One job has at most one recovery in progress (``model.Recovery``). :func:`step` is the only way a
recovery changes: ``step(rec, event, now, timeouts) -> (new_rec, effects)``. The shell
(``reconciler.py``) reads etcd, turns what it sees into events (``inputs.py``, derived by
``observe.py``), folds them through :func:`step` (``fold.py``), and commits the new record and the
effects (``effects.py``) as one fenced etcd transaction. Time is an input (``now``, wall-clock
seconds, because deadlines are stored in etcd for a standby on another host to read); a passed
deadline is the event :class:`DeadlinePassed`.

The walk follows MindCluster's ClusterD order (reference/mindcluster-contract.md section 7)::

    DONE --fault--> COLLECTING --window--> STOPPING --all stop-complete--> GLOBAL_FAULT
      --all strategies--> DECIDING --decision--> RECOVERING --all recover status ok--> DONE

A fault that arrives in any active phase is merged into the recovery: in COLLECTING it is simply
added (upstream's fault flush); later it starts a new round (new epoch) at STOPPING with every fault
so far. A `dump` that everyone confirmed is followed by an `exit` (upstream's dump_exit) in a new
round: RECOVERING(dump) -> RECOVERING(exit) with the epoch bumped and every node of the job sent
RESTART_ALL. A failed strategy (non-zero recover status or a passed deadline) goes back to
DECIDING with that strategy recorded as failed, so the selector falls back level by level; when
`exit` itself fails, or the selector gives up, the job FAILS (killMaster semantics).

Which agent is told what once a strategy is decided (node-wide expansion, spares, isolated ranks,
upgrades) is ``placement.py``; the signals' MindCluster wire form is ``wire.py``. An upgrade round
(DONE -> RECOVERING, ``CapacityReturned``) starts isolated ranks on spares that registered.

``TRANSITIONS`` is the whole table: (phase, event type) -> the phase entered when the event's guard
holds. Pairs not in the table raise :class:`IllegalTransition` (the shell records it and carries on;
unlike upstream, the episode is never reset). Rules kept in code rather than in the table, each a
named function below: ``_all_reported`` (a waiting phase ends only when everyone ``_required``
answered: the participants, and in RECOVERING also the agent of every node sent a command),
``_open`` (a fault in DONE opens a new recovery), ``_merge_fault`` (a fault after COLLECTING starts
a new round), ``_strategy_failed`` (failure falls back, or fails the job after `exit`),
``_commanded_node_lost`` (a commanded node that dies before confirming fails the strategy at once),
``_deciding_deadline`` (DECIDING waits for a lost node's replacement) and ``_unreplaced`` (at that
deadline, a lost node nothing replaced fails the job rather than an `exit` that would wait for it).
"""

from __future__ import annotations

import dataclasses

from recoverd import participants as participant_ids
from recoverd.coordinator.effects import (
    Effect,
    EmitEvent,
    FinishJob,
    ForgetNode,
    PublishSignal,
    RecordOutcome,
    SendCommand,
)
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
from recoverd.coordinator.model import WAITING_PHASES, FaultInfo, Layout, Phase, Recovery, Timeouts
from recoverd.coordinator.placement import expand_to_nodes, plan_commands, plan_upgrade
from recoverd.coordinator.wire import DUMP_EXIT, UPGRADE_EXTRA, fault_wire, wire_strategy
from recoverd.errors import IllegalTransition, StaleEpoch
from recoverd.strategies import CHEAPER_THAN_EXIT, NODE_WIDE, UPGRADE

__all__ = ["TRANSITIONS", "UPGRADE", "step"]

# CHEAPER_THAN_EXIT (ruled out together when a phase cannot complete), NODE_WIDE and UPGRADE (the
# name an upgrade round is recorded under) come from recoverd.strategies, the one module that
# names the strategies.

#: Upstream's stop-complete code "processes not ready": job-level escalation.
PROCESS_NOT_READY = 404

#: Recover-status codes (contract section 3) and what else each rules out: 405 (retry failed,
#: recoverable) only the strategy itself; 406 (unrecoverable) leaves dump or exit; 499 (client
#: error) and 201 (isolate ranks; as upstream's client sends it, with no ranks: exit) leave only exit.
_RULED_OUT_BY_CODE: dict[int, tuple[str, ...]] = {
    406: ("retry", "recover-in-place", "recover", "elastic-training"),
    499: CHEAPER_THAN_EXIT,
    201: CHEAPER_THAN_EXIT,
}

# ---------------------------------------------------------------------- the table

TRANSITIONS: dict[tuple[Phase, type], Phase] = {
    (Phase.DONE, FaultReported): Phase.COLLECTING,
    (Phase.DONE, ParticipantsChanged): Phase.DONE,
    (Phase.DONE, CapacityReturned): Phase.RECOVERING,
    (Phase.COLLECTING, FaultReported): Phase.COLLECTING,
    (Phase.COLLECTING, DeadlinePassed): Phase.STOPPING,
    (Phase.COLLECTING, ParticipantsChanged): Phase.COLLECTING,
    (Phase.STOPPING, FaultReported): Phase.STOPPING,
    (Phase.STOPPING, StopCompleted): Phase.GLOBAL_FAULT,
    (Phase.STOPPING, ParticipantsChanged): Phase.GLOBAL_FAULT,
    (Phase.STOPPING, DeadlinePassed): Phase.DECIDING,
    (Phase.GLOBAL_FAULT, FaultReported): Phase.STOPPING,
    (Phase.GLOBAL_FAULT, StrategiesReported): Phase.DECIDING,
    (Phase.GLOBAL_FAULT, ParticipantsChanged): Phase.DECIDING,
    (Phase.GLOBAL_FAULT, DeadlinePassed): Phase.DECIDING,
    (Phase.DECIDING, FaultReported): Phase.STOPPING,
    (Phase.DECIDING, DecisionMade): Phase.RECOVERING,
    (Phase.DECIDING, ParticipantsChanged): Phase.DECIDING,
    (Phase.DECIDING, DeadlinePassed): Phase.RECOVERING,
    (Phase.RECOVERING, FaultReported): Phase.STOPPING,
    (Phase.RECOVERING, RecoverStatusReported): Phase.DONE,
    (Phase.RECOVERING, ParticipantsChanged): Phase.DONE,
    (Phase.RECOVERING, DeadlinePassed): Phase.DECIDING,
    (Phase.RECOVERING, CommandedNodeLost): Phase.DECIDING,
}
"""(phase, event type) -> the phase entered when the event's guard holds. Guards in code:
``_all_reported`` for the waiting phases, ``_strategy_failed`` for failures (-> DECIDING or FAILED),
a give-up decision (-> FAILED), ``_merge_fault`` for duplicates (no change), ``_commanded_node_lost``
for a commanded node that died before confirming."""


# ---------------------------------------------------------------------- step


def step(rec: Recovery, event: Event, now: float, timeouts: Timeouts | None = None) -> tuple[Recovery, list[Effect]]:
    """Apply one event to a recovery; return the new record and the effects to commit with it.

    Pure and deterministic. Raises :class:`IllegalTransition` for a (phase, event) pair outside the
    table and :class:`StaleEpoch` for a report or decision naming another epoch; in both cases the
    caller keeps ``rec`` unchanged. An event that changes nothing returns ``rec`` itself and no
    effects, so replaying an event is harmless.
    """
    timeouts = timeouts or Timeouts()
    key = (rec.phase, type(event))
    if key not in TRANSITIONS:
        raise IllegalTransition(f"{type(event).__name__} has no rule in phase {rec.phase} (epoch {rec.epoch})")
    epoch = getattr(event, "epoch", None)
    if epoch is not None and epoch != rec.epoch:
        raise StaleEpoch(f"{type(event).__name__} for epoch {epoch}, current epoch is {rec.epoch}")

    if isinstance(event, FaultReported):
        if rec.phase is Phase.DONE:
            return _open(rec, event, now, timeouts)
        return _merge_fault(rec, event, now, timeouts)
    if isinstance(event, ParticipantsChanged):
        return _participants_changed(rec, event, now, timeouts)
    if isinstance(event, DeadlinePassed):
        return _deadline_passed(rec, event, now, timeouts)
    if isinstance(event, StopCompleted):
        if not _is_news(rec, event.participant):
            return rec, []
        if event.code == PROCESS_NOT_READY:
            # Upstream's 404: the processes are not all ready, nothing process-level can help.
            return _fail_job(rec, now, timeouts, f"{event.participant} reports processes not ready (code 404)")
        if event.code != 0:
            return _rule_out_cheap(rec, now, timeouts, f"{event.participant} could not stop (code {event.code})")
        return _report(rec, event.participant, now, timeouts)
    if isinstance(event, StrategiesReported):
        if not _is_news(rec, event.participant):
            return rec, []
        offered = frozenset(event.strategies)
        supported = offered if rec.supported is None else rec.supported & offered
        return _report(dataclasses.replace(rec, supported=supported), event.participant, now, timeouts)
    if isinstance(event, DecisionMade):
        return _decided(rec, event, now, timeouts)
    if isinstance(event, CapacityReturned):
        return _upgrade(rec, event, now, timeouts)
    if isinstance(event, CommandedNodeLost):
        return _commanded_node_lost(rec, event, now, timeouts)
    if isinstance(event, RecoverStatusReported):
        if not _is_news(rec, event.participant):
            return rec, []
        if event.code != 0:
            why = f"{event.participant} reported code {event.code}: {event.message}".rstrip(": ")
            return _strategy_failed(rec, now, timeouts, why, also_failed=_RULED_OUT_BY_CODE.get(event.code, ()))
        return _report(rec, event.participant, now, timeouts)
    raise IllegalTransition(f"unknown event {event!r}")  # pragma: no cover - the table check covers it


def _enter(rec: Recovery, phase: Phase, now: float, timeouts: Timeouts, **changes: object) -> Recovery:
    """Move to ``phase``: reset the answers, arm its deadline, log the entry."""
    limit = timeouts.for_phase(phase)
    new = dataclasses.replace(
        rec,
        phase=phase,
        reported=frozenset(),
        command_nodes=frozenset(),
        deadline_at=(now + limit) if limit is not None else None,
        **changes,  # type: ignore[arg-type]
    )
    if phase is Phase.DECIDING:
        new = dataclasses.replace(new, deadline_at=_deciding_deadline(new, now, timeouts))
    epoch = new.epoch
    return dataclasses.replace(new, phase_log=(*rec.phase_log, (phase, now, epoch)))


def _news(rec: Recovery, event: FaultReported) -> tuple[FaultInfo, ...]:
    """The event's faults that ``rec`` does not hold yet (each id once)."""
    known = {f.fault_id for f in rec.faults}
    out: list[FaultInfo] = []
    for fault in (event.fault, *event.more):
        if fault.fault_id not in known:
            known.add(fault.fault_id)
            out.append(fault)
    return tuple(out)


def _merged_message(rec: Recovery, faults: tuple[FaultInfo, ...]) -> str:
    if len(faults) == 1:
        return f"fault of rank {faults[0].rank} on {faults[0].node} merged into recovery {rec.recovery_id}"
    nodes = sorted({f.node for f in faults})
    return (
        f"{len(faults)} faults (ranks {sorted({f.rank for f in faults})} on {', '.join(nodes[:8])}"
        f"{', ...' if len(nodes) > 8 else ''}) merged into recovery {rec.recovery_id}"
    )


def _open(rec: Recovery, event: FaultReported, now: float, timeouts: Timeouts) -> tuple[Recovery, list[Effect]]:
    """A fault with no recovery in progress opens one (new recovery id, new epoch); the faults read
    with it are collected into it at once.

    A fault already handled by the last recovery (a replayed key) opens nothing.
    """
    news = _news(rec, event)
    if not news:
        return rec, []
    new = Recovery(
        epoch=rec.epoch + 1,
        recovery_id=rec.recovery_id + 1,
        opened_at=now,
        faults=news,
        participants=event.participants or rec.participants,
        command_seq=rec.command_seq,
        isolated=rec.isolated,
    )
    new = _enter(new, Phase.COLLECTING, now, timeouts)
    new = dataclasses.replace(new, deadline_at=timeouts.collect_deadline(now, now))
    f = news[0]
    effects: list[Effect] = [
        EmitEvent(
            "recovery_opened",
            f"recovery {new.recovery_id} opened (epoch {new.epoch}) by a fault of rank {f.rank} on {f.node}"
            f" ({f.source}{', ' + f.detail if f.detail else ''})",
        )
    ]
    if len(news) > 1:
        effects.append(EmitEvent("fault_merged", _merged_message(new, news[1:])))
    return new, effects


def _merge_fault(rec: Recovery, event: FaultReported, now: float, timeouts: Timeouts) -> tuple[Recovery, list[Effect]]:
    """Merge faults into the recovery in progress; after COLLECTING they restart the round (once)."""
    news = _news(rec, event)
    if not news:
        return rec, []
    faults = (*rec.faults, *news)
    message = _merged_message(rec, news)
    if rec.phase is Phase.COLLECTING:
        deadline = timeouts.collect_deadline(rec.opened_at, now)
        return dataclasses.replace(rec, faults=faults, deadline_at=deadline), [EmitEvent("fault_merged", message)]
    new = _enter(
        dataclasses.replace(rec, faults=faults, epoch=rec.epoch + 1, supported=None, strategy=""),
        Phase.STOPPING,
        now,
        timeouts,
    )
    # A strategy whose commands were already carried out counts for the budgets even when a new
    # fault interrupts it: otherwise a rank that crashes while being restarted is never counted.
    # Not when the news shows a lost node (lease faults): that is the same incident seen late
    # (its survivors crash at once, its lease expires ~2 s later, and a plain script's restarted
    # survivors may crash again meanwhile), and one incident spends one unit of the budget,
    # whatever the rounds it takes.
    interrupted: list[Effect] = (
        [RecordOutcome(rec.strategy, rec.fault_ranks, ok=False)]
        if rec.phase is Phase.RECOVERING and not any(f.source == "lease" for f in news)
        else []
    )
    return new, [
        *interrupted,
        EmitEvent("fault_merged", f"{message}; restarting the round at epoch {new.epoch}"),
        PublishSignal("stopTrain", ("stop_train",), fault_wire(new)),
    ]


def _required(rec: Recovery) -> frozenset[str]:
    """Who must answer the current phase: the participants, and in RECOVERING also the agent of
    every node that was sent a command (it alone can say its processes were restarted, even when
    clients are the participants, and a lost node's command must not count as done)."""
    return rec.participants | frozenset(participant_ids.of_node(n) for n in rec.command_nodes)


def _is_news(rec: Recovery, participant: str) -> bool:
    """A report counts only from someone who must answer and has not answered this phase yet."""
    return participant in _required(rec) and participant not in rec.reported


def _all_reported(rec: Recovery) -> bool:
    """Guard of the waiting phases: everyone required has answered.

    With no participant left nobody can answer, and that is not success: the phase waits for its
    deadline (which escalates) or for a participant to (re)join.
    """
    return bool(rec.participants) and _required(rec) <= rec.reported


def _report(rec: Recovery, participant: str, now: float, timeouts: Timeouts) -> tuple[Recovery, list[Effect]]:
    if not _is_news(rec, participant):
        return rec, []
    new = dataclasses.replace(rec, reported=rec.reported | {participant})
    if not _all_reported(new):
        return new, []
    return _advance(new, now, timeouts)


def _advance(rec: Recovery, now: float, timeouts: Timeouts) -> tuple[Recovery, list[Effect]]:
    """Every participant answered the current waiting phase: enter the next one."""
    if rec.phase is Phase.STOPPING:
        new = _enter(rec, Phase.GLOBAL_FAULT, now, timeouts)
        return new, [PublishSignal("globalFault", ("on_global_rank",), fault_wire(new))]
    if rec.phase is Phase.GLOBAL_FAULT:
        return _enter(rec, Phase.DECIDING, now, timeouts), []
    if rec.phase is Phase.RECOVERING and rec.strategy == "dump":
        return _dump_saved(rec, now, timeouts)
    if rec.phase is Phase.RECOVERING:
        new = _enter(rec, Phase.DONE, now, timeouts, outcome="succeeded")
        return new, [
            RecordOutcome(rec.strategy, rec.fault_ranks, ok=True),
            EmitEvent(
                "recovery_done",
                f"recovery {rec.recovery_id} done: {rec.strategy} of ranks {list(rec.fault_ranks)}"
                f" in {now - rec.opened_at:.3f}s",
            ),
        ]
    return rec, []


def _dump_saved(rec: Recovery, now: float, timeouts: Timeouts) -> tuple[Recovery, list[Effect]]:
    """Everyone confirmed the dying-gasp checkpoint: the dump is recorded as done, then every rank of
    the job is restarted (upstream's dump_exit) in a new round, so the dump's answers are not taken
    for the restart's. That round completes (or fails) like any `exit`."""
    epoch = rec.epoch + 1
    decision = DecisionMade(epoch, "exit", ("dump saved; exit restarts every rank (dump_exit)",), nodes=rec.job_nodes)
    new, effects = _decided(dataclasses.replace(rec, epoch=epoch), decision, now, timeouts, extra_params=DUMP_EXIT)
    return new, [
        RecordOutcome(rec.strategy, rec.fault_ranks, ok=True),
        EmitEvent(
            "dump_saved",
            f"recovery {rec.recovery_id}: dump of ranks {list(rec.fault_ranks)} saved; restarting every rank"
            f" (epoch {epoch})",
        ),
        *effects,
    ]


def _participants_changed(
    rec: Recovery, event: ParticipantsChanged, now: float, timeouts: Timeouts
) -> tuple[Recovery, list[Effect]]:
    if event.participants == rec.participants:
        return rec, []
    kept = rec.reported & (event.participants | frozenset(participant_ids.of_node(n) for n in rec.command_nodes))
    new = dataclasses.replace(rec, participants=event.participants, reported=kept)
    if rec.phase in WAITING_PHASES and _all_reported(new):
        return _advance(new, now, timeouts)
    return new, []


def _deadline_passed(
    rec: Recovery, event: DeadlinePassed, now: float, timeouts: Timeouts
) -> tuple[Recovery, list[Effect]]:
    if rec.deadline_at is None or now < rec.deadline_at:
        return rec, []
    if rec.phase is Phase.COLLECTING:
        new = _enter(rec, Phase.STOPPING, now, timeouts)
        return new, [PublishSignal("stopTrain", ("stop_train",), fault_wire(new))]
    if rec.phase in (Phase.STOPPING, Phase.GLOBAL_FAULT):
        missing = sorted(rec.participants - rec.reported)
        return _rule_out_cheap(rec, now, timeouts, f"{rec.phase} deadline passed waiting for {missing}")
    if rec.phase is Phase.DECIDING:
        unreplaced = _unreplaced(rec, event) if timeouts.replacement_s > 0 else []
        if unreplaced:
            return _fail_job(
                rec,
                now,
                timeouts,
                f"node(s) {unreplaced} lost and no agent replaced them within {timeouts.replacement_s:g}s"
                " (deadlines.replacement): nowhere to run their ranks",
            )
        decision = DecisionMade(
            rec.epoch,
            "exit",
            (f"no decision within {timeouts.decide_s}s: the coordinator applies exit, which is always safe",),
            nodes=event.nodes,
            layout=event.layout,
        )
        return _decided(rec, decision, now, timeouts)
    missing = sorted(_required(rec) - rec.reported)
    return _strategy_failed(rec, now, timeouts, f"{rec.strategy} not confirmed in time by {missing}")


def _lost_since(rec: Recovery) -> float | None:
    """When the first node of this recovery was declared lost (its lease faults keep the time of
    the first pass that saw them), or None when no node was lost."""
    lost = [f.detected_at for f in rec.faults if f.source == "lease"]
    return min(lost) if lost else None


def _deciding_deadline(rec: Recovery, now: float, timeouts: Timeouts) -> float:
    """DECIDING's deadline: ``decide_s``, and with a lost node at least ``replacement_s`` after it
    was lost, for the selector waits that long for an agent to replace it (every round of the
    recovery against the same bound, so a survivor's crash meanwhile does not extend it)."""
    deadline = now + timeouts.decide_s
    since = _lost_since(rec)
    if since is None or timeouts.replacement_s <= 0:
        return deadline
    return max(deadline, since + timeouts.replacement_s)


def _unreplaced(rec: Recovery, event: DeadlinePassed) -> list[str]:
    """Lost nodes of ``rec`` that are still gone and that no idle spare can replace (more lost
    nodes than spares: the last ones in name order), as the deadline's read shows."""
    if event.layout is None:
        return []
    gone = sorted({f.node for f in rec.faults if f.source == "lease"} - event.layout.live)
    return gone[len(event.layout.spares) :]


def _commanded_node_lost(
    rec: Recovery, event: CommandedNodeLost, now: float, timeouts: Timeouts
) -> tuple[Recovery, list[Effect]]:
    """A node sent a command in this phase died before confirming it: the strategy has failed now,
    at its lease's expiry, rather than at the recover deadline (docs/adr/0025).

    Not counted: a node that already confirmed (its ranks' loss, if they run, is a fault of its own:
    lost-node faults), and a node this recovery already knows as lost (it holds lease faults of that
    node): it was commanded while it was away, as an `exit` commands every node still holding ranks,
    and its agent may come back and carry the command out within the deadline (docs/adr/0023).
    """
    known_lost = {f.node for f in rec.faults if f.source == "lease"}
    died = sorted(
        n
        for n in rec.command_nodes & event.nodes
        if participant_ids.of_node(n) not in rec.reported and n not in known_lost
    )
    if not died:
        return rec, []
    return _strategy_failed(rec, now, timeouts, f"commanded node(s) {died} lost before confirming (lease expired)")


def _rule_out_cheap(rec: Recovery, now: float, timeouts: Timeouts, why: str) -> tuple[Recovery, list[Effect]]:
    """A phase that cannot complete leaves only `exit`: mark every cheaper strategy failed."""
    known = {name for name, _ in rec.failed_strategies}
    failed = rec.failed_strategies + tuple((s, why) for s in CHEAPER_THAN_EXIT if s not in known)
    new = _enter(rec, Phase.DECIDING, now, timeouts, epoch=rec.epoch + 1, failed_strategies=failed)
    return new, [EmitEvent("escalated", f"{why}; only exit remains (epoch {new.epoch})")]


def _strategy_failed(
    rec: Recovery, now: float, timeouts: Timeouts, why: str, also_failed: tuple[str, ...] = ()
) -> tuple[Recovery, list[Effect]]:
    """The strategy in progress failed: fall back to the selector, or fail the job after `exit`.

    ``also_failed``: strategies the failure's code rules out too (406: only dump or exit remain;
    499 and 201: only exit), recorded as failed with the same reason.
    """
    if rec.strategy == "exit":
        return _fail_job(rec, now, timeouts, f"exit failed: {why}")
    known = {name for name, _ in rec.failed_strategies} | {rec.strategy}
    failed = (
        *rec.failed_strategies,
        (rec.strategy, why),
        *((s, why) for s in also_failed if s not in known),
    )
    # The failed strategy is recorded here, once; no strategy is in progress while deciding.
    new = _enter(rec, Phase.DECIDING, now, timeouts, epoch=rec.epoch + 1, failed_strategies=failed, strategy="")
    return new, [
        RecordOutcome(rec.strategy, rec.fault_ranks, ok=False),
        EmitEvent("strategy_failed", f"{rec.strategy} failed: {why}; deciding again (epoch {new.epoch})"),
    ]


def _fail_job(rec: Recovery, now: float, timeouts: Timeouts, why: str) -> tuple[Recovery, list[Effect]]:
    new = _enter(rec, Phase.FAILED, now, timeouts, outcome=f"failed: {why}")
    outcome: list[Effect] = [RecordOutcome(rec.strategy, rec.fault_ranks, ok=False)] if rec.strategy else []
    return new, [
        *outcome,
        PublishSignal("killMaster", ()),
        FinishJob(succeeded=False, reason=why),
        EmitEvent("job_failed", why),
    ]


def _decided(
    rec: Recovery, event: DecisionMade, now: float, timeouts: Timeouts, extra_params: str | None = None
) -> tuple[Recovery, list[Effect]]:
    """Enter RECOVERING with the decided strategy (or fail the job on a give-up).

    ``extra_params`` overrides the wire form's extraParams (`dump_exit` for the `exit` after a dump).
    """
    reasons = "; ".join(event.reasons)
    if event.give_up or not event.strategy:
        return _fail_job(
            dataclasses.replace(rec, decision_reasons=event.reasons), now, timeouts, reasons or "no strategy left"
        )
    layout = event.layout or Layout()
    if event.strategy in NODE_WIDE:
        rec = expand_to_nodes(rec, layout, now)
    plan = plan_commands(rec, event, layout)
    if plan.fail:
        return _fail_job(dataclasses.replace(rec, decision_reasons=event.reasons), now, timeouts, plan.fail)
    # Kept only for a dump (its trailing exit restarts them all): at 512 nodes the names are most
    # of the record, which every agent decodes on every change. A forgotten (lost) node is no
    # longer the job's: the exit must not wait for its agent.
    job_nodes = (
        tuple(sorted((set(rec.job_nodes) | set(event.nodes)) - set(plan.forget))) if event.strategy == "dump" else ()
    )
    seq = rec.command_seq
    commands: list[Effect] = []
    for node, action, ranks in plan.commands:
        seq += 1
        commands.append(SendCommand(node, action, ranks, seq, event.strategy))
    change, extra, actions = wire_strategy(event.strategy)
    if extra_params is not None:
        extra = extra_params
    new = _enter(
        rec,
        Phase.RECOVERING,
        now,
        timeouts,
        strategy=event.strategy,
        decision_reasons=event.reasons,
        command_seq=seq,
        job_nodes=job_nodes,
        isolated=plan.isolated,
    )
    awaited = frozenset(c.node for c in commands if isinstance(c, SendCommand)) - set(plan.forget)
    new = dataclasses.replace(new, command_nodes=awaited)
    return new, [
        EmitEvent("strategy_decided", f"{event.strategy} for ranks {list(new.fault_ranks)}: {reasons}"),
        PublishSignal("changeStrategy", ("change_strategy", *actions), fault_wire(new), change, extra),
        *commands,
        *(ForgetNode(node) for node in plan.forget),
    ]


def _upgrade(rec: Recovery, event: CapacityReturned, now: float, timeouts: Timeouts) -> tuple[Recovery, list[Effect]]:
    """Spares registered while ranks are isolated: start each isolated node's ranks on one spare
    (upstream's upgrade after a DP scale-in). A new recovery round, so its answers are its own."""
    moves = plan_upgrade(rec.isolated, event.layout.spares)
    if not moves:
        return rec, []
    epoch = rec.epoch + 1
    back = tuple(
        FaultInfo(
            fault_id=f"upgrade.{node}.r{rank}.e{epoch}",
            rank=rank,
            node=spare,
            detected_at=now,
            detail=f"isolated rank back on spare {spare} (upgrade)",
        )
        for node, spare, ranks in moves
        for rank in ranks
    )
    moved = {f.rank for f in back}
    seq = rec.command_seq
    commands: list[Effect] = []
    for _, spare, ranks in moves:
        seq += 1
        commands.append(SendCommand(spare, "START_RANKS", ranks, seq, UPGRADE))
    new = Recovery(
        epoch=epoch,
        recovery_id=rec.recovery_id + 1,
        opened_at=now,
        faults=back,
        participants=rec.participants,
        command_seq=seq,
        isolated=tuple((r, n) for r, n in rec.isolated if r not in moved),
        strategy=UPGRADE,
        decision_reasons=(f"idle spare(s) {[s for _, s, _ in moves]} registered while ranks were isolated",),
    )
    new = _enter(new, Phase.RECOVERING, now, timeouts)
    new = dataclasses.replace(new, command_nodes=frozenset(spare for _, spare, _ in moves))
    return new, [
        EmitEvent(
            "upgrade",
            f"recovery {new.recovery_id} (epoch {epoch}): ranks {sorted(moved)} back on "
            + ", ".join(f"{spare} (from {node})" for node, spare, _ in moves),
        ),
        PublishSignal("changeStrategy", ("change_strategy",), fault_wire(new), UPGRADE, UPGRADE_EXTRA),
        *commands,
    ]
