"""The node's rank table: each local rank across its incarnations, and its record in etcd.

Desired and observed apart, as torchelastic keeps ``WorkerSpec`` apart from ``Worker``: a
:class:`RankSlot` is one rank this node is responsible for (it survives restarts of the rank), its
``proc`` the incarnation running now. The table is what the agent publishes as ``ranks/<node>``
(pb.NodeRanks): one key per node, written whole (docs/adr/0009).

Rank states (pb.RankState), in their normal order:

* ``RANK_PENDING``: not started yet;
* ``RANK_RUNNING``: an incarnation runs (started or adopted by this agent);
* ``RANK_STOPPED``: the agent stopped it (a command or the agent's own end): never a fault;
* ``RANK_SUCCEEDED``: it exited 0 on its own;
* ``RANK_FAILED``: it exited otherwise, or could not be started: a fault was recorded.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from recoverd.agent.launcher import RankProcess
from recoverd.records import LIVE_RANK_STATES, pb, ts_from_s

__all__ = ["LIVE_STATES", "RankSlot", "RankTable"]

#: States in which a rank holds (or is about to hold) a process.
LIVE_STATES = LIVE_RANK_STATES


@dataclass(slots=True)
class RankSlot:
    """One local rank across its incarnations."""

    rank: int
    local_rank: int
    proc: RankProcess | None = None
    state: int = pb.RANK_PENDING
    generation: int = 0
    restart_count: int = 0
    exit_code: int = 0
    signal: int = 0
    #: Set while the agent itself is stopping this incarnation: its exit is not a fault.
    is_stopping: bool = False

    @property
    def is_running(self) -> bool:
        return self.proc is not None and self.proc.is_running

    @property
    def incarnation(self) -> tuple[int, int, int]:
        """(pid, generation, restart count): which incarnation this is, for observations that are
        reported after a wait (a hang's stacks) and must not be charged to a later one."""
        return (self.proc.pid if self.proc is not None else 0, self.generation, self.restart_count)


class RankTable:
    """The ranks this node runs now (a `recover` adds moved ranks, a RELEASE removes them)."""

    def __init__(self, node: str, nproc_per_node: int, ranks: Iterable[int]) -> None:
        self.node = node
        self.nproc_per_node = nproc_per_node
        self.slots: dict[int, RankSlot] = {}
        for rank in ranks:
            self.add(rank)

    def add(self, rank: int) -> RankSlot:
        """The slot of ``rank``, created if this node did not hold it (idempotent)."""
        slot = self.slots.get(rank)
        if slot is None:
            slot = self.slots[rank] = RankSlot(rank, rank % self.nproc_per_node)
        return slot

    def remove(self, rank: int) -> None:
        self.slots.pop(rank, None)

    def __contains__(self, rank: object) -> bool:
        return rank in self.slots

    def __iter__(self) -> Iterator[RankSlot]:
        return iter(list(self.slots.values()))

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.slots)

    def running(self) -> list[RankSlot]:
        return [s for s in self.slots.values() if s.is_running]

    def to_pb(self, warm_spare_pids: Iterable[int] = ()) -> pb.NodeRanks:
        return pb.NodeRanks(
            node=self.node,
            updated_at=ts_from_s(time.time()),
            ranks=[
                pb.RankStatus(
                    rank=s.rank,
                    local_rank=s.local_rank,
                    pid=s.proc.pid if s.proc else 0,
                    state=s.state,  # type: ignore[arg-type]
                    generation=s.generation,
                    restart_count=s.restart_count,
                    exit_code=s.exit_code,
                    signal=s.signal,
                    started_at=ts_from_s(s.proc.started_at) if s.proc else None,
                    node=self.node,
                )
                for s in self.slots.values()
            ],
            warm_spare_pids=list(warm_spare_pids),
        )
