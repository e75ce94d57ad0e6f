"""One reconcile pass's fold: a job's read turned into inputs, in a fixed order, through ``step``.

A :class:`Fold` holds what one pass has done so far: the recovery as folded, the effects ``step``
returned, the ops under ``jobs/`` (keys consumed, records written) and the events recorded, in the
order they were made (event ids and the commit keep that order), and whether keys were left for
the next pass. The inputs are derived from the read (``observe.py``) one kind at a time, each
against the recovery as the previous ones left it (a fault that restarts the round makes the
reports of the old epoch stale), in this order:

1. the pending faults (oldest first, a bounded number; each key consumed, real or not) and the
   faults of lost nodes (a lease expired while its ranks ran), all merged as one input (one round);
2. (the stacks of hung ranks, kept in events);
3. the live participants; a commanded node that is gone;
4. the reports for the current epoch (a bounded number of stale ones recorded and consumed), then
   the answers no agent writes (``observe.implied_answers``: uninvolved agents, declared
   strategies, commanded nodes' acks), phase after phase while they complete one;
5. the selector's decision for the current epoch (first, the rank tables of dead agents that held
   nothing are removed, a few per pass);
6. a passed deadline; spares that returned while ranks are isolated;
7. the implied answers again (a decision or a deadline opened a new phase); the end of the job
   (every rank exited 0, nothing being recovered).

A rejected input (``IllegalTransition``, ``StaleEpoch``) is recorded as an event and changes
nothing. No I/O: the shell (``reconciler.py``) reads, screens bad keys into the fold, and commits
what it holds. ``now`` is given; the clock is read only to mint a uuid.
"""

from __future__ import annotations

import dataclasses
import secrets
import time

from recoverd import events, hangstacks
from recoverd.coordinator.codec import recovery_from_pb, recovery_to_pb
from recoverd.coordinator.effects import Effect, EmitEvent, FinishJob
from recoverd.coordinator.inputs import (
    CapacityReturned,
    CommandedNodeLost,
    DeadlinePassed,
    Event,
    FaultReported,
    ParticipantsChanged,
)
from recoverd.coordinator.model import FaultInfo, Phase, Recovery
from recoverd.coordinator.observe import (
    Rejection,
    all_succeeded,
    decision_input,
    empty_rank_tables,
    implied_answers,
    job_layout,
    job_nodes,
    job_timeouts,
    live_participants,
    lost_node_faults,
    pending_faults,
    rank_generations,
    report_input,
    screen_fault,
)
from recoverd.coordinator.recovery import step
from recoverd.coordinator.settings import CoordinatorSettings
from recoverd.coordinator.writes import effect_ops
from recoverd.errors import Reason, RecoverdError
from recoverd.jobview import JobView
from recoverd.keys import KeyKind, Keyspace, RunRef
from recoverd.records import encode, pb
from recoverd.store import Delete, DeletePrefix, Op, Put

__all__ = ["SOURCE", "Fold", "mint_uuid"]

#: The ``source`` of the coordinator's events.
SOURCE = "coordinator"


def mint_uuid() -> str:
    """A recovery's uuid, minted whenever its epoch changes (signals and reports carry it)."""
    return f"{time.time_ns():X}-{secrets.token_hex(8)}"


