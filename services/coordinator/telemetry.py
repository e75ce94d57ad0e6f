"""What a committed pass tells Prometheus: the phases a recovery left, the faults it merged, and
whether it closed (``recoverd.metrics``).

:func:`observe` is pure: it compares the recovery record before and after one pass. The reconciler
calls :func:`record` only once the pass's transaction committed, so a pass that lost its fence (and
runs again) is never counted twice; a new leader counts from what it commits itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from recoverd import metrics
from recoverd.coordinator.model import Phase, Recovery

__all__ = ["Observations", "observe", "record"]


@dataclass(frozen=True, slots=True)
class Observations:
    #: (phase left, seconds spent in it), in the order they were left.
    phases: tuple[tuple[str, float], ...] = ()
    #: (MindCluster fault type, source, seconds from detection to this pass) per fault merged.
    faults: tuple[tuple[str, str, float], ...] = ()
    #: (strategy, outcome, seconds from the first fault's detection to DONE/FAILED) if it closed.
    closed: tuple[str, str, float] | None = None


def observe(before: Recovery, after: Recovery, now: float) -> Observations:
    log = after.phase_log
    same = after.recovery_id == before.recovery_id and log[: len(before.phase_log)] == before.phase_log
    first_new = len(before.phase_log) if same else 0
    phases = tuple((log[i - 1][0].value, log[i][1] - log[i - 1][1]) for i in range(max(first_new, 1), len(log)))
    known = {f.fault_id for f in before.faults} if same else set()
    faults = tuple(
        (f.fault_type, f.source, max(0.0, now - f.detected_at))
        for f in after.faults
        if f.fault_id not in known and f.detected_at > 0
    )
    closed = None
    if after.phase in (Phase.DONE, Phase.FAILED) and (not same or before.phase is not after.phase) and log:
        ended = log[-1][1]
        detected = [f.detected_at for f in after.faults if f.detected_at > 0]
        began = min(detected) if detected else after.opened_at
        outcome = "succeeded" if after.phase is Phase.DONE else "failed"
        closed = (after.strategy or "none", outcome, max(0.0, ended - began))
    return Observations(phases, faults, closed)


def record(seen: Observations) -> None:
    for phase, seconds in seen.phases:
        metrics.PHASE_SECONDS.labels(phase).observe(seconds)
    for fault_type, source, seconds in seen.faults:
        metrics.FAULTS.labels(fault_type, source).inc()
        metrics.DETECTION_SECONDS.observe(seconds)
    if seen.closed is not None:
        strategy, outcome, seconds = seen.closed
        metrics.RECOVERIES.labels(strategy, outcome).inc()
        if outcome == "succeeded":
            metrics.RECOVERY_SECONDS.labels(strategy).observe(seconds)
