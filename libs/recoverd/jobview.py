"""A decoded, consistent read of one job's current run: what every reconciler starts from.

One (paged) range read of ``jobs/<job>/`` at one revision; each value is decoded into its record
and validated (``recoverd.validate``). Values that do not parse or validate, and keys outside the
schema, are collected in ``bad`` (never raised), so one malformed write cannot stop a job's
reconcile: the coordinator records and removes them. Two kinds of bad key are not removed:

* the job's ``spec`` (the job's identity, written once by its first launcher): the view keeps
  ``spec_error`` so the job is still reported (``recoverctl``) with the reason;
* a live participant's leased record (``nodes/``, ``clients/``) with a bad value: the lease says
  its owner is alive, so it stays a live participant (a placeholder record) and only its owner
  rewrites it. Deleting another service's leased key would make it look dead forever.

Keys of an earlier run of the same job name (another uid) are listed in ``other_runs`` and never
read as this run's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from recoverd.errors import BadRecord, ReadCompacted
from recoverd.keys import KeyKind, Keyspace, RunRef
from recoverd.records import LIVE_RANK_STATES, decode, pb
from recoverd.store import Store
from recoverd.validate import JobFrame, check_record, check_size, check_spec, sequence_of

__all__ = [
    "RECORD_CLASSES",
    "BadKey",
    "DecodeMemo",
    "JobView",
    "build_view",
    "idle_spares",
    "node_of_rank",
    "ranks_running_elsewhere",
    "read_job",
    "warm_memo",
]


@dataclass(frozen=True, slots=True)
class BadKey:
    """A key whose name or value is bad input, with the reason (for a ``bad_record`` event)."""

    key: str
    value: bytes
    reason: str
    kind: KeyKind | None = None
    lease: int = 0
    mod_revision: int = 0

    @property
    def is_live_record(self) -> bool:
        """A leased participant record: kept (its owner rewrites it), never deleted by others."""
        return self.kind in (KeyKind.NODE, KeyKind.CLIENT) and self.lease != 0


@dataclass(slots=True)
class JobView:
    """Everything stored for one job's current run, decoded, at one revision."""

    revision: int
    spec: pb.JobSpec | None = None
    #: Why the stored spec is unusable ("" when it is fine or absent).
    spec_error: str = ""
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
    #: node -> the drill pending for its agent (``recoverctl inject``).
    drills: dict[str, pb.Drill] = field(default_factory=dict)
    acks: dict[str, pb.CommandAck] = field(default_factory=dict)
    #: Signal keys, oldest (lowest sequence number) first.
    signals: list[str] = field(default_factory=list)
    #: The highest signal sequence number stored (0 if none).
    last_signal_seq: int = 0
    #: The highest epoch a stored signal names (0 if none).
    signal_epoch: int = 0
    bad: list[BadKey] = field(default_factory=list)
    #: Keys of unleased bad node records whose node still has a rank table, or whose command the
    #: recovery awaits (kept for a grace).
    clobbered_nodes: set[str] = field(default_factory=set)
    other_runs: set[str] = field(default_factory=set)

    def epoch_floor(self) -> int:
        """The highest recovery epoch any record of this run names besides the recovery itself.

        The epoch must never go backwards (agents apply each (epoch, seq) once, so a repeated
        epoch is ignored): a lost or clobbered recovery record is rebuilt at this epoch, so the next
        fault opens a new one. Reports are left out: a stale report (another epoch) is ordinary bad
        input, recorded as ``stale_epoch``, and must not conjure a recovery record.
        """
        epochs = [0, *self.decisions]
        epochs += [c.epoch for c in self.commands.values()]
        epochs += [a.epoch for a in self.acks.values()]
        epochs += [o.epoch for o in (self.history.outcomes if self.history is not None else ())]
        epochs += [self.signal_epoch]
        return max(epochs)


#: The record class each kind of run key holds (the keyspace's schema, as read here).
RECORD_CLASSES: dict[KeyKind, type] = {
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
    KeyKind.SIGNAL: pb.Signal,
    KeyKind.DRILL: pb.Drill,
}


def _read_spec(view: JobView, keys: Keyspace, job: str, kvs: list[Any]) -> None:
    spec_key = keys.job_spec(job)
    for kv in kvs:
        if kv.key != spec_key:
            continue
        try:
            check_size(KeyKind.JOB_SPEC, kv.value)
            spec = decode(pb.JobSpec, kv.value, kv.key)
            check_spec(spec, job)
        except BadRecord as err:
            view.spec_error = err.detail
            view.bad.append(BadKey(kv.key, kv.value, err.detail, KeyKind.JOB_SPEC, kv.lease, kv.mod_revision))
            return
        view.spec = spec
        return