class Fold:
    """One pass over one job's read (``view``, taken at ``now``); see the module docstring."""

    def __init__(self, keys: Keyspace, view: JobView, now: float, settings: CoordinatorSettings) -> None:
        assert view.spec is not None and view.run is not None
        self.keys = keys
        self.view = view
        self.spec: pb.JobSpec = view.spec
        self.run: RunRef = view.run
        self.now = now
        self.settings = settings
        #: Writes under ``jobs/`` and the events, in the order the pass made them.
        self.ops: list[Op] = []
        self.ev: list[Put] = []
        #: Keys are left for the next pass (each kind is consumed at a bounded rate).
        self.more = False
        #: The recovery as read (``before``) and as folded so far (``rec``), and its uuid.
        self.before = self.rec = Recovery()
        self.uuid = ""
        #: The recovery record was missing or bad and has been rebuilt: it is written even unchanged.
        self.is_rebuilt = False
        self.effects: list[Effect] = []
        self.timeouts = job_timeouts(view.spec.policy, settings.timeouts)
        #: Nodes the shell holds as live while etcd was in trouble (``leasehold.py``): in the view
        #: already; recorded in the recovery for the selector.
        self.held_nodes: frozenset[str] = frozenset()

    # ---------------------------------------------------------------- recording
    def note(
        self,
        reason: str,
        message: str,
        *,
        epoch: int = 0,
        phase: str = "",
        rank: int | None = None,
        node: str = "",
        data: dict[str, str] | None = None,
    ) -> None:
        """Record an event of this pass (committed with its writes)."""
        self.ev.append(
            events.event_put(
                self.keys,
                self.run,
                SOURCE,
                reason,
                message,
                epoch=epoch,
                phase=phase,
                rank=rank,
                node=node,
                data=data,
                at=self.now,
            )
        )

    def apply(self, event: Event) -> None:
        """Fold one input through ``step``; a rejected one is recorded and changes nothing."""
        try:
            self.rec, produced = step(self.rec, event, self.now, self.timeouts)
        except RecoverdError as err:
            self.note(err.reason, err.detail, epoch=self.rec.epoch, phase=self.rec.phase.value)
            return
        self.effects.extend(produced)

    @property
    def has_closed(self) -> bool:
        """The recovery reached DONE or FAILED in this pass."""
        return self.rec.phase in (Phase.DONE, Phase.FAILED) and self.before.phase is not self.rec.phase

    # ---------------------------------------------------------------- the pass
    def remove_other_runs(self) -> None:
        """Leftovers of an earlier run of this name: never read as ours, removed (a few per pass)."""
        cap = self.settings.cleanups_per_pass
        for uid in sorted(self.view.other_runs)[:cap]:
            self.ops.append(DeletePrefix(self.keys.run_prefix(RunRef(self.run.job, uid))))
            self.ops.append(DeletePrefix(self.keys.run_inbox_prefix(RunRef(self.run.job, uid))))
        self.more = self.more or len(self.view.other_runs) > cap

    def load_recovery(self) -> None:
        """Start from the stored recovery; if it is gone or was bad but epochs were used, rebuild it
        above every epoch any record names, so no epoch repeats (docs/adr/0021)."""
        view = self.view
        rec = recovery_from_pb(view.recovery) if view.recovery is not None else Recovery()
        self.uuid = view.recovery.uuid if view.recovery is not None else ""
        floor = view.epoch_floor()
        self.is_rebuilt = view.recovery is None and floor > 0
        if self.is_rebuilt:
            clobbered = any(b.kind is KeyKind.RECOVERY for b in view.bad)
            seq = max((c.seq for c in view.commands.values()), default=0)
            rec = Recovery(epoch=floor, recovery_id=floor, command_seq=seq)
            self.uuid = mint_uuid()
            self.note(
                "recovery_rebuilt",
                f"the recovery record was {'bad' if clobbered else 'missing'}; rebuilt at epoch {floor}"
                " (the highest epoch that the run's other records name)",
                epoch=floor,
            )
        self.before = self.rec = rec

    def fold_inputs(self) -> None:
        """Derive the inputs in the module docstring's order and fold each through ``step``."""
        self._faults()
        self._liveness()
        self._reports()
        self._implied_answers()
        nodes = job_nodes(self.view)
        layout = job_layout(self.view)
        self._remove_empty_rank_tables()
        if (decision := decision_input(self.view, self.rec, nodes, layout)) is not None:
            self.apply(decision)
        if self.rec.deadline_at is not None and self.now >= self.rec.deadline_at:
            self.apply(DeadlinePassed(self.rec.epoch, nodes, layout))
        # Capacity is back while ranks are isolated by a downgrade: scale out again.
        rec = self.rec
        if rec.phase is Phase.DONE and rec.isolated and layout.spares and not all_succeeded(self.view, rec):
            self.apply(CapacityReturned(layout))
        self._implied_answers()
        self._job_end()
        if self.rec.held_nodes != self.held_nodes:
            self.rec = dataclasses.replace(self.rec, held_nodes=self.held_nodes)

    def write(self) -> None:
        """The pass's writes: the recovery record if it changed (a new uuid and the old epoch's
        reports consumed when the epoch changed), then what the effects mean in etcd."""
        rec, before = self.rec, self.before
        if rec != before and rec.epoch != before.epoch:
            self.uuid = mint_uuid()
            # Answers to an older epoch are consumed now, so a late one is recognisably stale.
            self.ops.append(DeletePrefix(self.keys.reports_prefix(self.run)))
        if rec != before or self.is_rebuilt:
            self.ops.append(Put(self.keys.recovery(self.run), encode(recovery_to_pb(rec, self.uuid))))
            if rec.phase is not before.phase:
                self.note("phase", f"{before.phase} -> {rec.phase}", epoch=rec.epoch, phase=rec.phase.value)
        self.ops.extend(
            effect_ops(
                self.effects,
                keys=self.keys,
                view=self.view,
                run=self.run,
                rec=rec,
                uuid=self.uuid,
                now=self.now,
                note=self.note,
                settings=self.settings,
            )
        )

    # ---------------------------------------------------------------- the steps of fold_inputs
    def _faults(self) -> None:
        """Faults: validated, then merged (the keys are consumed either way), a bounded number per
        pass, oldest first; the rest are merged by the next pass (the fault window holds)."""
        faults = pending_faults(self.view)
        cap = self.settings.faults_per_pass
        self.more = self.more or len(faults) > cap
        generations = rank_generations(self.view)
        merged: list[FaultInfo] = []
        stacks: list[tuple[pb.Fault, FaultInfo]] = []
        for key, fault in faults[:cap]:
            self.ops.append(Delete(key))
            screened = screen_fault(fault, self.view, generations)
            if isinstance(screened, Rejection):
                self.note(screened.reason, screened.detail, rank=screened.rank, node=screened.node)
                continue
            merged.append(screened)
            if fault.stacks:
                stacks.append((fault, screened))
        # A node whose lease expired while its ranks ran: each of its running ranks is a fault.
        merged += lost_node_faults(self.view, self.now)
        if merged:
            # All of this read's faults at once: one round for them, not one per fault.
            self.apply(FaultReported(merged[0], self._live(), more=tuple(merged[1:])))
        for fault, screened in stacks:
            self._keep_stacks(fault, screened)

    def _keep_stacks(self, fault: pb.Fault, info: FaultInfo) -> None:
        """The fault key is consumed and the recovery record keeps no stacks: they are kept once,
        bounded, in an event (docs/adr/0026)."""
        stacks = hangstacks.bounded(fault.stacks, keep_rank=fault.rank)
        self.note(
            hangstacks.REASON,
            hangstacks.event_message(fault, stacks),
            epoch=self.rec.epoch,
            rank=fault.rank,
            node=info.node,
            data=hangstacks.event_data(fault, self.rec.recovery_id, stacks),
        )

    def _liveness(self) -> None:
        """Who is still there; and a node sent a command in this phase whose agent is gone (its
        lease expired, or its record was removed; a clobbered record counts as live for its grace):
        the strategy fails now, not at the recover deadline (the state machine says which count)."""
        if self.rec.is_active and (live := self._live()) != self.rec.participants:
            self.apply(ParticipantsChanged(live))
        rec = self.rec
        if rec.phase is Phase.RECOVERING and (gone := rec.command_nodes - self.view.nodes.keys()):
            self.apply(CommandedNodeLost(rec.epoch, frozenset(gone)))

    def _live(self) -> frozenset[str]:
        return live_participants(self.view, self.rec)

    def _implied_answers(self) -> None:
        """The answers no agent writes (``observe.implied_answers``): the coordinator gives them,
        phase after phase, as long as they complete one (uninvolved nodes cost no round trip)."""
        for _ in range(len(Phase)):
            if self.rec.is_active and (live := self._live()) != self.rec.participants:
                self.apply(ParticipantsChanged(live))
            answers = implied_answers(self.view, self.rec)
            if not answers:
                return
            at = (self.rec.phase, self.rec.epoch)
            for answer in answers:
                self.apply(answer)
                if (self.rec.phase, self.rec.epoch) != at:
                    break  # the phase is complete: the next one's answers are derived afresh

    def _reports(self) -> None:
        """Answers to the current phase; anything for another epoch is stale: recorded and
        consumed, a bounded number per pass."""
        epoch_changed = self.rec.epoch != self.before.epoch
        stale = 0
        for key, report in sorted(self.view.reports.items()):
            if epoch_changed and report.epoch == self.before.epoch:
                continue  # answers to the epoch this pass closed: expected, removed with the prefix
            if report.epoch != self.rec.epoch:
                if stale >= self.settings.stale_reports_per_pass:
                    self.more = True
                    continue
                stale += 1
                self.note(
                    Reason.STALE_EPOCH,
                    f"report {pb.ReportKind.Name(report.kind)} from {report.participant} for epoch {report.epoch};"
                    f" current epoch is {self.rec.epoch}",
                    epoch=report.epoch,
                )
                self.ops.append(Delete(key))
                continue
            if (answer := report_input(report, self.rec.phase)) is not None:
                self.apply(answer)

    def _remove_empty_rank_tables(self) -> None:
        """The rank tables of dead agents that held nothing go (a few per pass)."""
        empty = empty_rank_tables(self.view)
        cap = self.settings.cleanups_per_pass
        for node in empty[:cap]:
            self.ops.append(Delete(self.keys.ranks(self.run, node)))
        self.more = self.more or len(empty) > cap

    def _job_end(self) -> None:
        """The end of the job: every rank of every node exited 0 and nothing is being recovered."""
        if self.rec.phase is Phase.DONE and not self.view.faults and all_succeeded(self.view, self.rec):
            self.effects.append(FinishJob(succeeded=True, reason="every rank exited 0"))
            self.effects.append(EmitEvent("job_succeeded", f"all {self.spec.world_size} ranks exited 0"))
