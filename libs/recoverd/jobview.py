"""A decoded, consistent read of one job's current run: what every reconciler starts from.

One range read of ``jobs/<job>/`` at one revision; each value is decoded into its record. Values
that do not parse, and keys outside the schema, are collected in ``bad`` (never raised), so one
malformed write cannot stop a job's reconcile: the coordinator records and removes them. Keys of
an earlier run of the same job name (another uid) are listed in ``other_runs`` and never read as
this run's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recoverd.errors import BadRecord
from recoverd.keys import KeyKind, Keyspace, RunRef
from recoverd.records import decode, pb
from recoverd.store import Store

__all__ = ["JobView", "idle_spares", "node_of_rank", "read_job"]


@dataclass(slots=True)
class JobView:
    """Everything stored for one job's current run, decoded, at one revision."""

    revision: int
    spec: pb.JobSpec | None = None
    run: RunRef | None = None
    status: pb.JobStatus | None = None
    recovery: pb.Recovery | None = None
    history: pb.History | None = None
    nodes: dict[str, pb.NodeRecord] = field(default_factory=dict)
    clients: dict[str, pb.ClientRecord] = field(default_factory=dict)
    ranks: dict[str, pb.NodeRanks] = field(default_factory=dict)
    faults: dict[str, pb.Fault] = field(default_factory=dict)
    reports: dict[str, pb.Report] = field(default_factory=dict)
    decisions: dict[int, pb.Decision] = field(default_factory=dict)
    commands: dict[str, pb.Command] = field(default_factory=dict)
    acks: dict[str, pb.CommandAck] = field(default_factory=dict)
    signals: list[str] = field(default_factory=list)
    bad: list[tuple[str, bytes, str]] = field(default_factory=list)
    other_runs: set[str] = field(default_factory=set)


_DECODERS: dict[KeyKind, type] = {
    KeyKind.STATUS: pb.JobStatus,
    KeyKind.RECOVERY: pb.Recovery,
    KeyKind.HISTORY: pb.History,
    KeyKind.NODE: pb.NodeRecord,
    KeyKind.CLIENT: pb.ClientRecord,
    KeyKind.RANKS: pb.NodeRanks,
    KeyKind.FAULT: pb.Fault,
    KeyKind.REPORT: pb.Report,
    KeyKind.DECISION: pb.Decision,
    KeyKind.COMMAND: pb.Command,
    KeyKind.ACK: pb.CommandAck,
}


async def read_job(store: Store, keys: Keyspace, job: str) -> JobView:
    """Read and decode one job's keys at one revision; malformed values go to ``view.bad``."""
    snap = await store.get_prefix(keys.job_prefix(job))
    view = JobView(snap.revision)
    for kv in snap.kvs:
        if kv.key == keys.job_spec(job):
            try:
                view.spec = decode(pb.JobSpec, kv.value, kv.key)
            except BadRecord as err:
                view.bad.append((kv.key, kv.value, str(err)))
            break
    if view.spec is None:
        return view
    view.run = RunRef(job, view.spec.uid)
    for kv in snap.kvs:
        if kv.key == keys.job_spec(job):
            continue
        try:
            ref = keys.parse(kv.key)
        except BadRecord as err:
            view.bad.append((kv.key, kv.value, str(err)))
            continue
        if ref.uid != view.spec.uid:
            view.other_runs.add(ref.uid)
            continue
        if ref.kind is KeyKind.SIGNAL:
            view.signals.append(kv.key)
            continue
        decoder = _DECODERS.get(ref.kind)
        if decoder is None:
            continue
        try:
            msg: Any = decode(decoder, kv.value, kv.key)
        except BadRecord as err:
            view.bad.append((kv.key, kv.value, str(err)))
            continue
        if ref.kind is KeyKind.STATUS:
            view.status = msg
        elif ref.kind is KeyKind.RECOVERY:
            view.recovery = msg
        elif ref.kind is KeyKind.HISTORY:
            view.history = msg
        elif ref.kind is KeyKind.NODE:
            view.nodes[ref.name] = msg
        elif ref.kind is KeyKind.CLIENT:
            view.clients[ref.name] = msg
        elif ref.kind is KeyKind.RANKS:
            view.ranks[ref.name] = msg
        elif ref.kind is KeyKind.FAULT:
            view.faults[kv.key] = msg
        elif ref.kind is KeyKind.REPORT:
            view.reports[kv.key] = msg
        elif ref.kind is KeyKind.DECISION:
            view.decisions[msg.epoch] = msg
        elif ref.kind is KeyKind.COMMAND:
            view.commands[ref.name] = msg
        elif ref.kind is KeyKind.ACK:
            view.acks[ref.name] = msg
    return view


def idle_spares(view: JobView) -> tuple[str, ...]:
    """Live spare nodes that hold no ranks, sorted by name; only those the policy's ``spares``
    names when it names any. A spare given ranks re-registers as a normal node, so it drops out."""
    wanted = set(view.spec.policy.spares) if view.spec is not None else set()
    return tuple(
        sorted(
            name
            for name, record in view.nodes.items()
            if record.is_spare
            and (not wanted or name in wanted)
            and not any(r.state in (pb.RANK_RUNNING, pb.RANK_PENDING) for r in _ranks_of(view, name))
        )
    )


def node_of_rank(view: JobView) -> dict[int, str]:
    """Where each rank runs (or last ran), from the agents' rank tables."""
    return {r.rank: node for node, table in view.ranks.items() for r in table.ranks}


def _ranks_of(view: JobView, node: str) -> list[pb.RankStatus]:
    table = view.ranks.get(node)
    return list(table.ranks) if table is not None else []
