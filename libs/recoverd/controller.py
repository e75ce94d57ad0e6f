"""The reconcile loop shared by the coordinator and the strategy selector (Kubernetes-controller style).

A watch on ``jobs/`` only enqueues the job a changed key belongs to; a worker takes one job at a
time from a de-duplicating queue and calls ``reconcile(job)``, which reads the job's current state
and acts on it. A resync (after a reconnect or a compaction) enqueues every job once, so a missed
event costs nothing. Errors are sorted (sample-controller style):

* etcd unreachable (:class:`EtcdUnavailable`): retried with capped backoff;
* etcd refused the request (:class:`EtcdRefused`, e.g. a transaction over its limits): logged as an
  error and NOT retried: the same pass would build the same request (a retry loop every 2 s was the
  old behaviour); the next change to the job runs a new pass;
* any other :class:`RecoverdError` is bad input: logged and not retried (a retry cannot fix it);
* an unexpected exception is logged with its traceback and retried;
* exceptions of the ``fatal`` types (the coordinator's FenceLost) end the loop.

With ``cached=True`` the controller keeps every job's keys from its watch (:class:`JobCache`) and
:meth:`view` builds a pass's view from them instead of reading etcd (docs/adr/0029). A reconciler
that wrote at revision R says so (:meth:`written`), and its next view of that job waits until the
watch has brought R back, so it never starts from a state older than its own write.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from recoverd.errors import EtcdRefused, EtcdUnavailable, RecoverdError
from recoverd.jobcache import JobCache
from recoverd.jobview import DecodeMemo, JobView, build_view, read_job
from recoverd.keys import Keyspace
from recoverd.store import Resync, Store
from recoverd.workqueue import WorkQueue

__all__ = ["JobController"]

log = logging.getLogger(__name__)


class JobController:
    def __init__(
        self,
        store: Store,
        keys: Keyspace,
        reconcile: Callable[[str], Awaitable[None]],
        *,
        name: str,
        fatal: tuple[type[BaseException], ...] = (),
        cached: bool = False,
        memo: DecodeMemo | None = None,
        lag_timeout_s: float = 0.3,
    ) -> None:
        self.store = store
        self.keys = keys
        self.reconcile = reconcile
        self.name = name
        self.fatal = fatal
        self.queue: WorkQueue[str] = WorkQueue()
        self.cache = JobCache(keys, memo) if cached else None
        #: How long a view waits for the watch to bring back a write before reading etcd instead.
        self.lag_timeout_s = lag_timeout_s
        #: job -> the revision of the reconciler's last write to it (its next view must include it).
        self._written: dict[str, int] = {}

    async def enqueue_all(self) -> int:
        """Enqueue every job once; return the revision of the read (watch from the next one)."""
        if self.cache is not None:
            snap = await self.store.get_prefix(self.keys.jobs_prefix())
            jobs = self.cache.load(snap)
        else:
            snap = await self.store.get_prefix(self.keys.jobs_prefix(), keys_only=True)  # names are enough
            jobs = {job for kv in snap.kvs if (job := self.keys.job_of(kv.key))}
        for job in sorted(jobs):
            self.queue.add(job)
        return snap.revision

    async def watch(self, start_revision: int) -> None:
        async for item in self.store.watch_prefix(self.keys.jobs_prefix(), start_revision):
            if isinstance(item, Resync):
                await self.enqueue_all()
                continue
            job = self.cache.apply(item) if self.cache is not None else self.keys.job_of(item.key)
            if job:
                self.queue.add(job)

    def written(self, job: str, revision: int) -> None:
        """The reconciler wrote ``job``'s keys at ``revision``: its next view must include that."""
        self._written[job] = max(revision, self._written.get(job, 0))

    async def view(self, job: str) -> JobView:
        """The job as a pass starts from: from the cache when there is one, else read from etcd."""
        if self.cache is None:
            return await read_job(self.store, self.keys, job)
        needed = self._written.get(job, 0)
        if self.cache.revision < needed:
            try:
                await asyncio.wait_for(self.cache.reached(needed), self.lag_timeout_s)
            except TimeoutError:
                # The watch lags (reconnecting after etcd came back, say): read etcd itself, still
                # decoding only what changed.
                snap = await self.store.get_prefix(self.keys.job_prefix(job))
                return build_view(self.keys, job, snap.kvs, snap.revision, self.cache.memo)
        await self.cache.warm(job)
        return self.cache.view(job)

    async def work(self) -> None:
        while True:
            job = await self.queue.get()
            try:
                await self.reconcile(job)
                self.queue.forget(job)
            except self.fatal:
                raise
            except EtcdUnavailable as err:
                delay = self.queue.retry(job)
                log.info("%s: pass for %s: %s; retrying in %.2fs", self.name, job, err, delay)
            except EtcdRefused as err:
                self.queue.forget(job)
                log.error("%s: pass for %s refused by etcd, not retried: %s", self.name, job, err)
            except RecoverdError as err:
                self.queue.forget(job)
                log.warning("%s: pass for %s: bad input, not retried: %s", self.name, job, err)
            except Exception:
                delay = self.queue.retry(job)
                log.exception("%s: internal error on %s; retrying in %.2fs", self.name, job, delay)
            finally:
                self.queue.done(job)

    def close(self) -> None:
        self.queue.close()
