"""The coordinator's shell: one leader, a watch-driven queue of jobs, one fenced pass per job.

Level-triggered (Kubernetes-controller style): a watch on ``jobs/`` only enqueues the job a changed
key belongs to, and keeps every job's keys (``recoverd.jobcache``); a worker takes the job's keys as
of one revision and runs one pass:

1. view the job from the watch-fed cache (``JobController.view``; decoded once per changed key, and
   never older than this coordinator's own last write to it: docs/adr/0029);
2. screen bad keys (``badkeys.py``) and remove an earlier run's leftovers; hold as live the nodes
   whose lease expired while etcd was in trouble (``leasehold.py``, docs/adr/0045);
3. a finished job: remove it whole once its retention has passed, else wait for that;
4. otherwise turn the read into state-machine inputs and fold them through
   :func:`recovery.step` (``fold.py``, from ``observe.py``), and build the writes: the new
   recovery record and what the effects mean in etcd (``writes.py``);
5. commit them as one transaction fenced by the leader key and the revision read (``commit.py``);
6. queue the job again for what was left, and for its next deadline.

If the fence fails the pass is dropped and re-run from a fresh view; it is never patched. A missed
watch event costs nothing: after a resync every job is enqueued once, and phase deadlines are
timers that enqueue the job. A pass never exceeds etcd's limits (docs/adr/0019): it consumes at
most a bounded number of keys of each kind (faults, bad keys, stale reports, cleanups) and requeues
the job for the rest, and ``commit.py`` splits what does not fit in one transaction.

Only the leader reconciles (``leadership.py``): a term enqueues every job, watches ``jobs/`` and
the leader key, and works the queue until the fence or the lease is lost.
"""

from __future__ import annotations

import asyncio
import logging
import time

from recoverd import events, logs
from recoverd.aiotools import supervised_group
from recoverd.controller import JobController
from recoverd.coordinator import telemetry
from recoverd.coordinator.badkeys import BadKeys
from recoverd.coordinator.commit import commit
from recoverd.coordinator.fold import Fold
from recoverd.coordinator.leadership import Leadership, raise_expected_end, raise_when_lost
from recoverd.coordinator.leasehold import LeaseHold
from recoverd.coordinator.observe import finished_at
from recoverd.coordinator.settings import CoordinatorSettings
from recoverd.coordinator.writes import job_removal_ops
from recoverd.errors import FenceLost
from recoverd.etcd_health import EtcdHealth
from recoverd.jobview import DecodeMemo, JobView
from recoverd.keys import Keyspace
from recoverd.store import Op, Put, Store

__all__ = ["Coordinator"]

log = logging.getLogger(__name__)


class Coordinator:
    """The leader-elected recovery coordinator. ``await Coordinator(...).run()`` until cancelled."""

    def __init__(self, store: Store, keys: Keyspace, settings: CoordinatorSettings | None = None) -> None:
        self.store = store
        self.keys = keys
        self.settings = settings or CoordinatorSettings()
        self.leadership = Leadership(store, keys, self.settings.lease_ttl_s)
        self._bad_keys = BadKeys(self.settings)
        #: Whether etcd itself was in trouble lately, and the nodes held because of it (ADR 0045).
        self.etcd_health = EtcdHealth(store)
        self._hold = LeaseHold(self.settings.etcd_trouble_grace_s)
        #: Decoded records, kept across terms: a re-elected coordinator does not decode 4,000 again.
        self._memo = DecodeMemo()
        self._jobs = self._controller()

    def _controller(self) -> JobController:
        """A fresh queue and job cache per term (a new leader starts from a full read)."""
        return JobController(
            self.store, self.keys, self.reconcile, name="coordinator", fatal=(FenceLost,), cached=True, memo=self._memo
        )

    # ---------------------------------------------------------------- leadership
    async def run(self) -> None:
        """Campaign for the leader key; while leader, reconcile; on losing it, campaign again.
        etcd's health is watched throughout (a standby's view is ready when it takes over)."""
        async with supervised_group() as group:
            if self.settings.etcd_trouble_grace_s > 0:
                group.create_task(self.etcd_health.run(), name="coordinator-etcd-health")
            group.create_task(self.leadership.run(self._lead), name="coordinator-leadership")

    async def _lead(self, lease_lost: asyncio.Event) -> None:
        """One term: enqueue every job once, then watch ``jobs/`` and the leader key and work the
        queue, until the fence or the lease is lost."""
        self._jobs = self._controller()
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
        view = await self._jobs.view(job)
        with logs.bound(job=job, run=view.run.uid if view.run is not None else None):
            await self._reconcile(job, view)

    async def _reconcile(self, job: str, view: JobView) -> None:  # from the watch, as of the last event (docs/adr/0029)
        now = time.time()
        if view.spec is None or view.run is None:
            if view.spec_error:
                self._bad_keys.warn_once(view.bad[0].key, view.bad[0].mod_revision, f"job {job}: {view.spec_error}")
            return
        held = self._hold.apply(view, now, self.etcd_health.last)
        fold = Fold(self.keys, view, now, self.settings)
        for delay in self._bad_keys.screen(fold):
            self._jobs.queue.add_after(job, delay)
        fold.held_nodes = held.nodes
        for node, trouble in held.new:
            fold.note(
                "node_held",
                f"node {node}'s lease expired while etcd was in trouble ({trouble}): held as live for"
                f" {self.settings.etcd_trouble_grace_s:g}s for its agent to register again",
                node=node,
            )
            log.warning("job %s: node %s vanished while etcd was in trouble (%s): held", job, node, trouble)
        if held.wake_after_s is not None:
            self._jobs.queue.add_after(job, held.wake_after_s)
        fold.remove_other_runs()
        finished = finished_at(view)
        if finished is not None:
            await self._retire(fold, finished)
            return
        fold.load_recovery()
        fold.fold_inputs()
        fold.write()
        if (fold.ops or fold.ev) and await self._commit(view, fold.ops, fold.ev):
            telemetry.record(telemetry.observe(fold.before, fold.rec, now))
        await self._follow_up(fold)

    async def _retire(self, fold: Fold, finished: float) -> None:
        """A finished job goes whole (its record, every run's keys, its events) once its retention
        has passed; until then only the screening's writes are committed, and the job waits."""
        job, retention_s = fold.run.job, self.settings.retention_s
        if fold.now - finished >= retention_s:
            await self._commit(fold.view, job_removal_ops(self.keys, job), [])
            log.info("removed finished job %s (run %s) after the retention period", job, fold.run.uid)
            return
        if fold.ops or fold.ev:
            await self._commit(fold.view, fold.ops, fold.ev)
        self._jobs.queue.add_after(job, finished + retention_s - fold.now)

    async def _follow_up(self, fold: Fold) -> None:
        """After the commit: the job again at once if keys were left, and at its next deadline;
        the run's oldest events pruned when a recovery closed."""
        job = fold.run.job
        if fold.more:
            self._jobs.queue.add(job)
        if fold.rec.deadline_at is not None:
            self._jobs.queue.add_after(job, fold.rec.deadline_at - fold.now)
        if fold.has_closed:
            await events.prune(self.store, self.keys, fold.run, self.settings.event_cap)

    async def _commit(self, view: JobView, ops: list[Op], ev: list[Put]) -> bool:
        """Commit one pass's writes (``commit.commit``); a pass the job changed under is queued to
        run again on a fresh read (False)."""
        assert view.spec is not None
        written = await commit(self.store, self.keys, self.leadership, view, ops, ev)
        if written is None:
            self._jobs.queue.add(view.spec.name)
            return False
        self._jobs.written(view.spec.name, written)
        return True