async def read_job(store: Store, keys: Keyspace, job: str) -> JobView:
    """Read, decode and validate one job's keys at one revision; bad ones go to ``view.bad``."""
    snap = await store.get_prefix(keys.job_prefix(job))
    return build_view(keys, job, snap.kvs, snap.revision)


async def read_node_view(store: Store, keys: Keyspace, job: str, node: str, ranks: Iterable[int]) -> JobView:
    """What one node's agent needs of its job to join, rejoin or adopt, as one consistent read.

    The spec, the run's status, recovery and node records, this node's rank table, and the rank
    tables of the live nodes whose records hold any of this node's ranks (``ranks``, the ones it
    means to run, and the ones its table holds) or that are spares: not every node's table, so
    that 512 agents joining at once read ~512 small records each, not the whole job (docs/scale.md).
    The view is a partial one, at the revision of the first read; every other read is pinned to it.
    """
    while True:
        spec_read = await store.read(keys.job_spec(job))
        revision = spec_read.revision
        kvs = list(spec_read.kvs)
        view = build_view(keys, job, kvs, revision)
        if view.run is None:
            # No usable spec: joining creates or replaces the run, fenced on the whole prefix.
            return view
        run = view.run
        try:
            nodes = await store.get_prefix(keys.nodes_prefix(run), revision=revision)
            kvs += nodes.kvs
            for key in (keys.status(run), keys.recovery(run), keys.ranks(run, node)):
                kvs += (await store.read(key, revision=revision)).kvs
            mine = build_view(keys, job, kvs, revision)
            own = set(ranks) | ({r.rank for r in mine.ranks[node].ranks} if node in mine.ranks else set())
            for other, record in mine.nodes.items():
                # A spare's record names no ranks until it registers again after starting some:
                # its table, written with its ack before that, is read too.
                if other != node and (own & set(record.ranks) or record.is_spare or record.node_rank < 0):
                    kvs += (await store.read(keys.ranks(run, other), revision=revision)).kvs
        except ReadCompacted:
            continue  # compacted between the reads: read it all again at a fresh revision
        return build_view(keys, job, kvs, revision)


class DecodeMemo:
    """Decoded records by key, kept while the key's value is unchanged (same mod revision).

    A reconciler that keeps a job's keys from its watch (:class:`~recoverd.jobcache.JobCache`)
    builds a view on every pass; with the memo only the keys that changed since the last pass are
    parsed, decoded and validated again, so a pass costs what changed, not the job's size. The
    records are shared between views: a pass must copy a record before changing it.
    """

    def __init__(self) -> None:
        self._entries: dict[str, tuple[int, JobFrame, _Decoded]] = {}

    def get(self, key: str, mod_revision: int, frame: JobFrame) -> _Decoded | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] != mod_revision or entry[1] != frame:
            return None
        return entry[2]

    def put(self, key: str, mod_revision: int, frame: JobFrame, decoded: _Decoded) -> None:
        self._entries[key] = (mod_revision, frame, decoded)

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)

    def retain(self, keys: set[str]) -> None:
        """Forget every key not in ``keys`` (after a full re-read)."""
        for key in [k for k in self._entries if k not in keys]:
            del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)


#: What one key of a run decodes to: (its reference, its record) or why it is bad.
_Decoded = tuple[Any, Any] | BadKey


def _decode_key(keys: Keyspace, kv: Any, frame: JobFrame) -> _Decoded:
    try:
        ref = keys.parse(kv.key)
    except BadRecord as err:
        return BadKey(kv.key, kv.value, err.detail, None, kv.lease, kv.mod_revision)
    if ref.uid != frame.uid:
        return (ref, None)
    decoder = RECORD_CLASSES.get(ref.kind)
    if decoder is None:
        return (ref, None)
    try:
        check_size(ref.kind, kv.value)
        msg: Any = decode(decoder, kv.value, kv.key)
        check_record(ref, msg, kv.lease, frame)
    except BadRecord as err:
        return BadKey(kv.key, kv.value, err.detail, ref.kind, kv.lease, kv.mod_revision)
    return (ref, msg)


