"""``recoverctl events JOB --follow``: the run's event log, then every new event as it is written.

The log is read once, at one revision, and shown; a watch of the run's events prefix from the next
revision on shows each new event when etcd delivers it (no polling). Each event is shown once: the
keys shown are remembered while they are stored (a deleted key, the log's cap at work, is
forgotten), so after a :class:`~recoverd.store.Resync` the re-read shows only the events the watch
missed, and a resumed watch that repeats a few does not show them twice. Runs until cancelled
(Ctrl-C: ``recoverctl`` exits 130).

It follows the run that was current when it started: a new run of the same job name (an agent
started again after the job ended) has its own events prefix (docs/keyspace.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from recoverd.cli.reads import decode_event
from recoverd.keys import Keyspace, RunRef
from recoverd.records import pb
from recoverd.store import KV, Resync, Store

__all__ = ["follow_events"]


async def follow_events(store: Store, keys: Keyspace, run: RunRef, show: Callable[[pb.Event], None]) -> None:
    """Call ``show`` with every event of ``run``, stored or new, oldest first, each once."""
    prefix = keys.events_prefix(run)
    shown: set[str] = set()

    def show_new(kvs: Iterable[KV]) -> None:
        for kv in kvs:
            if kv.key in shown:
                continue
            shown.add(kv.key)
            if (event := decode_event(kv)) is not None:
                show(event)

    snap = await store.get_prefix(prefix)
    show_new(snap.kvs)
    async for item in store.watch_prefix(prefix, snap.revision + 1):
        if isinstance(item, Resync):
            snap = await store.get_prefix(prefix)
            show_new(snap.kvs)
            shown &= {kv.key for kv in snap.kvs}
        elif item.is_delete:
            shown.discard(item.key)
        else:
            show_new([KV(item.key, item.value, item.mod_revision, item.mod_revision, item.lease)])
