"""Conversions between the stored Recovery/Fault records and the state machine's dataclasses."""

from __future__ import annotations

from recoverd.coordinator.model import FaultInfo, Phase, Recovery
from recoverd.records import pb, ts_from_s, ts_to_s

__all__ = ["fault_from_pb", "fault_to_pb", "recovery_from_pb", "recovery_to_pb"]

_SOURCES = {
    pb.SOURCE_AGENT: "agent",
    pb.SOURCE_CLIENT: "client",
    pb.SOURCE_LEASE: "lease",
    pb.SOURCE_OPERATOR: "operator",
}
_SOURCES_BACK = {v: k for k, v in _SOURCES.items()}


def _phase_to_pb(phase: Phase) -> int:
    return pb.Phase.Value(f"PHASE_{phase.value}")


def _phase_from_pb(value: int) -> Phase:
    name = pb.Phase.Name(value)
    return Phase.DONE if value == pb.PHASE_UNSPECIFIED else Phase(name.removeprefix("PHASE_"))


def fault_from_pb(msg: pb.Fault) -> FaultInfo:
    return FaultInfo(
        fault_id=msg.fault_id,
        rank=msg.rank,
        node=msg.node,
        fault_type=msg.fault_type or "1",
        source=_SOURCES.get(msg.source, "agent"),
        exit_code=msg.exit_code,
        signal=msg.signal,
        generation=msg.generation,
        detected_at=ts_to_s(msg.detected_at),
        detail=msg.detail,
        kind=msg.kind,
    )


def fault_to_pb(fault: FaultInfo) -> pb.Fault:
    return pb.Fault(
        fault_id=fault.fault_id,
        rank=fault.rank,
        node=fault.node,
        fault_type=fault.fault_type,
        source=_SOURCES_BACK.get(fault.source, pb.SOURCE_AGENT),
        exit_code=fault.exit_code,
        signal=fault.signal,
        generation=fault.generation,
        detected_at=ts_from_s(fault.detected_at),
        detail=fault.detail,
        kind=fault.kind,
    )


def recovery_from_pb(msg: pb.Recovery) -> Recovery:
    return Recovery(
        phase=_phase_from_pb(msg.phase),
        epoch=msg.epoch,
        recovery_id=msg.recovery_id,
        opened_at=ts_to_s(msg.opened_at),
        deadline_at=ts_to_s(msg.deadline_at) if msg.HasField("deadline_at") else None,
        faults=tuple(fault_from_pb(f) for f in msg.faults),
        participants=frozenset(msg.participants),
        reported=frozenset(msg.reported),
        supported=frozenset(msg.supported) if msg.has_supported else None,
        strategy=msg.strategy,
        decision_reasons=tuple(msg.decision_reasons),
        failed_strategies=tuple((f.strategy, f.reason) for f in msg.failed_strategies),
        command_seq=msg.command_seq,
        command_nodes=frozenset(msg.command_nodes),
        job_nodes=tuple(msg.job_nodes),
        isolated=tuple((p.rank, p.node) for p in msg.isolated),
        held_nodes=frozenset(msg.held_nodes),
        outcome=msg.outcome,
        phase_log=tuple((_phase_from_pb(e.phase), ts_to_s(e.at), e.epoch) for e in msg.phase_log),
    )


def phase_log_to_pb(rec: Recovery) -> list[pb.PhaseEntry]:
    return [pb.PhaseEntry(phase=_phase_to_pb(p), at=ts_from_s(t), epoch=e) for p, t, e in rec.phase_log]  # type: ignore[arg-type]


def recovery_to_pb(rec: Recovery, uuid: str = "") -> pb.Recovery:
    msg = pb.Recovery(
        epoch=rec.epoch,
        uuid=uuid,
        phase=_phase_to_pb(rec.phase),  # type: ignore[arg-type]
        opened_at=ts_from_s(rec.opened_at),
        faults=[fault_to_pb(f) for f in rec.faults],
        participants=sorted(rec.participants),
        reported=sorted(rec.reported),
        has_supported=rec.supported is not None,
        supported=sorted(rec.supported or ()),
        strategy=rec.strategy,
        decision_reasons=list(rec.decision_reasons),
        failed_strategies=[pb.FailedStrategy(strategy=s, reason=r) for s, r in rec.failed_strategies],
        command_seq=rec.command_seq,
        command_nodes=sorted(rec.command_nodes),
        job_nodes=list(rec.job_nodes),
        isolated=[pb.RankPlace(rank=r, node=n) for r, n in rec.isolated],
        held_nodes=sorted(rec.held_nodes),
        outcome=rec.outcome,
        recovery_id=rec.recovery_id,
        phase_log=phase_log_to_pb(rec),
    )
    if rec.deadline_at is not None:
        msg.deadline_at.CopyFrom(ts_from_s(rec.deadline_at))
    return msg
