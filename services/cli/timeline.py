"""``recoverctl timeline``: a recovery phase by phase, with durations. Pure (no etcd, no clock).

The current (or last) recovery's phase log is in the run's ``recovery`` record, which the next
recovery overwrites (docs/keyspace.md). Every outcome of a recovery (each strategy that ended, in
``history``) keeps that recovery's id and its phase log up to then, so an earlier recovery's
timeline comes from its last outcome while the history's cap (100 outcomes) keeps it. Outcomes
written before recoverd kept phase logs have none: :func:`unavailable` says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from recoverd import hangstacks
from recoverd.cli.render import enum_name, iso
from recoverd.jobview import JobView
from recoverd.records import pb, ts_to_s

__all__ = ["format_timeline", "timeline_dict", "unavailable"]


def _outcome_of(view: JobView, recovery: int) -> pb.RecoveryOutcome | None:
    """The last outcome of ``recovery`` that kept a phase log (its history record), if any."""
    outcomes = view.history.outcomes if view.history is not None else ()
    found = [o for o in outcomes if o.recovery_id == recovery and o.phase_log]
    return found[-1] if found else None


def unavailable(view: JobView, recovery: int | None) -> str | None:
    """Why ``recovery`` (None: the last one) has no timeline to show, or None when it has one."""
    last = view.recovery.recovery_id if view.recovery is not None else 0
    if recovery is None or recovery == last:
        return None
    if last == 0:
        return f"no recovery {recovery}: the job has had no recovery so far"
    if not 1 <= recovery < last:
        return f"no recovery {recovery}: the job's recoveries are 1 to {last}"
    if _outcome_of(view, recovery) is not None:
        return None
    return (
        f"recovery {recovery}'s phase log is not kept: its outcomes left the history (it keeps the last 100),"
        " or were written before recoverd kept phase logs. What is kept of it: its events (recoverctl events JOB)"
    )


def timeline_dict(
    view: JobView, hangs: Sequence[hangstacks.HangStacks] = (), recovery: int | None = None
) -> dict[str, Any] | None:
    """A recovery (default: the last) as (phase, start offset, duration) rows, from the fault's
    detection on, with the grouped summary of any stacks captured for it (``hangs``: the job's
    ``hang_stacks``). An earlier recovery comes from its outcome in the history (:func:`unavailable`)."""
    rec = view.recovery
    if rec is None:
        return None
    if recovery is not None and recovery != rec.recovery_id:
        outcome = _outcome_of(view, recovery)
        if outcome is None:
            return None
        return _rows(recovery, outcome.strategy, sorted(outcome.ranks), ts_to_s(outcome.detected_at),
                     outcome.phase_log, hangs)  # fmt: skip
    if not rec.phase_log:
        return None
    detected = min((ts_to_s(f.detected_at) for f in rec.faults), default=ts_to_s(rec.opened_at))
    return _rows(rec.recovery_id, rec.strategy, sorted({f.rank for f in rec.faults}), detected, rec.phase_log, hangs)


def _rows(
    recovery: int,
    strategy: str,
    fault_ranks: list[int],
    detected: float,
    phase_log: Sequence[pb.PhaseEntry],
    hangs: Sequence[hangstacks.HangStacks],
) -> dict[str, Any]:
    entries = [(enum_name(pb.Phase, e.phase, "PHASE_"), ts_to_s(e.at), e.epoch) for e in phase_log]
    rows = [
        {
            "phase": "DETECTED",
            "epoch": entries[0][2],
            "at_ms": 0.0,
            "duration_ms": round((entries[0][1] - detected) * 1000, 1),
        }
    ]
    for i, (phase, at, epoch) in enumerate(entries):
        end = entries[i + 1][1] if i + 1 < len(entries) else None
        rows.append(
            {
                "phase": phase,
                "epoch": epoch,
                "at_ms": round((at - detected) * 1000, 1),
                "duration_ms": round((end - at) * 1000, 1) if end is not None else None,
            }
        )
    return {
        "recovery": recovery,
        "strategy": strategy,
        "fault_ranks": fault_ranks,
        "detected_at": iso(detected),
        "total_ms": round((entries[-1][1] - detected) * 1000, 1),
        "phases": rows,
        "stacks": [
            {"fault_id": h.fault_id, "rank": h.event.rank, "node": h.event.node, "summary": h.summary}
            for h in hangs
            if h.recovery == recovery
        ],
    }


def format_timeline(data: dict[str, Any] | None) -> str:
    if data is None:
        return "no recovery so far"
    lines = [
        f"recovery {data['recovery']}: ranks {data['fault_ranks']}, strategy {data['strategy'] or '-'},"
        f" fault detected {data['detected_at']}, {data['total_ms']:.1f} ms to the last phase",
    ]
    for hang in data.get("stacks", []):
        lines.append(f"stacks at rank {hang['rank']} on {hang['node']}: {hang['summary']} (recoverctl stacks)")
    lines.append(f"{'PHASE':<14} {'EPOCH':>5} {'AT (ms)':>9} {'TOOK (ms)':>10}")
    for row in data["phases"]:
        took = "-" if row["duration_ms"] is None else f"{row['duration_ms']:.1f}"
        lines.append(f"{row['phase']:<14} {row['epoch']:>5} {row['at_ms']:>9.1f} {took:>10}")
    return "\n".join(lines)
