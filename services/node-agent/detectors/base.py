"""What every detector shares: the fault kinds, one fault-id scheme, MindCluster's fault-type codes,
and the small interface a detector implements.

A **detector** turns an observation about a local rank (its process ended; a device plugin marks it
faulty; it stopped making progress; its device reports an uncorrectable error) into a
:class:`Detected` fault. It never acts on the rank: the agent queues the fault for the coordinator,
and the recovery ladder decides what happens (docs/detectors.md).

Why one module owns these facts: the coordinator merges faults by id and the strategy selector
decides ``retry`` from the MindCluster type, so two detectors that named or typed faults their own
way would recover the same rank twice, or retry what cannot be retried.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar, Protocol

from recoverd.records import pb

if TYPE_CHECKING:
    from recoverd.agent.ranktable import RankSlot
    from recoverd.agent.settings import AgentSettings

__all__ = [
    "Detected",
    "Detector",
    "DetectorHost",
    "FaultKind",
    "fault_id",
    "mindcluster_fault_type",
]


class FaultKind(StrEnum):
    """What was observed. Stored as ``Fault.kind``; ``recoverctl`` shows it."""

    #: The rank's process ended on its own with a failure (pidfd; or while no agent watched it).
    EXIT = "exit"
    #: A device plugin's reset.json marks the rank faulty.
    RESET = "reset"
    #: No progress for longer than the rank's timeout (a SIGSTOP, a deadlock, a blocked collective).
    HANG = "hang"
    #: An uncorrectable device-memory error: the step can be computed again (MindCluster's UCE).
    UCE = "uce"
    #: A collective-communication link error (MindCluster's HCCL type): retryable too.
    LINK = "link"
    #: A device error that is neither (e.g. a GPU XID that needs the process restarted).
    DEVICE = "device"
    #: The device is gone from the bus: nothing on it can be retried.
    DEVICE_LOST = "device-lost"


#: MindCluster's faultType for each kind (reference/mindcluster-contract.md): "0" UCE (retryable),
#: "2" HCCL link (retryable), "1" anything else. The strategy selector reads only this code.
_MINDCLUSTER_FAULT_TYPE: Mapping[FaultKind, str] = {FaultKind.UCE: "0", FaultKind.LINK: "2"}


def mindcluster_fault_type(kind: FaultKind) -> str:
    """The MindCluster fault type ("0", "1" or "2") of a fault kind."""
    return _MINDCLUSTER_FAULT_TYPE.get(kind, "1")


_MAX_ID = 253  # keys.check_id's limit


def fault_id(node: str, rank: int, generation: int, restart_count: int, kind: FaultKind, instance: str = "") -> str:
    """The one fault-id scheme: ``<node>.r<rank>.g<generation>.c<restarts>.<kind>[.<instance>]``.

    Deterministic per rank incarnation and kind, so the same observation made twice (a detector's
    retry, an agent restarted after writing it) is one fault; ``instance`` tells apart faults of one
    kind that can repeat within an incarnation (reset.json's UpdateTime, an XID's number and time).
    An id longer than etcd key segments allow keeps its tail and replaces the node by a digest.
    """
    tail = f"r{rank}.g{generation}.c{restart_count}.{kind.value}"
    if instance:
        tail += "." + "".join(c if c.isalnum() or c in "._:-" else "-" for c in instance)
    full = f"{node}.{tail}"
    if len(full) <= _MAX_ID:
        return full
    digest = hashlib.sha256(node.encode()).hexdigest()[:16]
    return f"n{digest}.{tail}"[:_MAX_ID]


@dataclass(frozen=True, slots=True)
class Detected:
    """One fault a detector found for a local rank; the agent turns it into a ``pb.Fault``."""

    rank: int
    kind: FaultKind
    #: One line a person reads in ``recoverctl events``: what was seen, with the numbers.
    detail: str
    #: Tells apart repeated faults of one kind within one incarnation (see :func:`fault_id`).
    instance: str = ""
    exit_code: int = 0
    signal: int = 0
    stderr_tail: str = ""
    stacks: tuple[pb.RankStack, ...] = ()
    #: When it was observed (wall clock); None: now. A hang is judged before its stacks are taken.
    detected_at: float | None = None
    #: (pid, generation, restart count) of the incarnation observed, for reports made after a wait
    #: (a hang's stacks): dropped if the rank has been restarted since. None: the current one.
    incarnation: tuple[int, int, int] | None = None


class DetectorHost(Protocol):
    """What the agent offers its detectors (and nothing more: a detector cannot stop a rank)."""

    @property
    def node(self) -> str: ...

    def ranks(self) -> Mapping[int, RankSlot]:
        """The node's ranks now (read-only for detectors)."""
        ...

    def spec(self) -> pb.JobSpec | None:
        """The job's spec (its run uid, its policy), once the agent has joined."""
        ...

    def report(self, found: Detected) -> None:
        """Queue a fault for the coordinator; the same fault id twice is one fault."""
        ...

    def note(
        self, reason: str, message: str, *, rank: int | None = None, data: Mapping[str, str] | None = None
    ) -> None:
        """Record an event (not a fault): e.g. a straggler, or a detector's own trouble."""
        ...


class Detector:
    """One source of faults. A new detector is one module and one entry in ``detectors.DETECTORS``.

    The agent builds every registered detector whose :meth:`wanted` says yes, runs :meth:`run` for
    the agent's whole life (restarted with a back-off, and the failure recorded, if it raises), and
    tells it when a rank incarnation starts or ends. Detectors fed by the agent itself (exits) have
    nothing to run.
    """

    #: Short name, used in events and logs.
    name: ClassVar[str]

    def __init__(self, host: DetectorHost, settings: AgentSettings) -> None:
        self.host = host
        self.settings = settings

    @classmethod
    def wanted(cls, settings: AgentSettings) -> bool:
        """Whether this agent runs the detector (e.g. only with ``--reset-json``)."""
        return True

    async def run(self) -> None:
        """Watch for faults until cancelled. The default has nothing to watch."""
        await asyncio.Event().wait()

    def rank_started(self, slot: RankSlot) -> None:
        """A new incarnation of ``slot`` runs (started, or adopted after an agent restart)."""

    def rank_ended(self, slot: RankSlot) -> None:
        """``slot``'s incarnation ended (any reason): forget what was known about it."""

    def recovery_changed(self, active: bool) -> None:
        """A recovery of the job began (``active``) or ended: ranks are stopped and restarted on
        purpose meanwhile, so judging their progress then would find hangs that are not."""
