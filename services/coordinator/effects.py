"""What :func:`recovery.step` asks the shell to do: imperatives, as frozen dataclasses.

The state machine only returns them; ``writes.py`` turns each into etcd operations (and events),
which the shell commits with the new recovery record in one fenced transaction (``commit.py``).
``Effect`` is the union ``step`` returns.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Effect", "EmitEvent", "FinishJob", "ForgetNode", "PublishSignal", "RecordOutcome", "SendCommand"]


@dataclass(frozen=True, slots=True)
class PublishSignal:
    """Send a process-management signal in MindCluster's wire form to the job's participants."""

    signal_type: str
    actions: tuple[str, ...]
    fault_ranks: tuple[tuple[int, str], ...] = ()
    change_strategy: str = ""
    extra_params: str = ""


@dataclass(frozen=True, slots=True)
class SendCommand:
    """Tell one node agent what to do to its processes; (epoch, seq) makes it idempotent."""

    node: str
    action: str  # "RESTART_RANKS" | "RESTART_ALL" | "START_RANKS" | "RELEASE_RANKS"
    ranks: tuple[int, ...]
    seq: int
    strategy: str


@dataclass(frozen=True, slots=True)
class RecordOutcome:
    """Append the finished recovery to the job's history (restart budgets read it)."""

    strategy: str
    ranks: tuple[int, ...]
    ok: bool


@dataclass(frozen=True, slots=True)
class FinishJob:
    """Write the job's final status."""

    succeeded: bool
    reason: str


@dataclass(frozen=True, slots=True)
class ForgetNode:
    """A lost node's ranks run elsewhere now (or are isolated): remove its rank table, so its last
    rank states are not read as running ranks (lost-node faults) again. (A RELEASE_RANKS command
    is left for its agent, should it come back.)"""

    node: str


@dataclass(frozen=True, slots=True)
class EmitEvent:
    reason: str
    message: str


Effect = PublishSignal | SendCommand | RecordOutcome | FinishJob | ForgetNode | EmitEvent
