"""Event records: one line of a job's incident log, written by whichever service saw it happen.

Events are written in the same transaction as the change they describe where there is one (the
coordinator's), so the log never claims something that did not commit. Event ids sort by time
(nanoseconds since the epoch, then the writer and a per-process counter), so ``recoverctl events``
is a range read in order. The coordinator caps the number kept per run (``prune``).
"""

from __future__ import annotations

import itertools
import os
import time

from recoverd.keys import Keyspace, RunRef, printable
from recoverd.records import encode, pb, ts_from_s
from recoverd.store import Delete, Put, Store

__all__ = ["event_put", "prune", "write_event"]

_counter = itertools.count()


def event_put(
    keys: Keyspace,
    run: RunRef,
    source: str,
    reason: str,
    message: str,
    *,
    epoch: int = 0,
    phase: str = "",
    rank: int | None = None,
    node: str = "",
    data: dict[str, str] | None = None,
    at: float | None = None,
) -> Put:
    """The put operation for one event (to add to a transaction, or write alone)."""
    at = time.time() if at is None else at
    # printable: a message may quote a key holding bytes that are not UTF-8 (protobuf refuses those).
    event = pb.Event(
        at=ts_from_s(at),
        source=source,
        reason=reason,
        message=printable(message),
        epoch=epoch,
        phase=phase,
        node=printable(node),
    )
    if rank is not None:
        event.rank = rank
    if data:
        event.data.update({printable(k): printable(v) for k, v in data.items()})
    event_id = f"{int(at * 1e9):020d}-{source.replace('/', '.')}-{os.getpid()}-{next(_counter):010d}"
    return Put(keys.event(run, event_id), encode(event))


async def write_event(
    store: Store, keys: Keyspace, run: RunRef, source: str, reason: str, message: str, **kw: object
) -> None:
    op = event_put(keys, run, source, reason, message, **kw)  # type: ignore[arg-type]
    await store.put(op.key, op.value)


async def prune(store: Store, keys: Keyspace, run: RunRef, cap: int) -> int:
    """Delete the oldest events of ``run`` beyond ``cap``; returns how many were deleted."""
    snap = await store.get_prefix(keys.events_prefix(run), keys_only=True)  # values are not needed
    excess = len(snap.kvs) - cap
    if excess <= 0:
        return 0
    ops = [Delete(kv.key) for kv in snap.kvs[:excess]]
    for start in range(0, len(ops), 100):
        await store.txn([], ops[start : start + 100])
    return excess
