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
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from recoverd.errors import EtcdRefused, EtcdUnavailable, RecoverdError
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
    ) -> None:
        self.store = store
        self.keys = keys
        self.reconcile = reconcile
        self.name = name
        self.fatal = fatal
        self.queue: WorkQueue[str] = WorkQueue()

    async def enqueue_all(self) -> int:
        """Enqueue every job once; return the revision of the read (watch from the next one)."""
        snap = await self.store.get_prefix(self.keys.jobs_prefix(), keys_only=True)  # names are enough
        for kv in snap.kvs:
            if job := self.keys.job_of(kv.key):
                self.queue.add(job)
        return snap.revision

    async def watch(self, start_revision: int) -> None:
        async for item in self.store.watch_prefix(self.keys.jobs_prefix(), start_revision):
            if isinstance(item, Resync):
                await self.enqueue_all()
            elif job := self.keys.job_of(item.key):
                self.queue.add(job)

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
