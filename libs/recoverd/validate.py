"""What makes a stored record valid: the one place that says so, per record kind.

Everything under the prefix is untrusted input (a buggy writer, an operator with etcdctl, a stale
process). :func:`records.decode` checks the syntax (a JSON object that parses as the message); this
module checks the meaning, so that garbage that happens to parse is never taken for a record:
``faults/x = {}`` is not a fault of rank 0, ``nodes/ghost = {}`` is not a participant. A record that
fails raises :class:`BadRecord` with the reason; ``jobview.read_job`` collects it as bad input.

The rules (docs/keyspace.md, "Validation"):

* a value is at most :data:`MAX_VALUE_BYTES` (the coordinator's own singletons
  :data:`MAX_OWN_VALUE_BYTES`), checked before any parsing;
* a record that names itself names its key: ``Fault.fault_id``, ``NodeRecord.node``,
  ``NodeRanks.node``, ``ClientRecord.client_id``, ``Report.participant`` and ``Report.kind``,
  ``Decision.epoch``, ``Signal.seq``;
* a record written by an agent, a client or the selector holds no list (at any depth) longer than
  the job's world size plus 64 (:func:`max_list`): a value under the byte cap can still hold
  100,000 tiny entries that would each cost a pass work;
* numbers are in range: epochs and sequence numbers are positive, ranks lie in ``0..world-1``
  (except a fault's rank, which the coordinator reports as ``unknown_rank``), enums are known values;
* a live participant's record (``nodes/``, ``clients/``) is attached to a lease: nothing else would
  ever remove it.

Pure: no I/O, no etcd.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from recoverd.errors import BadRecord
from recoverd.keys import KeyKind, KeyRef, check_id, printable
from recoverd.records import pb
from recoverd.strategies import ALL_STRATEGIES

__all__ = [
    "DRILL_KINDS",
    "MAX_OWN_VALUE_BYTES",
    "MAX_VALUE_BYTES",
    "JobFrame",
    "check_record",
    "check_size",
    "check_spec",
    "max_list",
    "report_kind_name",
    "sequence_of",
]

#: Any record written by an agent, a client or the selector. The largest legitimate one, a node's
#: rank table, is a few KiB; a cap keeps one hostile value from filling a reconcile pass's memory.
MAX_VALUE_BYTES = 256 * 1024
#: The coordinator's own singletons (recovery, history, status) carry lists that grow with a job.
MAX_OWN_VALUE_BYTES = 1024 * 1024
_OWN = {KeyKind.RECOVERY, KeyKind.HISTORY, KeyKind.STATUS, KeyKind.JOB_SPEC}
_MAX_WORLD = 1 << 24
#: What ``recoverctl inject`` can ask an agent to do to a rank.
DRILL_KINDS = ("kill", "exit", "hang")
_MAX_SEQ = 10**15


@dataclass(frozen=True, slots=True)
class JobFrame:
    """What validation needs to know about the job: its name, run and size (from its spec)."""

    job: str
    uid: str
    world_size: int
    nnodes: int


def report_kind_name(kind: int) -> str:
    """The key segment of a report kind: ``REPORT_STOP_COMPLETE`` -> ``stop_complete``."""
    return str(pb.ReportKind.Name(kind)).removeprefix("REPORT_").lower()


def check_size(kind: KeyKind, raw: bytes) -> None:
    cap = MAX_OWN_VALUE_BYTES if kind in _OWN else MAX_VALUE_BYTES
    if len(raw) > cap:
        raise BadRecord(f"{kind.value} value of {len(raw)} bytes is over the {cap}-byte cap")


def sequence_of(ref: KeyRef) -> int:
    """The number a ``decisions/`` or ``signals/`` key names; BadRecord unless it is one."""
    if not ref.name.isdigit() or len(ref.name) > 18:
        raise BadRecord(f"{ref.kind.value} key {ref.name!r} is not a sequence number")
    return int(ref.name)


def check_spec(spec: pb.JobSpec, job: str) -> None:
    if spec.name != job:
        raise BadRecord(f"job spec names job {printable(spec.name)!r}; its key names {job!r}")
    check_id("run", spec.uid)
    if not 1 <= spec.world_size <= _MAX_WORLD:
        raise BadRecord(f"job spec world size {spec.world_size} is out of range")
    if spec.nnodes < 1 or spec.nproc_per_node < 1:
        raise BadRecord(f"job spec nnodes {spec.nnodes} / nproc per node {spec.nproc_per_node} must be positive")


def _enum(enum: Any, value: int, what: str, *, allow_unset: bool = False) -> None:
    if value not in enum.values() or (value == 0 and not allow_unset):
        raise BadRecord(f"{what} {value} is not a known value")


def _ranks(ranks: Any, frame: JobFrame, what: str) -> None:
    for rank in ranks:
        if not 0 <= rank < frame.world_size:
            raise BadRecord(f"{what} names rank {rank}; the job has ranks 0..{frame.world_size - 1}")


def _positive(value: int, what: str) -> None:
    if not 1 <= value <= _MAX_SEQ:
        raise BadRecord(f"{what} {value} is out of range (must be 1..{_MAX_SEQ})")


def _named(actual: str, expected: str, what: str) -> None:
    if actual != expected:
        raise BadRecord(f"{what} {printable(actual)!r} does not match its key ({expected!r})")


def max_list(frame: JobFrame) -> int:
    """The longest list a record written by an agent, a client or the selector may hold: no list
    in one (ranks, faults, stacks, strategies, pids) is longer than the job has ranks, plus slack."""
    return frame.world_size + 64


def _check_lists(msg: Message, cap: int, kind: KeyKind) -> None:
    """Every repeated field, at any depth, has at most ``cap`` entries."""
    for field, value in msg.ListFields():
        if field.is_repeated:
            if len(value) > cap:
                raise BadRecord(f"{kind.value} record lists {len(value)} {field.name}: over the cap of {cap}")
            if field.message_type is not None and not field.message_type.GetOptions().map_entry:
                for item in value:
                    _check_lists(item, cap, kind)
        elif field.message_type is not None:
            _check_lists(value, cap, kind)


def check_record(ref: KeyRef, msg: Message, lease: int, frame: JobFrame) -> None:
    """Raise BadRecord unless ``msg`` (decoded from ``ref``'s key) is a valid record of its kind."""
    m: Any = msg
    kind = ref.kind
    if kind not in _OWN:
        _check_lists(msg, max_list(frame), kind)
    if kind is KeyKind.STATUS:
        _named(m.uid, frame.uid, "status uid")
        _enum(pb.JobState, m.state, "job state")
    elif kind is KeyKind.RECOVERY:
        _positive(m.epoch, "recovery epoch")
        _positive(m.recovery_id, "recovery id")
        _enum(pb.Phase, m.phase, "recovery phase")
        _ranks([f.rank for f in m.faults], frame, "recovery fault")
        _ranks([p.rank for p in m.isolated], frame, "isolated rank")
        for entry in m.phase_log:
            _enum(pb.Phase, entry.phase, "phase log entry")
    elif kind is KeyKind.HISTORY:
        for outcome in m.outcomes:
            _positive(outcome.epoch, "history outcome epoch")
    elif kind is KeyKind.NODE:
        _named(m.node, ref.name, "node record for node")
        if not lease:
            raise BadRecord(f"node record {ref.name!r} holds no lease: nothing would ever remove it")
        if not -1 <= m.node_rank < max(frame.nnodes, 1):
            raise BadRecord(f"node {ref.name!r} claims node rank {m.node_rank}; the job has 0..{frame.nnodes - 1}")
        _ranks(m.ranks, frame, f"node {ref.name!r}")
        unknown = [printable(x) for x in m.strategies if x not in ALL_STRATEGIES]
        if unknown or len(m.strategies) > len(ALL_STRATEGIES):
            raise BadRecord(f"node {ref.name!r} declares strategies {unknown or list(m.strategies)}: not known ones")
    elif kind is KeyKind.CLIENT:
        _named(m.client_id, ref.name, "client record for client")
        if not lease:
            raise BadRecord(f"client record {ref.name!r} holds no lease: nothing would ever remove it")
        _ranks(m.ranks, frame, f"client {ref.name!r}")
    elif kind is KeyKind.RANKS:
        _named(m.node, ref.name, "rank table for node")
        _ranks([r.rank for r in m.ranks], frame, f"rank table of {ref.name!r}")
        if len({r.rank for r in m.ranks}) != len(m.ranks):
            raise BadRecord(f"rank table of {ref.name!r} lists a rank twice")
        for status in m.ranks:
            _enum(pb.RankState, status.state, f"state of rank {status.rank}", allow_unset=True)
            if status.generation < 0 or status.restart_count < 0:
                raise BadRecord(f"rank {status.rank} of {ref.name!r} has a negative generation or restart count")
    elif kind is KeyKind.FAULT:
        _named(m.fault_id, ref.name, "fault id")
        _enum(pb.FaultSource, m.source, "fault source", allow_unset=True)
        if m.generation < 0:
            raise BadRecord(f"fault {ref.name!r} names generation {m.generation}")
    elif kind is KeyKind.REPORT:
        _named(m.participant, ref.name, "report participant")
        _enum(pb.ReportKind, m.kind, "report kind")
        _named(report_kind_name(m.kind), ref.sub, "report kind")
        _positive(m.epoch, "report epoch")
    elif kind is KeyKind.DECISION:
        _named(str(m.epoch), str(sequence_of(ref)), "decision epoch")
        _positive(m.epoch, "decision epoch")
        if not m.strategy and not m.give_up:
            raise BadRecord(f"decision for epoch {m.epoch} names no strategy and does not give up")
    elif kind is KeyKind.COMMAND:
        _positive(m.epoch, "command epoch")
        if not 0 <= m.seq <= _MAX_SEQ:
            raise BadRecord(f"command seq {m.seq} is out of range")
        _enum(pb.CommandAction, m.action, "command action")
        _ranks(m.ranks, frame, "command")
    elif kind is KeyKind.ACK:
        _positive(m.epoch, "ack epoch")
        if not 0 <= m.seq <= _MAX_SEQ:
            raise BadRecord(f"ack seq {m.seq} is out of range")
    elif kind is KeyKind.DRILL:
        check_id("drill", m.drill_id)
        _ranks([m.rank], frame, f"drill {m.drill_id}")
        if m.kind not in DRILL_KINDS:
            raise BadRecord(f"drill {m.drill_id} kind {printable(m.kind)!r}: one of {', '.join(DRILL_KINDS)}")
    elif kind is KeyKind.SIGNAL:
        _named(str(m.seq), str(sequence_of(ref)), "signal seq")
        _positive(m.epoch, "signal epoch")
