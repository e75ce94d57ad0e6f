"""Which samples a data-parallel rank takes at a step, for a world whose size may change: pure.

``DistributedSampler`` fixes the world when it is built and shards an epoch by rank, so after a
downgrade (4 -> 2 replicas) its shards no longer cover the data, and after an upgrade they overlap.
Here the data order does not depend on the world at all: every epoch is one seeded permutation of
the dataset, step ``s`` covers positions ``[s * G, (s + 1) * G)`` of that stream (``G``: the global
batch), and data-parallel rank ``r`` of ``w`` takes every ``w``-th of those positions, starting at
``r``. So a step's global batch is the same samples whatever the world is, each taken by exactly one
rank; a world change only changes how a step's batch is split. With the per-rank losses averaged
(``ResilientTrainer.apply`` divides the summed gradients by the world size), the update of a step
is that of the same global batch, provided ``G`` is a multiple of the world size (otherwise ranks
get ``G // w`` or ``G // w + 1`` samples and the ranks' means are weighted equally).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["ElasticShards", "shard_indices"]


def _permutation(length: int, seed: int, epoch: int) -> list[int]:
    order = list(range(length))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def shard_indices(length: int, step: int, rank: int, world: int, global_batch: int, seed: int = 0) -> list[int]:
    """The dataset indices data-parallel ``rank`` of ``world`` takes at ``step`` (see the module
    docstring). Raises ValueError for a rank outside the world or an empty dataset or batch."""
    return ElasticShards(length, global_batch, seed).indices(step, rank, world)


@dataclass(slots=True)
class ElasticShards:
    """``shards = ElasticShards(len(dataset), global_batch=64)``; each step
    ``dataset[i] for i in shards.indices(step, trainer.rank, trainer.world_size)``.

    Keeps the last epoch's permutation, so a call costs O(G / w) once the epoch's order is built."""

    length: int
    global_batch: int
    seed: int = 0
    _cached: tuple[int, list[int]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.length <= 0 or self.global_batch <= 0:
            raise ValueError(f"need a non-empty dataset and batch (length {self.length}, batch {self.global_batch})")

    def _order(self, epoch: int) -> list[int]:
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, _permutation(self.length, self.seed, epoch))
        return self._cached[1]

    def indices(self, step: int, rank: int, world: int) -> list[int]:
        if world <= 0 or not 0 <= rank < world or step < 0:
            raise ValueError(f"rank {rank} of world {world} at step {step}")
        start = step * self.global_batch
        out = []
        for position in range(start + rank, start + self.global_batch, world):
            epoch, offset = divmod(position, self.length)
            out.append(self._order(epoch)[offset])
        return out
