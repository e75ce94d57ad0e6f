"""Leader election for coordinator replicas: campaign, stand by, hold the fence, lose it.

Exactly one coordinator acts. Each replica campaigns by creating the leader key under a lease of
its own; the winner leads until its lease is lost or the key is deleted or taken over, and every
write it makes compares the key with the value it wrote (:meth:`Leadership.fence`), so a deposed
leader that has not noticed yet can change nothing. A standby watches the key and campaigns again
when it is gone. Losing the leadership, or etcd, ends a term with :class:`FenceLost` (or another
``RecoverdError``); the campaign loop catches it and runs again, so nothing here ends the process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable

from recoverd import metrics
from recoverd.aiotools import leaf_errors
from recoverd.errors import FenceLost, RecoverdError
from recoverd.keys import Keyspace
from recoverd.records import encode, pb, ts_from_s
from recoverd.store import Resync, Store, ValueIs

__all__ = ["Leadership", "raise_expected_end", "raise_when_lost"]

log = logging.getLogger(__name__)


class Leadership:
    """One replica's claim on the leader key. ``value`` is the key's value while this replica
    leads (b"" otherwise); ``is_leader`` is set for the length of a term."""

    def __init__(self, store: Store, keys: Keyspace, lease_ttl_s: float) -> None:
        self.store = store
        self.keys = keys
        self.lease_ttl_s = lease_ttl_s
        self.identity = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.is_leader = asyncio.Event()
        self.value = b""

    async def run(self, lead: Callable[[asyncio.Event], Awaitable[None]]) -> None:
        """Campaign for the leader key; while leader, ``await lead(lease_lost)``; on losing it,
        campaign again. Runs until cancelled."""
        while True:
            try:
                async with self.store.lease(self.lease_ttl_s) as lease:
                    leader = pb.Leader(
                        holder=self.identity, host=socket.gethostname(), pid=os.getpid(), since=ts_from_s(time.time())
                    )
                    value = encode(leader)
                    if await self.store.create(self.keys.leader(), value, lease=lease.id):
                        self.value = value
                        log.info("coordinator %s is the leader", self.identity)
                        self.is_leader.set()
                        metrics.LEADER.set(1)
                        metrics.LEADER_CHANGES.labels("gained").inc()
                        await lead(lease.lost)
                    else:
                        await self._wait_for_vacancy(lease.lost)
            except FenceLost as err:
                log.warning("coordinator %s lost the leadership: %s", self.identity, err)
            except RecoverdError as err:
                log.warning("coordinator %s: %s; retrying", self.identity, err)
                await asyncio.sleep(min(1.0, self.lease_ttl_s / 3))
            finally:
                if self.is_leader.is_set():
                    metrics.LEADER_CHANGES.labels("lost").inc()
                metrics.LEADER.set(0)
                self.is_leader.clear()
                self.value = b""

    def fence(self) -> ValueIs:
        """The compare every write of this leader carries: the leader key still holds our value."""
        return ValueIs(self.keys.leader(), self.value)

    async def check(self) -> None:
        """Raise FenceLost unless this coordinator still holds the leader key."""
        current = await self.store.get(self.keys.leader())
        if current is None or current.value != self.value:
            raise FenceLost("a write was rejected: this coordinator no longer holds the leader key")

    async def watch(self, start: int) -> None:
        """Raise FenceLost as soon as the leader key is deleted or changes hands (from revision
        ``start``; after a watch gap, from a fresh read)."""
        async for item in self.store.watch_prefix(self.keys.leader(), start):
            if isinstance(item, Resync):
                current = await self.store.get(self.keys.leader())
                if current is None or current.value != self.value:
                    raise FenceLost("the leader key changed hands while the watch was down")
            elif item.is_delete or item.value != self.value:
                raise FenceLost("the leader key was deleted or taken over")

    async def _wait_for_vacancy(self, lease_lost: asyncio.Event) -> None:
        """Standby: wait until the leader key is gone (or our own lease is lost), then campaign."""
        current = await self.store.get(self.keys.leader())
        if current is None:
            return
        watcher = asyncio.create_task(self._watch_until_deleted(self.keys.leader(), current.mod_revision + 1))
        lost = asyncio.create_task(lease_lost.wait())
        try:
            await asyncio.wait({watcher, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (watcher, lost):
                task.cancel()
            await asyncio.gather(watcher, lost, return_exceptions=True)

    async def _watch_until_deleted(self, key: str, start: int) -> None:
        async for item in self.store.watch_prefix(key, start):
            if isinstance(item, Resync):
                if await self.store.get(key) is None:
                    return
            elif item.key == key and item.is_delete:
                return


async def raise_when_lost(lost: asyncio.Event) -> None:
    """A term's task that ends it when the leader lease is lost."""
    await lost.wait()
    raise FenceLost("the leader lease expired")


def raise_expected_end(group: BaseExceptionGroup) -> None:
    """A term's task group failed: if every failure is a ``RecoverdError`` (the fence or etcd was
    lost, which is expected and leads to a new campaign), raise the first FenceLost, else the
    first of them, alone; otherwise return, and the caller re-raises the group."""
    leaves = leaf_errors(group)
    for wanted in (FenceLost, RecoverdError):
        if all(isinstance(e, RecoverdError) for e in leaves):
            first = next((e for e in leaves if isinstance(e, wanted)), None)
            if first is not None:
                raise first from None
