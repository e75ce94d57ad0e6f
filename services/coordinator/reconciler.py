"""The coordinator's shell: leader election, watches, and one fenced transaction per reconcile pass.

Level-triggered (Kubernetes-controller style): a watch on ``jobs/`` only enqueues the job a changed
key belongs to; a worker reads the job's whole prefix at one revision, turns what it sees into
state-machine events (new faults, reports for the current epoch, the selector's decision, a passed
deadline, the live participants), folds them through :func:`recovery.step`, and commits the new
record, the effects and the events as ONE transaction that also compares

* the leader key against this instance's value (a deposed leader can change nothing), and
* the job prefix's mod revision against the revision it read (nothing changed underneath).

If the compare fails the pass is dropped and re-run from a fresh read; it is never patched. A
missed watch event costs nothing: after a resync every job is enqueued once, and phase deadlines
are timers that enqueue the job.

A pass never exceeds etcd's limits (docs/adr/0019): it consumes at most a bounded number of keys
(faults, bad keys, stale reports) and requeues the job for the rest; the fenced transaction holds
the recovery record and the consumed keys; commands beyond the 128-operation budget follow in
transactions fenced by the leader key and the recovery record's revision, and events (outside
``jobs/``) follow in chunks fenced by the leader key.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

from recoverd import events, hangstacks
from recoverd.aiotools import supervised_group
from recoverd.controller import JobController
from recoverd.coordinator.codec import fault_from_pb, recovery_from_pb, recovery_to_pb
from recoverd.coordinator.commit import commit
from recoverd.coordinator.effects import Effect, EmitEvent, FinishJob
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
from recoverd.coordinator.leadership import Leadership, raise_expected_end, raise_when_lost
from recoverd.coordinator.model import Phase, Recovery
from recoverd.coordinator.observe import (
    all_succeeded,
    job_layout,
    job_nodes,
    job_timeouts,
    live_participants,
    lost_node_faults,
)
from recoverd.coordinator.recovery import step
from recoverd.coordinator.settings import CoordinatorSettings
from recoverd.coordinator.writes import effect_ops, job_removal_ops
from recoverd.errors import FenceLost, Reason, RecoverdError, UnknownRank
from recoverd.jobview import JobView, read_job
from recoverd.keys import KeyKind, Keyspace, RunRef, printable
from recoverd.records import encode, pb, ts_to_s
from recoverd.store import Delete, DeletePrefix, Op, Put, Store

__all__ = ["Coordinator"]

log = logging.getLogger(__name__)

SOURCE = "coordinator"


class Coordinator:
    """The leader-elected recovery coordinator. ``await Coordinator(...).run()`` until cancelled."""

    def __init__(self, store: Store, keys: Keyspace, settings: CoordinatorSettings | None = None) -> None:
        self.store = store
        self.keys = keys
        self.settings = settings or CoordinatorSettings()
        self.leadership = Leadership(store, keys, self.settings.lease_ttl_s)
        self._warned: dict[str, int] = {}
        #: (key, mod revision) of a node record clobbered without its lease -> when first seen.
        self._clobbered_since: dict[tuple[str, int], float] = {}
        self._jobs = JobController(store, keys, self.reconcile, name="coordinator", fatal=(FenceLost,))

    # ---------------------------------------------------------------- leadership
    async def run(self) -> None:
        """Campaign for the leader key; while leader, reconcile; on losing it, campaign again."""
        await self.leadership.run(self._lead)

    async def _lead(self, lease_lost: asyncio.Event) -> None:
        """One term: enqueue every job once, then watch ``jobs/`` and the leader key and work the
        queue, until the fence or the lease is lost."""
        self._jobs = JobController(self.store, self.keys, self.reconcile, name="coordinator", fatal=(FenceLost,))
        try:
            async with supervised_group() as group:
                start = await self._jobs.enqueue_all()
                group.create_task(self._jobs.watch(start + 1), name="coordinator-watch")
                group.create_task(self.leadership.watch(start + 1), name="coordinator-fence")
                group.create_task(self._jobs.work(), name="coordinator-worker")
                group.create_task(raise_when_lost(lease_lost), name="coordinator-lease")
        except BaseExceptionGroup as group:
            # Leadership ends; losing the fence or etcd is expected and leads to a new campaign.
            raise_expected_end(group)
            raise
        finally:
            self._jobs.close()

    # ---------------------------------------------------------------- one pass
    async def reconcile(self, job: str) -> None:
        """Bring one job one step closer to its desired state; safe to run any number of times."""
        view = await read_job(self.store, self.keys, job)
        now = time.time()
        if view.spec is None or view.run is None:
            if view.spec_error:
                self._warn_once(view.bad[0].key, view.bad[0].mod_revision, f"job {job}: {view.spec_error}")
            return
        run = view.run
        ops: list[Op] = []
        ev: list[Put] = []
        limits = self.settings
        more = False  # keys left for the next pass (each kind is consumed at a bounded rate)

        def note(reason: str, message: str, **kw: object) -> None:
            ev.append(events.event_put(self.keys, run, SOURCE, reason, message, at=now, **kw))  # type: ignore[arg-type]

        removed = 0
        for bad in view.bad:
            data = {"key": printable(bad.key), "value": printable(bad.value[:512].decode(errors="replace"))}
            if bad.is_live_record:
                # Another service's leased record: it stays (its owner rewrites it); recorded once.
                if self._warn_once(bad.key, bad.mod_revision, f"job {job}: {bad.reason}"):
                    note(Reason.BAD_RECORD, f"{bad.reason} (leased: kept for its owner to rewrite)", data=data)
                continue
            if bad.key in view.clobbered_nodes:
                # A node's record overwritten without its lease: its agent rewrites it at once; only
                # if none does within the grace is it removed (and the node then counts as lost).
                if len(self._clobbered_since) > 10_000:
                    self._clobbered_since.clear()
                first = self._clobbered_since.setdefault((bad.key, bad.mod_revision), now)
                left = first + self.settings.clobbered_node_grace_s - now
                if left > 0:
                    if self._warn_once(bad.key, bad.mod_revision, f"job {job}: {bad.reason}"):
                        note(Reason.BAD_RECORD, f"{bad.reason} (its agent has {left:.0f}s to rewrite it)", data=data)
                    self._jobs.queue.add_after(job, left)
                    continue
                self._clobbered_since.pop((bad.key, bad.mod_revision), None)
            if removed >= limits.bad_keys_per_pass:
                more = True
                continue
            removed += 1
            note(Reason.BAD_RECORD, bad.reason, data=data)
            ops.append(Delete(bad.key))
        for uid in sorted(view.other_runs)[: limits.cleanups_per_pass]:
            # Leftovers of an earlier run of this name: never read as ours, removed.
            ops.append(DeletePrefix(self.keys.run_prefix(RunRef(job, uid))))
        more = more or len(view.other_runs) > limits.cleanups_per_pass

        if view.status is not None and view.status.state in (pb.JOB_SUCCEEDED, pb.JOB_FAILED):
            finished = ts_to_s(view.status.finished_at)
            if now - finished >= self.settings.retention_s:
                # The whole job goes: its record, every run's keys and its events.
                await self._commit(view, job_removal_ops(self.keys, job), [])
                log.info("removed finished job %s (run %s) after the retention period", job, run.uid)
            else:
                if ops or ev:
                    await self._commit(view, ops, ev)
                self._jobs.queue.add_after(job, finished + self.settings.retention_s - now)
            return

        rec = recovery_from_pb(view.recovery) if view.recovery is not None else Recovery()
        uuid = view.recovery.uuid if view.recovery is not None else ""
        floor = view.epoch_floor()
        rebuilt = view.recovery is None and floor > 0
        if rebuilt:
            # The recovery record is gone or was bad, but epochs were used: rebuild it above every
            # epoch any record names, so no epoch repeats (docs/adr/0021).
            clobbered = any(b.kind is KeyKind.RECOVERY for b in view.bad)
            seq = max((c.seq for c in view.commands.values()), default=0)
            rec = Recovery(epoch=floor, recovery_id=floor, command_seq=seq)
            uuid = f"{time.time_ns():X}-{secrets.token_hex(8)}"
            note(
                "recovery_rebuilt",
                f"the recovery record was {'bad' if clobbered else 'missing'}; rebuilt at epoch {floor}"
                " (the highest epoch that the run's other records name)",
                epoch=floor,
            )
        before = rec
        effects: list[Effect] = []
        timeouts = job_timeouts(view.spec.policy, self.settings.timeouts)

        def apply(event: Event) -> None:
            nonlocal rec
            try:
                rec, produced = step(rec, event, now, timeouts)
            except RecoverdError as err:
                note(err.reason, err.detail, epoch=rec.epoch, phase=rec.phase.value)
                return
            effects.extend(produced)

        live = live_participants(view)
        world = view.spec.world_size
        generations = {r.rank: r.generation for nr in view.ranks.values() for r in nr.ranks}

        # 1. Faults: validated, then merged (the keys are consumed either way), a bounded number
        #    per pass, oldest first; the rest are merged by the next pass (the fault window holds).
        faults = sorted(view.faults.items(), key=lambda item: (ts_to_s(item[1].detected_at), item[0]))
        more = more or len(faults) > limits.faults_per_pass
        for key, fault in faults[: limits.faults_per_pass]:
            ops.append(Delete(key))
            if not 0 <= fault.rank < world:
                err = UnknownRank(f"fault {fault.fault_id} names rank {fault.rank}; the job has ranks 0..{world - 1}")
                note(err.reason, err.detail, node=fault.node)
                continue
            if fault.generation < generations.get(fault.rank, 0):
                note(
                    Reason.STALE_EPOCH,
                    f"fault {fault.fault_id} is for generation {fault.generation} of rank {fault.rank},"
                    f" which already runs generation {generations[fault.rank]}",
                    rank=fault.rank,
                )
                continue
            if not fault.node:
                # A client reports ranks, not nodes: the rank tables say where each rank runs.
                fault.node = next((n for n, t in view.ranks.items() if any(r.rank == fault.rank for r in t.ranks)), "")
            apply(FaultReported(fault_from_pb(fault), live))
            if fault.stacks:
                # The fault key is consumed and the recovery record keeps no stacks: they are kept
                # once, bounded, in an event (docs/adr/0026).
                stacks = hangstacks.bounded(fault.stacks, keep_rank=fault.rank)
                note(
                    hangstacks.REASON,
                    hangstacks.event_message(fault, stacks),
                    epoch=rec.epoch,
                    rank=fault.rank,
                    node=fault.node,
                    data=hangstacks.event_data(fault, rec.recovery_id, stacks),
                )

        # 1b. A node whose lease expired while its ranks ran: each of its running ranks is a fault.
        for lost in lost_node_faults(view, now):
            apply(FaultReported(lost, live))

        # 2. Who is still there.
        if rec.is_active and live != rec.participants:
            apply(ParticipantsChanged(live))

        # 2b. A node sent a command in this phase whose agent is gone (its lease expired, or its
        #     record was removed; a clobbered record counts as live for its grace, as in 1b): the
        #     strategy fails now, not at the recover deadline (the state machine says which count).
        if rec.phase is Phase.RECOVERING and (gone := rec.command_nodes - view.nodes.keys()):
            apply(CommandedNodeLost(rec.epoch, frozenset(gone)))

        # 3. Answers to the current phase; anything for another epoch is stale.
        expected = {
            Phase.STOPPING: pb.REPORT_STOP_COMPLETE,
            Phase.GLOBAL_FAULT: pb.REPORT_STRATEGIES,
            Phase.RECOVERING: pb.REPORT_RECOVER_STATUS,
        }
        epoch_changed = rec.epoch != before.epoch
        stale = 0
        for key, report in sorted(view.reports.items()):
            if epoch_changed and report.epoch == before.epoch:
                continue  # answers to the epoch this pass closed: expected, removed with the prefix below
            if report.epoch != rec.epoch:
                if stale >= limits.stale_reports_per_pass:
                    more = True
                    continue
                stale += 1
                note(
                    Reason.STALE_EPOCH,
                    f"report {pb.ReportKind.Name(report.kind)} from {report.participant} for epoch {report.epoch};"
                    f" current epoch is {rec.epoch}",
                    epoch=report.epoch,
                )
                ops.append(Delete(key))
                continue
            if expected.get(rec.phase) != report.kind:
                continue
            if report.kind == pb.REPORT_STOP_COMPLETE:
                apply(StopCompleted(report.epoch, report.participant, report.code))
            elif report.kind == pb.REPORT_STRATEGIES:
                apply(StrategiesReported(report.epoch, report.participant, tuple(report.strategies)))
            else:
                apply(
                    RecoverStatusReported(
                        report.epoch, report.participant, report.code, report.strategy, report.message
                    )
                )

        # 4. The selector's decision.
        nodes = job_nodes(view)
        layout = job_layout(view)
        empty = [node for node, table in sorted(view.ranks.items()) if node not in view.nodes and not table.ranks]
        for node in empty[: limits.cleanups_per_pass]:
            ops.append(Delete(self.keys.ranks(run, node)))  # a dead agent that held nothing
        more = more or len(empty) > limits.cleanups_per_pass
        if rec.phase is Phase.DECIDING and rec.epoch in view.decisions:
            decision = view.decisions[rec.epoch]
            moves = tuple((m.from_node, m.to_node) for m in decision.moves)
            apply(
                DecisionMade(
                    rec.epoch, decision.strategy, tuple(decision.reasons), decision.give_up, nodes, moves, layout
                )
            )

        # 5. Time.
        if rec.deadline_at is not None and now >= rec.deadline_at:
            apply(DeadlinePassed(rec.epoch, nodes, layout))

        # 5b. Capacity is back while ranks are isolated by a downgrade: scale out again.
        if rec.phase is Phase.DONE and rec.isolated and layout.spares and not all_succeeded(view, rec):
            apply(CapacityReturned(layout))

        # 6. The end of the job: every rank of every node exited 0 and nothing is being recovered.
        if rec.phase is Phase.DONE and not view.faults and all_succeeded(view, rec):
            effects.append(FinishJob(succeeded=True, reason="every rank exited 0"))
            effects.append(EmitEvent("job_succeeded", f"all {world} ranks exited 0"))

        if rec != before and rec.epoch != before.epoch:
            uuid = f"{time.time_ns():X}-{secrets.token_hex(8)}"
            # Answers to an older epoch are consumed now, so a late one is recognisably stale.
            ops.append(DeletePrefix(self.keys.reports_prefix(run)))
        if rec != before or rebuilt:
            ops.append(Put(self.keys.recovery(run), encode(recovery_to_pb(rec, uuid))))
            if rec.phase is not before.phase:
                note("phase", f"{before.phase} -> {rec.phase}", epoch=rec.epoch, phase=rec.phase.value)
        ops.extend(
            effect_ops(
                effects,
                keys=self.keys,
                view=view,
                run=run,
                rec=rec,
                uuid=uuid,
                now=now,
                note=note,
                settings=self.settings,
            )
        )
        if ops or ev:
            await self._commit(view, ops, ev)
        if more:
            self._jobs.queue.add(job)
        if rec.deadline_at is not None:
            self._jobs.queue.add_after(job, rec.deadline_at - now)
        if rec.phase in (Phase.DONE, Phase.FAILED) and before.phase is not rec.phase:
            await events.prune(self.store, self.keys, run, self.settings.event_cap)

    async def _commit(self, view: JobView, ops: list[Op], ev: list[Put]) -> None:
        """Commit one pass's writes (``commit.commit``); a pass the job changed under is queued to
        run again on a fresh read."""
        assert view.spec is not None
        if not await commit(self.store, self.keys, self.leadership, view, ops, ev):
            self._jobs.queue.add(view.spec.name)

    def _warn_once(self, key: str, mod_revision: int, message: str) -> bool:
        """Log a bad key that is kept (not removed) once per value; True the first time."""
        if self._warned.get(key) == mod_revision:
            return False
        if len(self._warned) > 10_000:
            self._warned.clear()
        self._warned[key] = mod_revision
        log.warning("%s", printable(message))
        return True
