"""``recoverctl timeline``: a recovery phase by phase, with durations. Pure (no etcd, no clock).

Only the job's current (or last) recovery has a phase log: it lives in the run's ``recovery``
record, which the next recovery overwrites (docs/keyspace.md). Of an earlier recovery, what is
kept is its outcome in ``history`` (strategy, ranks, opened and closed, ok: no recovery id) and
its events while the log's cap keeps them, among which a ``phase`` event for each coordinator pass
that changed the phase (not each phase: a pass may go through several, e.g. STOPPING -> DECIDING
via GLOBAL_FAULT). So a timeline exists for the last recovery only, and asking for an earlier one
is answered with what is kept instead (:func:`unavailable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from recoverd import hangstacks
from recoverd.cli.render import enum_name, iso
from recoverd.jobview import JobView
from recoverd.records import pb, ts_to_s

__all__ = ["format_timeline", "timeline_dict", "unavailable"]


def unavailable(view: JobView, recovery: int | None) -> str | None:
    """Why ``recovery`` (None: the last one) has no timeline to show, or None when it has one."""
    last = view.recovery.recovery_id if view.recovery is not None else 0
    if recovery is None or recovery == last:
        return None
    if last == 0:
        return f"no recovery {recovery}: the job has had no recovery so far"
    if not 1 <= recovery < last:
        return f"no recovery {recovery}: the job's recoveries are 1 to {last}"
    return (
        f"recovery {recovery}'s phase log is not kept: only the last recovery ({last}) has one (the run's"
        " recovery record, which the next recovery overwrites). What is kept of it: its events, with a"
        " 'phase' event per coordinator pass that changed the phase (recoverctl events JOB), and its"
        " outcome in the run's history record"
    )


def timeline_dict(view: JobView, hangs: Sequence[hangstacks.HangStacks] = ()) -> dict[str, Any] | None:
    """The last recovery as (phase, start offset, duration) rows, from the fault's detection on,
    with the grouped summary of any stacks captured for it (``hangs``: the job's ``hang_stacks``)."""
    rec = view.recovery
    if rec is None or not rec.phase_log:
        return None
    detected = min((ts_to_s(f.detected_at) for f in rec.faults), default=ts_to_s(rec.opened_at))
    entries = [(enum_name(pb.Phase, e.phase, "PHASE_"), ts_to_s(e.at), e.epoch) for e in rec.phase_log]
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
        "recovery": rec.recovery_id,
        "strategy": rec.strategy,
        "fault_ranks": sorted({f.rank for f in rec.faults}),
        "detected_at": iso(detected),
        "total_ms": round((entries[-1][1] - detected) * 1000, 1),
        "phases": rows,
        "stacks": [
            {"fault_id": h.fault_id, "rank": h.event.rank, "node": h.event.node, "summary": h.summary}
            for h in hangs
            if h.recovery == rec.recovery_id
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
