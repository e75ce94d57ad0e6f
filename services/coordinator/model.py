"""What a job's recovery is: its phases, its deadlines, its faults, the record itself, and the job's
layout as the shell read it. Plain frozen values; the walk that changes them is ``recovery.py``.

``Recovery`` is the in-process form of the stored ``recoverd.v1.Recovery`` (``codec.py`` converts);
``Layout`` is never stored: the shell builds it from each pass's read (``observe.job_layout``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

__all__ = [
    "ACTIVE_PHASES",
    "WAITING_PHASES",
    "FaultInfo",
    "Layout",
    "Phase",
    "Recovery",
    "Timeouts",
]


class Phase(StrEnum):
    """Where a job's recovery stands. Stored by name in the recovery record."""

    COLLECTING = "COLLECTING"
    """A fault opened the recovery; further faults are collected for ``fault_window_s``
    (upstream's fault flush) so near-simultaneous faults become one recovery. Exit: the window's
    deadline -> STOPPING."""

    STOPPING = "STOPPING"
    """stopTrain was sent; waiting for every participant's stop-complete. Deadline: ``stop_s``;
    on expiry (or a non-zero stop code) only `exit` remains."""

    GLOBAL_FAULT = "GLOBAL_FAULT"
    """globalFault was sent with the fault ranks; waiting for every participant's supported
    strategies. Deadline: ``strategies_s``; on expiry only `exit` remains."""

    DECIDING = "DECIDING"
    """Waiting for the strategy selector's decision for this epoch. Deadline: ``decide_s``; on
    expiry the coordinator applies `exit`, which is always safe, and says so. With a lost node the
    deadline is at least ``replacement_s`` after it was lost: the selector waits that long for an
    agent to replace it; if none came by the deadline the job fails, saying so."""

    RECOVERING = "RECOVERING"
    """changeStrategy and the agents' commands were sent; waiting for the recover status of every
    participant and of every commanded node's agent. Deadline: ``recover_s``; on expiry the strategy has failed."""

    DONE = "DONE"
    """No recovery in progress (none yet, or the last one succeeded). A fault opens a new one."""

    FAILED = "FAILED"
    """No strategy is left (or `exit` failed): the job is failed, killMaster was sent. Terminal."""


#: A recovery is in progress (a fault merges into it rather than opening a new one).
ACTIVE_PHASES = frozenset({Phase.COLLECTING, Phase.STOPPING, Phase.GLOBAL_FAULT, Phase.DECIDING, Phase.RECOVERING})
#: The phases that end when everyone required has answered (``recovery._all_reported``).
WAITING_PHASES = frozenset({Phase.STOPPING, Phase.GLOBAL_FAULT, Phase.RECOVERING})


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Every wait of the state machine, in seconds. Defaults are far below MindCluster's 15 minutes."""

    fault_window_s: float = 0.2
    stop_s: float = 10.0
    strategies_s: float = 10.0
    decide_s: float = 30.0
    recover_s: float = 60.0
    #: COLLECTING also ends this long after the last fault arrived (0: only the window ends it).
    #: A burst (a node's ranks, a collective's cascade) arrives within milliseconds; waiting out the
    #: whole window after it only delays the recovery (docs/adr/0034: 10 ms since issue 15's stop 23,
    #: the largest wait of a recover-in-place's control plane at 30 ms).
    fault_settle_s: float = 0.01
    #: How long a lost node with no spare waits for an agent to replace it (the job's policy,
    #: ``deadlines.replacement``; 0: no wait). Counted from when the node was declared lost.
    replacement_s: float = 120.0

    def collect_deadline(self, opened_at: float, last_fault_at: float) -> float:
        """When COLLECTING ends: ``fault_settle_s`` after the last fault, at most ``fault_window_s``
        after the first."""
        window_end = opened_at + self.fault_window_s
        if self.fault_settle_s <= 0:
            return window_end
        return min(window_end, last_fault_at + self.fault_settle_s)

    def for_phase(self, phase: Phase) -> float | None:
        return {
            Phase.COLLECTING: self.fault_window_s,
            Phase.STOPPING: self.stop_s,
            Phase.GLOBAL_FAULT: self.strategies_s,
            Phase.DECIDING: self.decide_s,
            Phase.RECOVERING: self.recover_s,
        }.get(phase)


