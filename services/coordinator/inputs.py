"""The state machine's inputs: past-tense facts the shell observed, as frozen dataclasses.

The shell derives them from each pass's read of the job (``observe.py``) and folds them in a fixed
order (``fold.py``); :func:`recovery.step` is their only consumer. Every input tied to a round
names the epoch it answers, so a late one is recognisably stale (``StaleEpoch``). ``Event`` is the
union ``step`` accepts; its members are the event types of ``recovery.TRANSITIONS``.
"""

from __future__ import annotations

from dataclasses import dataclass

from recoverd.coordinator.model import FaultInfo, Layout

__all__ = [
    "CapacityReturned",
    "CommandedNodeLost",
    "DeadlinePassed",
    "DecisionMade",
    "Event",
    "FaultReported",
    "ParticipantsChanged",
    "RecoverStatusReported",
    "StopCompleted",
    "StrategiesReported",
]


@dataclass(frozen=True, slots=True)
class FaultReported:
    """A detector recorded a fault (agent: a rank exited; client: report_process_fault).

    ``more``: other faults read in the same pass, merged with this one as one (a node lost at 512
    nodes is 8 faults; 100 lost leases are 800): one round, one epoch and one stopTrain for all of
    them, not one per fault.
    """

    fault: FaultInfo
    participants: frozenset[str] = frozenset()
    more: tuple[FaultInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class DeadlinePassed:
    """The current phase's ``deadline_at`` is behind ``now``. ``nodes`` are the job's nodes, for
    the `exit` the coordinator applies itself when no decision came in time."""

    epoch: int
    nodes: tuple[str, ...] = ()
    layout: Layout | None = None


@dataclass(frozen=True, slots=True)
class StopCompleted:
    epoch: int
    participant: str
    code: int = 0


@dataclass(frozen=True, slots=True)
class StrategiesReported:
    epoch: int
    participant: str
    strategies: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DecisionMade:
    """The selector answered for this epoch. ``nodes`` are the job's nodes, for `exit`'s commands."""

    epoch: int
    strategy: str
    reasons: tuple[str, ...] = ()
    give_up: bool = False
    nodes: tuple[str, ...] = ()
    #: `recover`: (faulty node, spare node) pairs chosen by the selector.
    moves: tuple[tuple[str, str], ...] = ()
    layout: Layout | None = None


@dataclass(frozen=True, slots=True)
class RecoverStatusReported:
    epoch: int
    participant: str
    code: int
    strategy: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class ParticipantsChanged:
    """The set of live participants changed (an agent's or client's lease expired, or one joined)."""

    participants: frozenset[str]


@dataclass(frozen=True, slots=True)
class CapacityReturned:
    """Idle spare nodes are registered while ranks are isolated by a downgrade: scale back out."""

    layout: Layout


@dataclass(frozen=True, slots=True)
class CommandedNodeLost:
    """Nodes are not live any more (their agent's lease expired, or their record is gone). The shell
    names every commanded node it does not see live; ``_commanded_node_lost`` decides which count."""

    epoch: int
    nodes: frozenset[str]


Event = (
    FaultReported
    | DeadlinePassed
    | StopCompleted
    | StrategiesReported
    | DecisionMade
    | RecoverStatusReported
    | ParticipantsChanged
    | CapacityReturned
    | CommandedNodeLost
)
