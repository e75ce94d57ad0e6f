"""What ``recoverctl`` reads from etcd: a job's view, its events, every job. The I/O edge of the
read commands; what they print is :mod:`recoverd.cli.render`'s."""

from __future__ import annotations

from collections.abc import Sequence

from recoverd import hangstacks
from recoverd.errors import RecoverdError
from recoverd.jobview import JobView, read_job
from recoverd.keys import Keyspace, RunRef, printable
from recoverd.records import decode, pb
from recoverd.store import Store

__all__ = ["UnknownJob", "checked_view", "hangs", "read_events", "read_view"]


class UnknownJob(RecoverdError):
    """No such job (or its spec record is bad): exit 1, with the reason."""


def checked_view(view: JobView, keys: Keyspace, job: str) -> JobView:
    """``view`` if it is a readable job's; UnknownJob (with the reason) otherwise."""
    if view.spec_error:
        raise UnknownJob(f"job {job!r} is stored but its spec record is bad: {printable(view.spec_error)}")
    if view.spec is None or view.run is None:
        raise UnknownJob(f"no job named {job!r} under {keys.prefix}")
    return view


async def read_view(store: Store, keys: Keyspace, job: str) -> JobView:
    return checked_view(await read_job(store, keys, job), keys, job)


async def read_events(store: Store, keys: Keyspace, run: RunRef) -> list[pb.Event]:
    """The run's events, oldest first; an undecodable one is left out (the log is not a record
    anything acts on)."""
    snap = await store.get_prefix(keys.events_prefix(run))
    out = []
    for kv in snap.kvs:
        try:
            out.append(decode(pb.Event, kv.value, kv.key))
        except RecoverdError:
            continue
    return out


def hangs(evs: Sequence[pb.Event]) -> list[hangstacks.HangStacks]:
    return [h for e in evs if (h := hangstacks.from_event(e)) is not None]