@dataclass(frozen=True, slots=True)
class FaultInfo:
    """One fault merged into a recovery."""

    fault_id: str
    rank: int
    node: str
    fault_type: str = "1"
    source: str = "agent"
    exit_code: int = 0
    signal: int = 0
    generation: int = 0
    detected_at: float = 0.0
    detail: str = ""
    #: What was observed (the agent's detectors: exit, hang, reset, uce, ...); "" when unknown.
    kind: str = ""


@dataclass(frozen=True, slots=True)
class Recovery:
    """A job's recovery record (in-process form of ``recoverd.v1.Recovery``).

    ``epoch`` numbers rounds: it grows when a recovery opens, when a late fault restarts the round,
    when a failed strategy goes back to DECIDING, and when a saved `dump` is followed by its `exit`.
    Every report and decision names the epoch it answers; anything older is stale. ``reported``
    holds the participants that answered the current waiting phase (in RECOVERING also commanded
    agents that are not participants); ``supported`` is what every participant said it can do
    (GLOBAL_FAULT's answers).
    """

    phase: Phase = Phase.DONE
    epoch: int = 0
    recovery_id: int = 0
    opened_at: float = 0.0
    deadline_at: float | None = None
    faults: tuple[FaultInfo, ...] = ()
    participants: frozenset[str] = frozenset()
    reported: frozenset[str] = frozenset()
    supported: frozenset[str] | None = None
    strategy: str = ""
    decision_reasons: tuple[str, ...] = ()
    failed_strategies: tuple[tuple[str, str], ...] = ()
    command_seq: int = 0
    #: Nodes sent a command in this RECOVERING phase: their agents must confirm it too.
    command_nodes: frozenset[str] = frozenset()
    #: While a `dump` runs: every node of the job (its trailing `exit` restarts them all); else empty.
    job_nodes: tuple[str, ...] = ()
    #: (rank, node it ran on) of ranks out of the job after a downgrade; kept across recoveries.
    isolated: tuple[tuple[int, str], ...] = ()
    outcome: str = ""
    phase_log: tuple[tuple[Phase, float, int], ...] = field(default=())
    #: Nodes whose lease expired while etcd was in trouble, held as live by the shell for a grace
    #: (``leasehold.py``, docs/adr/0045); recorded for the selector, never read by ``step``.
    held_nodes: frozenset[str] = frozenset()

    @property
    def fault_ranks(self) -> tuple[int, ...]:
        return tuple(sorted({f.rank for f in self.faults}))

    @property
    def is_active(self) -> bool:
        return self.phase in ACTIVE_PHASES


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the job's ranks are, as the shell read it: what `recover`, `elastic-training`, `exit`
    and upgrades need to address whole nodes."""

    #: node -> the ranks its agent runs now (from the rank tables).
    placement: tuple[tuple[str, tuple[int, ...]], ...] = ()
    #: Nodes whose agent is alive (registered under a live lease).
    live: frozenset[str] = frozenset()
    #: Live spare nodes holding no ranks, in the order to use them.
    spares: tuple[str, ...] = ()
    #: node rank -> the live (non-spare) node registered with it: where a homeless rank belongs.
    homes: tuple[tuple[int, str], ...] = ()
    world_size: int = 0
    nproc_per_node: int = 0

    def ranks_on(self, node: str) -> tuple[int, ...]:
        return next((ranks for name, ranks in self.placement if name == node), ())

    def where(self) -> dict[int, str]:
        """rank -> the node whose rank table holds it (a live node's table wins over a dead one's)."""
        placed: dict[int, str] = {}
        for live_first in (False, True):
            for node, ranks in self.placement:
                if (node in self.live) == live_first:
                    placed.update(dict.fromkeys(ranks, node))
        return placed
