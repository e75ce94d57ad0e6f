"""The agent's outbox: what it must tell etcd, kept until etcd has it.

Faults and events are queued in memory and written with the node's rank table by one publisher
task; while etcd is away they stay queued and are retried with backoff, so a fault detected during
an etcd outage is reported when etcd returns, never lost. A write is split into transactions that
respect etcd's 128-operation limit (70 ranks failing at once is 140 writes), rank table first.
Every transaction is fenced on this agent's registration (membership.fence()): an agent whose
node was declared lost, or taken over by a restarted agent, can overwrite nothing. The rank table's
write is also fenced on the revision of this agent's last write of it: a write abandoned on a hung
etcd member may still be applied when that member resumes, after newer tables were written through
another member; fenced so, it fails there instead of putting an old table back (docs/adr/0043).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence

from recoverd import events
from recoverd.errors import FenceLost, RecoverdError
from recoverd.keys import Keyspace, RunRef
from recoverd.records import encode, pb
from recoverd.store import Compare, ModRevisionAtMost, Op, Put, Store

__all__ = ["Outbox"]

log = logging.getLogger(__name__)

#: Operations per transaction: below etcd's default --max-txn-ops (128), with room to spare.
TXN_OPS = 100


class Outbox:
    """Queued faults and events of one node, published with its rank table."""

    def __init__(
        self,
        store: Store,
        keys: Keyspace,
        node: str,
        source: str,
        rank_table: Callable[[], pb.NodeRanks],
        fence: Callable[[], list[Compare]],
        on_fence_lost: Callable[[], Awaitable[None]],
        *,
        retry_s: float = 0.1,
        retry_max_s: float = 2.0,
    ) -> None:
        self.store = store
        self.keys = keys
        self.node = node
        self.source = source
        self.run: RunRef | None = None
        self._rank_table = rank_table
        self._fence = fence
        self._on_fence_lost = on_fence_lost
        self._retry_s = retry_s
        self._retry_max_s = retry_max_s
        self._faults: list[pb.Fault] = []
        self._events: list[Put] = []
        self._dirty = asyncio.Event()
        #: While a command runs, rank-table changes wait for its one write (:meth:`holding`).
        self._held = 0
        #: Changes counted (table, faults, events) and the count the last flush started from: a
        #: wake-up with nothing newer than the last flush writes nothing.
        self._changes = 0
        self._flushed = 0
        #: The revision of this agent's last committed write of the rank table (0: none yet).
        self._table_rev = 0

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Rank-table changes made inside wait for the flush that ends it (a command's stops and
        starts are published once, with its ack: one write per commanded node, docs/scale.md).
        Faults are never held: one pending publishes everything at once."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            if not self._held and self._changes > self._flushed:
                self._dirty.set()  # a change after the last flush: publish it now

    def mark_dirty(self) -> None:
        """The rank table changed: publish it."""
        self._changes += 1
        self._dirty.set()

    def add_fault(self, fault: pb.Fault) -> None:
        self._faults.append(fault)
        self.mark_dirty()

    def add_event(self, put: Put) -> None:
        self._events.append(put)
        self.mark_dirty()

    def note(self, reason: str, message: str) -> None:
        """Log a warning and record it as an event of this node."""
        assert self.run is not None
        log.warning("agent %s: %s", self.node, message)
        self.add_event(events.event_put(self.keys, self.run, self.source, reason, message))

    @property
    def pending_faults(self) -> list[pb.Fault]:
        return list(self._faults)

    async def flush(self, also: Sequence[Op] = ()) -> None:
        """Write the rank table, then the pending faults and events, in as few transactions as fit.

        ``also``: writes that must commit together with the rank table (a command's ack: the table
        then matches the ack a restarted agent reads, and a node confirms a command in one write).
        Each transaction's faults and events leave the queue once it committed, so a flush cut short
        by an outage resumes where it stopped and never writes a consumed fault again.
        """
        assert self.run is not None
        # The table as of now is what this flush writes: every change counted so far is covered (a
        # change after this point counts again). If the flush fails, nothing counts as flushed.
        changes = self._changes
        try:
            await self._flush(also)
        except BaseException:
            self._dirty.set()
            raise
        self._flushed = max(self._flushed, changes)

    async def _flush(self, also: Sequence[Op]) -> None:
        assert self.run is not None
        table_key = self.keys.ranks(self.run, self.node)
        ops: list[Op] = [Put(table_key, encode(self._rank_table())), *also]
        adopted = False
        while True:
            faults = self._faults[: (TXN_OPS - len(ops)) // 2]
            for fault in faults:
                ops.append(Put(self.keys.fault(self.run, fault.fault_id), encode(fault)))
                ops.append(
                    events.event_put(
                        self.keys,
                        self.run,
                        self.source,
                        "fault_detected",
                        f"rank {fault.rank} {fault.detail}",
                        rank=fault.rank,
                        node=self.node,
                    )
                )
            evs = self._events[: TXN_OPS - len(ops)]
            ops.extend(evs)
            has_table = ops[0].key == table_key if ops and isinstance(ops[0], Put) else False
            fence = self._fence()
            if has_table and self._table_rev:
                fence = [*fence, ModRevisionAtMost(table_key, self._table_rev)]
            result = await self.store.txn(fence, ops) if ops else None
            if result is not None and not result.succeeded:
                current = await self.store.get(table_key) if has_table and not adopted else None
                if current is not None and current.mod_revision > self._table_rev:
                    # Written since our last write: by an earlier write of ours that etcd applied
                    # late (a hung member resumed). Ours is newer: write it again over that one.
                    self._table_rev, adopted = current.mod_revision, True
                    del ops[len(ops) - len(faults) * 2 - len(evs) :]
                    continue
                raise FenceLost(f"node {self.node}: a write was refused, its registration is not this agent's")
            if result is not None and has_table:
                self._table_rev = result.revision
            del self._faults[: len(faults)]
            del self._events[: len(evs)]
            if not self._faults and not self._events:
                return
            ops = []

    async def publish(self) -> None:
        """Keep etcd's view of this node's ranks current; keep every fault until it is written."""
        delay = self._retry_s
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            if self._changes <= self._flushed:
                continue  # a flush since (a command's, with its ack) wrote it all
            if self._held and not self._faults:
                continue  # a command is running: its flush writes the table (and the events) once
            try:
                await self.flush()
                delay = self._retry_s
            except FenceLost as err:
                log.warning("agent %s: %s", self.node, err.detail)
                with contextlib.suppress(RecoverdError):  # etcd may be flaky right now: next round
                    await self._on_fence_lost()
                self._dirty.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry_max_s)
            except RecoverdError as err:  # unavailable, or a refusal (too many requests, no space)
                log.info("agent %s: cannot publish (%s); retrying within %.2fs", self.node, err, delay)
                self._dirty.set()
                await asyncio.sleep(self._retry_s)  # never spin; then as soon as etcd answers again
                await self.store.wait_retry(delay - self._retry_s)
                delay = min(delay * 2, self._retry_max_s)