def warm_memo(keys: Keyspace, job: str, kvs: Any, memo: DecodeMemo, budget: int) -> int:
    """Decode into ``memo`` up to ``budget`` of ``kvs`` it does not hold yet; return how many.

    A reconciler with a cold memo (a new leader, 4,000 records at 512 nodes) calls it in slices and
    yields to its event loop between them, so its lease keep-alives are never starved by one long
    decode (which cost a 512-node coordinator its leadership, over and over).
    """
    kvs = list(kvs)
    spec = next((kv for kv in kvs if kv.key == keys.job_spec(job)), None)
    if spec is None:
        return 0
    view = JobView(0)
    _read_spec(view, keys, job, [spec])
    if view.spec is None:
        return 0
    frame = JobFrame(job, view.spec.uid, view.spec.world_size, view.spec.nnodes)
    done = 0
    for kv in kvs:
        if done >= budget:
            break
        if kv.key == spec.key or memo.get(kv.key, kv.mod_revision, frame) is not None:
            continue
        memo.put(kv.key, kv.mod_revision, frame, _decode_key(keys, kv, frame))
        done += 1
    return done


def build_view(keys: Keyspace, job: str, kvs: Any, revision: int, memo: DecodeMemo | None = None) -> JobView:
    """Decode and validate one job's keys (as read at ``revision``) into a view.

    ``kvs``: every key of ``jobs/<job>/`` (objects with ``key``, ``value``, ``lease`` and
    ``mod_revision``). ``memo``: decoded records to reuse for keys whose value is unchanged.
    """
    kvs = list(kvs)
    view = JobView(revision)
    _read_spec(view, keys, job, kvs)
    if view.spec is None:
        return view
    view.run = RunRef(job, view.spec.uid)
    frame = JobFrame(job, view.spec.uid, view.spec.world_size, view.spec.nnodes)
    signals: list[tuple[int, str]] = []
    spec_key = keys.job_spec(job)
    for kv in kvs:
        if kv.key == spec_key:
            continue
        decoded = memo.get(kv.key, kv.mod_revision, frame) if memo is not None else None
        if decoded is None:
            decoded = _decode_key(keys, kv, frame)
            if memo is not None:
                memo.put(kv.key, kv.mod_revision, frame, decoded)
        if isinstance(decoded, BadKey):
            bad = decoded
            view.bad.append(bad)
            if bad.is_live_record and bad.kind is KeyKind.NODE:
                view.nodes[kv.key.rsplit("/", 1)[1]] = pb.NodeRecord(node=kv.key.rsplit("/", 1)[1], node_rank=-1)
            elif bad.is_live_record:
                view.clients[kv.key.rsplit("/", 1)[1]] = pb.ClientRecord(client_id=kv.key.rsplit("/", 1)[1])
            continue
        ref, msg = decoded
        if ref.uid != view.spec.uid:
            view.other_runs.add(ref.uid)
            continue
        if msg is None:
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
        elif ref.kind is KeyKind.DRILL:
            view.drills[ref.name] = msg
        elif ref.kind is KeyKind.SIGNAL:
            signals.append((sequence_of(ref), kv.key))
            view.signal_epoch = max(view.signal_epoch, msg.epoch)
    # A node's record overwritten without its lease (a plain `etcdctl put`) while the node's rank
    # table is there, or while the recovery awaits its command (a spare has no rank table yet): its
    # agent is most likely alive and rewrites it at once (it watches its key), so it stays a
    # participant for now; the coordinator removes it only after a grace (reconciler).
    awaited = (
        set(view.recovery.command_nodes)
        if view.recovery is not None and view.recovery.phase == pb.PHASE_RECOVERING
        else set()
    )
    for bad in view.bad:
        if bad.kind is KeyKind.NODE and not bad.lease:
            name = bad.key.rsplit("/", 1)[1]
            if (name in view.ranks or name in awaited) and name not in view.nodes:
                view.nodes[name] = pb.NodeRecord(node=name, node_rank=-1)
                view.clobbered_nodes.add(bad.key)
    signals.sort()
    view.signals = [key for _, key in signals]
    view.last_signal_seq = signals[-1][0] if signals else 0
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
            and not any(r.state in LIVE_RANK_STATES for r in _ranks_of(view, name))
        )
    )


def ranks_running_elsewhere(view: JobView, node: str) -> set[int]:
    """Ranks that a live node other than ``node`` runs (or is starting) now, by its rank table."""
    return {
        r.rank
        for other, table in view.ranks.items()
        if other != node and other in view.nodes
        for r in table.ranks
        if r.state in LIVE_RANK_STATES
    }


def node_of_rank(view: JobView) -> dict[int, str]:
    """Where each rank runs (or last ran), from the agents' rank tables."""
    return {r.rank: node for node, table in view.ranks.items() for r in table.ranks}


def _ranks_of(view: JobView, node: str) -> list[pb.RankStatus]:
    table = view.ranks.get(node)
    return list(table.ranks) if table is not None else []
