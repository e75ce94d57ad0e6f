"""Every key under ``jobs/``, kept current from one watch: a reconciler's reads without round trips.

Before this, every pass of the coordinator and of the strategy selector read its job's whole prefix
from etcd and decoded every value: at 512 nodes that is ~1,600 keys and ~0.4 s of CPU a pass, and a
recovery runs several passes (docs/scale.md). The cache is filled once from a read of ``jobs/`` at
one revision, then follows the watch that wakes the reconciler anyway; a view of a job is built from
it with a :class:`~recoverd.jobview.DecodeMemo`, so only the values that changed are decoded again.

It stays level-triggered and safe (docs/adr/0029):

* a view is as of ``revision``, the revision of the last event applied; every write of a pass is
  fenced on the job's prefix not having changed after that revision, so a view that lags behind
  etcd costs a retried pass, never a wrong write;
* all events of one etcd revision arrive in one watch response and are applied without yielding to
  the event loop, so a view never holds half of a transaction;
* after a resync (reconnect, compaction) the whole prefix is read again (:meth:`load`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from recoverd.errors import BadRecord
from recoverd.jobview import DecodeMemo, JobView, build_view, warm_memo
from recoverd.keys import Keyspace
from recoverd.records import decode
from recoverd.store import KV, Snapshot, WatchEvent

__all__ = ["JobCache"]


class JobCache:
    """The keys of every job under the prefix, by job, as of :attr:`revision`."""

    def __init__(self, keys: Keyspace, memo: DecodeMemo | None = None) -> None:
        self.keys = keys
        self.revision = 0
        #: Given by the owner to outlive this cache (a coordinator's next term starts warm).
        self.memo = memo if memo is not None else DecodeMemo()
        self._jobs: dict[str, dict[str, KV]] = {}
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._peeked: dict[str, tuple[int, Any]] = {}

    def load(self, snapshot: Snapshot) -> set[str]:
        """Replace everything with a read of ``jobs/`` at one revision; return the jobs seen."""
        jobs: dict[str, dict[str, KV]] = {}
        for kv in snapshot.kvs:
            if (job := self.keys.job_of(kv.key)) is not None:
                jobs.setdefault(job, {})[kv.key] = kv
        self.memo.retain({kv.key for kv in snapshot.kvs})
        self._jobs = jobs
        self._advance(max(self.revision, snapshot.revision))
        return set(jobs)

    def apply(self, event: WatchEvent) -> str | None:
        """Apply one watch event; return the job it belongs to (None: outside any job)."""
        job = self.keys.job_of(event.key)
        if job is not None:
            keys = self._jobs.setdefault(job, {})
            if event.is_delete:
                keys.pop(event.key, None)
                self.memo.forget(event.key)
                if not keys:
                    del self._jobs[job]
            else:
                create = keys[event.key].create_revision if event.key in keys else event.mod_revision
                keys[event.key] = KV(event.key, event.value, event.mod_revision, create, event.lease)
        self._advance(max(self.revision, event.mod_revision))
        return job

    def has(self, job: str, key: str) -> bool:
        return key in self._jobs.get(job, {})

    def peek(self, job: str, key: str, cls: type) -> Any | None:
        """One key's record, decoded (None: absent or undecodable): a cheap look before a whole view.

        Only for deciding whether a pass has anything to do; a pass that acts builds the view, which
        validates every key and reports the bad ones.
        """
        kv = self._jobs.get(job, {}).get(key)
        if kv is None:
            return None
        cached = self._peeked.get(key)
        if cached is not None and cached[0] == kv.mod_revision and isinstance(cached[1], cls):
            return cached[1]
        try:
            record: Any = decode(cls, kv.value, key)
        except BadRecord:
            return None
        if len(self._peeked) > 10_000:
            self._peeked.clear()
        self._peeked[key] = (kv.mod_revision, record)
        return record

    async def warm(self, job: str, slice_keys: int = 64) -> None:
        """Decode what the memo lacks for ``job``, ``slice_keys`` at a time, yielding between."""
        while True:
            if warm_memo(self.keys, job, list(self._jobs.get(job, {}).values()), self.memo, slice_keys) < slice_keys:
                return
            await asyncio.sleep(0)  # let lease keep-alives and watches run between slices

    def view(self, job: str) -> JobView:
        """The job as of :attr:`revision` (decoded, validated: :func:`~recoverd.jobview.build_view`)."""
        keys = self._jobs.get(job, {})
        return build_view(self.keys, job, (keys[k] for k in sorted(keys)), self.revision, self.memo)

    async def reached(self, revision: int) -> None:
        """Return once every event up to ``revision`` has been applied."""
        if self.revision >= revision:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((revision, future))
        try:
            await future
        finally:
            self._waiters = [(r, f) for r, f in self._waiters if f is not future]

    def _advance(self, revision: int) -> None:
        self.revision = revision
        for wanted, future in self._waiters:
            if wanted <= revision and not future.done():
                future.set_result(None)
