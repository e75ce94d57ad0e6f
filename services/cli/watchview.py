"""``recoverctl status JOB --watch``: the job's status again on every change, woken by etcd's watch.

No polling: the job's keys are read once into a :class:`~recoverd.jobcache.JobCache`, then kept
current from a watch of the job's prefix (``jobs/<job>/``), and every change is shown as soon as
its watch response arrives. The keys one etcd transaction writes (a coordinator pass, an agent's
rank table with its ack) arrive in one response and are shown as one update, never half of it: a
pump task moves watch items into a queue without yielding between them, and the loop takes
everything queued before it renders (the coordinator's reconciler does the same, docs/adr/0029).
After a :class:`~recoverd.store.Resync` (reconnect, compaction) the prefix is read again.

It returns once the run has ended (``JOB_SUCCEEDED`` / ``JOB_FAILED``), after showing that final
state; Ctrl-C ends it earlier (``recoverctl`` exits 130). Events live outside ``jobs/`` (docs/keyspace.md),
so writing them wakes nothing here: ``events --follow`` shows those.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from recoverd.cli.reads import checked_view
from recoverd.cli.render import format_status, has_ended
from recoverd.jobcache import JobCache
from recoverd.jobview import JobView
from recoverd.keys import Keyspace
from recoverd.store import Resync, Store, WatchEvent

__all__ = ["frame", "watch_status"]

#: ANSI: cursor home, clear the screen (a terminal shows the latest status in place).
_CLEAR = "\x1b[H\x1b[2J"

_Item = WatchEvent | Resync | Exception


def frame(data: dict[str, Any], *, as_json: bool, is_tty: bool, ended: bool) -> str:
    """One update as printed: a JSON line, the table in place of the last one on a terminal, or the
    table after a ``--- revision N`` line when the output is a pipe or a file (a log of updates)."""
    if as_json:
        return json.dumps(data, separators=(",", ":"))
    table = format_status(data)
    if is_tty:
        footer = "the job has ended" if ended else "watching etcd; Ctrl-C to stop"
        return f"{_CLEAR}{table}\n\n(revision {data['revision']}; {footer})"
    return f"--- revision {data['revision']}\n{table}"


async def watch_status(store: Store, keys: Keyspace, job: str, show: Callable[[JobView], None]) -> JobView:
    """Call ``show`` with the job's view now and after every change; return the final view once the
    run has ended. UnknownJob if the job is not there (or its spec goes bad or away meanwhile)."""
    prefix = keys.job_prefix(job)
    cache = JobCache(keys)

    async def load() -> int:
        snap = await store.get_prefix(prefix)
        cache.load(snap)
        return snap.revision

    loaded_at = await load()
    view = checked_view(cache.view(job), keys, job)
    show(view)
    if has_ended(view):
        return view
    queue: asyncio.Queue[_Item] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for item in store.watch_prefix(prefix, loaded_at + 1):
                queue.put_nowait(item)
        except Exception as err:  # handed to the loop below, which raises it (a cancel passes)
            queue.put_nowait(err)

    pumping = asyncio.create_task(pump(), name=f"watch {prefix}")
    try:
        while True:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            for item in batch:
                if isinstance(item, Exception):
                    raise item
                if isinstance(item, Resync):
                    loaded_at = await load()
                elif item.mod_revision > loaded_at:  # a resumed watch may repeat what the re-read has
                    cache.apply(item)
            view = checked_view(cache.view(job), keys, job)
            show(view)
            if has_ended(view):
                return view
    finally:
        pumping.cancel()
        await asyncio.wait({pumping})  # its end, without taking its cancellation for this task's
