"""What ``recoverctl`` reads from etcd: a job's view, its events, every job. The I/O edge of the
read commands; what they print is :mod:`recoverd.cli.render`'s."""

from __future__ import annotations

from collections.abc import Sequence

from recoverd import hangstacks
from recoverd.errors import RecoverdError
from recoverd.jobcache import JobCache
from recoverd.jobview import JobView, read_job
from recoverd.keys import Keyspace, RunRef, printable
from recoverd.records import decode, pb
from recoverd.store import KV, Store

__all__ = [
    "NotFound",
    "UnknownJob",
    "checked_view",
    "decode_event",
    "hangs",
    "read_events",
    "read_jobs",
    "read_view",
]


class NotFound(RecoverdError):
    """What was asked for does not exist (or is not kept): exit 1, with the reason."""


class UnknownJob(NotFound):
    """No such job, or its spec record is bad."""


def checked_view(view: JobView, keys: Keyspace, job: str) -> JobView:
    """``view`` if it is a readable job's; UnknownJob (with the reason) otherwise."""
    if view.spec_error:
        raise UnknownJob(f"job {job!r} is stored but its spec record is bad: {printable(view.spec_error)}")
    if view.spec is None or view.run is None:
        raise UnknownJob(f"no job named {job!r} under {keys.prefix}")
    return view


async def read_view(store: Store, keys: Keyspace, job: str) -> JobView:
    return checked_view(await read_job(store, keys, job), keys, job)


async def read_jobs(store: Store, keys: Keyspace) -> dict[str, JobView]:
    """Every job under the prefix, by name, from one (paged) read of ``jobs/`` at one revision.

    A job whose spec is bad or missing is still listed (its view says why): during an incident it
    is exactly the job an operator must see.
    """
    cache = JobCache(keys)
    names = cache.load(await store.get_prefix(keys.jobs_prefix()))
    return {name: cache.view(name) for name in sorted(names)}


def decode_event(kv: KV) -> pb.Event | None:
    """An event record, or None when it does not decode: the log is shown, never acted on, so a bad
    entry is left out rather than stopping the listing."""
    try:
        return decode(pb.Event, kv.value, kv.key)
    except RecoverdError:
        return None


async def read_events(store: Store, keys: Keyspace, run: RunRef) -> list[pb.Event]:
    """The run's events, oldest first (event ids sort by time)."""
    snap = await store.get_prefix(keys.events_prefix(run))
    return [e for kv in snap.kvs if (e := decode_event(kv)) is not None]


def hangs(evs: Sequence[pb.Event]) -> list[hangstacks.HangStacks]:
    return [h for e in evs if (h := hangstacks.from_event(e)) is not None]
