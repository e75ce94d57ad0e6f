"""Host-RAM copies of a peer's shard: a sharded model with no twin is healed from a peer's memory.

Pure FSDP has no replicate dimension: a rank's shard lives in that rank only, so after its death
no peer can send it (``agreement.NoTwin``). With ``ResilientTrainer(mesh=..., ram_copy_every=N)``
each rank, at the start of every N-th step, keeps its own shard as it is then (a copy in its own
RAM) and sends a copy to its **holder**, a rank on another node where there is one, which keeps it
in its RAM; the transfer runs on a thread of its own, on a process group of its own, while training
goes on. When a rank is lost and no twin has its shard, every rank goes back to the last copy step
``c`` that all of them can restore: the survivors load their own copy of ``c``, the replacement
receives its shard of ``c`` from its holder, and the steps since ``c`` are run again. No disk is
read. Each rank pays one shard of RAM for its own copies (the last two) and one for its source's,
and one shard sent every N steps (docs/pytorch.md has the measured cost).

Where no copy can be restored (the holder was lost too, or a rank lacks its own copy of ``c``), the
restore raises ``NoTwin`` with the reason and recoverd falls back to the job's checkpoint.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from taskd_client.pytorch.agreement import NoTwin

__all__ = ["CopyPlan", "RamCopies", "holder_of", "plan_restore"]

#: How many copy steps a rank keeps of its own shard (and of its source's): a fault while the
#: newest copy is still in flight restores the one before.
KEPT = 2
_SIZE_TAG, _BYTES_TAG = 11, 12


def holder_of(rank: int, world_size: int, per_node: int) -> int:
    """The rank that keeps ``rank``'s copy: the same local rank on the next node (a lost node takes
    no copy of its own ranks with it), or the next rank on a single node."""
    if world_size < 2:
        return rank
    step = per_node if 0 < per_node < world_size else 1
    return (rank + step) % world_size


@dataclass(frozen=True, slots=True)
class CopyPlan:
    """Where every rank goes back to: ``step``, and for each lost rank the holder that sends it."""

    step: int
    senders: Mapping[int, int]


def plan_restore(
    own: Sequence[Sequence[int]], held: Sequence[Sequence[int]], lost: Sequence[int], holder: Callable[[int], int]
) -> CopyPlan:
    """The latest copy step every rank can restore (pure). ``own[r]``: the steps of rank r's own
    copies; ``held[r]``: the steps of the copies it holds of its source's shard; ``lost``: the ranks
    with no state (replacements). NoTwin with the reason where there is none."""
    world = range(len(own))
    lost_set = set(lost)
    for rank in lost_set:
        if holder(rank) in lost_set or holder(rank) == rank:
            raise NoTwin(f"rank {rank}'s shard and its RAM copy (held by rank {holder(rank)}) are both lost")
    candidates = set.intersection(
        *(set(own[r]) for r in world if r not in lost_set), *(set(held[holder(r)]) for r in lost_set)
    ) - {-1}
    if not candidates:
        lacking = [r for r in world if r not in lost_set and all(s < 0 for s in own[r])]
        raise NoTwin(
            f"no copy step is held for every shard (own copies: {[list(s) for s in own]}, held:"
            f" {[list(s) for s in held]}{f'; ranks {lacking} have none' if lacking else ''})"
        )
    return CopyPlan(max(candidates), {rank: holder(rank) for rank in sorted(lost_set)})


@dataclass
class RamCopies:
    """This rank's copies: its own shard at the last copy steps, and its source's (see the module
    docstring). ``every``: the copy interval in steps."""

    every: int
    rank: int
    world_size: int
    per_node: int
    #: step -> this rank's own state then (the bytes a restore loads).
    own: dict[int, torch.Tensor] = field(default_factory=dict)
    #: step -> the source's state then, received whole.
    held: dict[int, torch.Tensor] = field(default_factory=dict)
    #: The generation's group the copies travel on (one of its own: never beside a collective).
    group: Any = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: Seconds the last exchange took and bytes sent (measured, reported in the trainer's log).
    last: tuple[int, float, int] | None = None

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"ram_copy_every must be a positive number of steps, not {self.every}")

    @property
    def holder(self) -> int:
        return holder_of(self.rank, self.world_size, self.per_node)

    @property
    def source(self) -> int:
        """Whose copy this rank holds."""
        return next(r for r in range(self.world_size) if holder_of(r, self.world_size, self.per_node) == self.rank)

    def due(self, step: int) -> bool:
        return step % self.every == 0 and step not in self.own

    def connect(self, group: Any) -> None:
        """A new generation's copy group: an exchange in flight on the old one is left behind (its
        copy never counts: only a copy received whole is kept)."""
        self.group = group
        self._thread = None

    def take(self, step: int, blob: torch.Tensor, aborted: Callable[[], bool]) -> None:
        """Keep ``blob`` (this rank's state at ``step``) and exchange copies with the holder and the
        source on a thread, while training goes on. The previous exchange is waited for first,
        unless ``aborted()`` says the generation is being replaced (then it is left behind)."""
        self.own[step] = blob
        _trim(self.own)
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(0.005)
            if aborted():
                self._thread = None
                return
        if self.group is None or self.world_size < 2:
            return
        group, holder, source = self.group, self.holder, self.source
        thread = threading.Thread(
            target=self._exchange, args=(group, step, blob, holder, source), name=f"ram-copy-{step}", daemon=True
        )
        self._thread = thread
        thread.start()

    def _exchange(self, group: Any, step: int, blob: torch.Tensor, holder: int, source: int) -> None:
        import time

        started = time.monotonic()
        try:
            size = torch.tensor([blob.numel()], dtype=torch.int64)
            sends = [group.send([size], holder, _SIZE_TAG), group.send([blob], holder, _BYTES_TAG)]
            incoming = torch.zeros(1, dtype=torch.int64)
            group.recv([incoming], source, _SIZE_TAG).wait()
            data = torch.empty(int(incoming[0]), dtype=torch.uint8)
            group.recv([data], source, _BYTES_TAG).wait()
            for work in sends:
                work.wait()
        except RuntimeError:
            return  # a peer died: this copy does not count (the generation is being replaced)
        with self._lock:
            if self.group is group:
                self.held[step] = data
                _trim(self.held)
                self.last = (step, time.monotonic() - started, blob.numel())

    def steps(self) -> tuple[list[int], list[int]]:
        """The steps of this rank's own copies and of the copies it holds."""
        with self._lock:
            return sorted(self.own), sorted(self.held)

    def restored(self, step: int, blob: torch.Tensor | None) -> None:
        """After a restore to ``step``: newer own copies are dropped (they will be taken again);
        a replacement keeps the copy it received as its own."""
        if blob is not None:
            self.own[step] = blob
        for kept in [s for s in self.own if s > step]:
            del self.own[kept]


def _trim(copies: dict[int, torch.Tensor]) -> None:
    for step in sorted(copies)[:-KEPT]:
        del copies[step]
