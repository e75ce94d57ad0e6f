"""The coordinator's settings: every wait and bound of one coordinator process.

Built once in ``recoverd.cli`` from the command line and passed down; every coordinator replica
must run with the same values (docs/architecture.md, Settings). A job's policy may override the
phase deadlines (``observe.job_timeouts``), nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from recoverd.coordinator.model import Timeouts

__all__ = ["CoordinatorSettings"]


@dataclass(frozen=True, slots=True)
class CoordinatorSettings:
    """Every wait and bound of the coordinator (seconds unless named otherwise)."""

    timeouts: Timeouts = field(default_factory=Timeouts)
    lease_ttl_s: float = 5.0
    #: Events kept per run; older ones are deleted when a recovery closes.
    event_cap: int = 1000
    #: Finished runs' keys are deleted this long after they finished.
    retention_s: float = 3600.0
    #: Outcomes kept in a run's history (budgets only look at the window anyway).
    history_cap: int = 100
    #: Signals kept per run (subscribers read them by watch; old ones are only for inspection).
    signal_cap: int = 64
    #: Keys one pass consumes at most, per kind; the rest wait for the next pass (requeued at
    #: once). Together they keep a pass's fenced transaction under etcd's 128 operations.
    faults_per_pass: int = 64
    bad_keys_per_pass: int = 24
    stale_reports_per_pass: int = 16
    cleanups_per_pass: int = 8
    #: How long a node record overwritten without its lease (its rank table still there) counts as
    #: its live node, for its agent to write it again, before it is removed.
    clobbered_node_grace_s: float = 10.0
    #: How long a node whose lease expired within this long of trouble in etcd (a hung or
    #: leaderless member, a leader change) is held as live for its agent to register again
    #: (docs/adr/0045); 0: never held.
    etcd_trouble_grace_s: float = 5.0
