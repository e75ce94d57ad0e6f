"""What a test reads back from etcd's history: every write under a prefix between two revisions
(the writes a recovery cost), and the reports among them."""

from __future__ import annotations

import asyncio
from collections import Counter

from recoverd.keys import RunRef
from recoverd.store import Store, WatchEvent

from .cluster import Cluster

#: A history replay that has delivered nothing for this long has delivered everything.
IDLE_S = 2.0


def writes_between(cluster: Cluster, prefix: str, start: int, end: int) -> list[WatchEvent]:
    """Every write under ``prefix`` in revisions ``start..end``, from etcd's history (a watch from
    ``start`` replays it at once; once it has gone quiet for IDLE_S, all of it has arrived)."""

    async def replay(store: Store) -> list[WatchEvent]:
        out: list[WatchEvent] = []
        events = aiter(store.watch_prefix(prefix, start))
        while True:
            try:
                item = await asyncio.wait_for(anext(events), IDLE_S)
            except TimeoutError:
                break
            if isinstance(item, WatchEvent):
                if item.mod_revision > end:
                    break
                out.append(item)
        await events.aclose()  # type: ignore[attr-defined]
        return out

    return cluster._run(replay)  # type: ignore[no-any-return]


def run_writes_between(cluster: Cluster, run: RunRef, start: int, end: int) -> list[WatchEvent]:
    """Every write of one run in revisions ``start..end``: its records and its inbox (what its
    ranks and agents report: clients, faults, reports; docs/keyspace.md), in revision order."""
    events = writes_between(cluster, cluster.keys.run_prefix(run), start, end)
    events += writes_between(cluster, cluster.keys.run_inbox_prefix(run), start, end)
    return sorted(events, key=lambda e: e.mod_revision)


def record_kind(cluster: Cluster, run: RunRef, key: str) -> str:
    """``reports``, ``acks``, ``ranks``, ... : the kind of one of the run's keys, inbox or not."""
    for prefix in (cluster.keys.run_inbox_prefix(run), cluster.keys.run_prefix(run)):
        if key.startswith(prefix):
            return key.removeprefix(prefix).split("/")[0]
    return ""


def report_writes(events: list[WatchEvent], reports_prefix: str) -> Counter[str]:
    """participant/kind -> puts of that report."""
    return Counter(
        e.key.removeprefix(reports_prefix) for e in events if e.key.startswith(reports_prefix) and not e.is_delete
    )
