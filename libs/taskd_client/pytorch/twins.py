"""The trainer's side of a sharded model (FSDP2, HSDP): a replacement is healed from its twin.

With ``ResilientTrainer(model, optimizer, mesh=mesh)`` (a mesh from :func:`.mesh.resilient_mesh`)
no rank holds the whole model: each holds a shard, and the ranks holding the same shard in the
other replicas of the mesh's replicate dimension are its **twins** (bitwise equal after every step:
they apply the same all-reduced gradients to the same shard). After a peer's death:

1. a collective of the generation fails, or its abort releases it (the mesh's works are
   :class:`~.mesh.AbortableWork`), and FSDP2's hooks raise it out of ``forward`` or ``backward``;
2. :meth:`TwinHealing.reset` puts the interrupted step back: FSDP2's ``reset_iter_state`` (the
   works left in flight are let go), gradients dropped, the RNG as it was at the step's start;
3. the trainer forms the next generation, and :meth:`TwinHealing.connect` moves every group of the
   mesh to it (the model, its DTensors and Adam's state keep the same group objects);
4. :meth:`TwinHealing.sync` agrees on the step every shard holds (``agreement.agree_sharded``)
   and each shard's source sends its shard (``mesh.local_state``: local parameter shards, Adam's
   state, hyper-parameters, step-start RNG, buffers, ``extra``) to the ranks of that shard that
   lack it, point to point; no other rank takes part.

A shard that no rank holds any more (pure FSDP, or both twins lost) raises
:class:`~.agreement.NoTwin`: the rank exits and recoverd falls back to its next strategy (the job's
checkpoint). docs/adr/0047.
"""

from __future__ import annotations

import io
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from taskd_client.pytorch.agreement import Holding, Kind, NoTwin, ShardedAgreement, agree_sharded
from taskd_client.pytorch.group import GroupFailed, ResilientGroup
from taskd_client.pytorch.mesh import WorldGroup, load_local_state, local_state
from taskd_client.pytorch.ramcopies import KEPT, RamCopies, holder_of, plan_restore

__all__ = ["TwinHealing", "shard_of_ranks"]

log = logging.getLogger(__name__)


def shard_of_ranks(mesh: Any, replicate_dim: str) -> list[int]:
    """The shard each global rank holds: its coordinates on the mesh's other dimensions (ranks
    that differ only on ``replicate_dim`` hold the same shard). A mesh with no ``replicate_dim``
    (pure FSDP) has one shard per rank: no twins."""
    names = tuple(mesh.mesh_dim_names or ())
    if replicate_dim not in names:
        return [int(r) for r in mesh.mesh.flatten().argsort().tolist()]  # no twins: a shard per rank
    ranks = mesh.mesh.movedim(names.index(replicate_dim), 0)
    columns = ranks.reshape(ranks.shape[0], -1)
    shard_of = [0] * int(ranks.numel())
    for shard in range(columns.shape[1]):
        for rank in columns[:, shard].tolist():
            shard_of[int(rank)] = shard
    return shard_of


def _to_bytes(state: dict[str, Any]) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


class TwinHealing:
    """See the module docstring. ``extra``: objects with state_dict()/load_state_dict() whose state
    travels with the shard (an LR scheduler)."""

    def __init__(
        self,
        mesh: Any,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        group: ResilientGroup,
        *,
        replicate_dim: str = "replicate",
        extra: dict[str, Any] | None = None,
        ram_copy_every: int = 0,
        keep_previous_step: bool = True,
        emit: Callable[[str], None] = lambda text: log.info("%s", text),
    ) -> None:
        world = dist.group.WORLD if dist.is_initialized() else None
        if not isinstance(world, WorldGroup):
            raise ValueError("mesh=: build the mesh with taskd_client.pytorch.mesh.resilient_mesh (stable groups)")
        if group.device.type != "cpu":
            raise ValueError("mesh=: sharded models are healed over gloo on the CPU only, for now (docs/pytorch.md)")
        self.world = world
        self.model = model
        self.optimizer = optimizer
        self.group = group
        self.extra = extra or {}
        #: shard_of[r]: the shard rank r holds (its twins hold the same).
        self.shard_of = shard_of_ranks(mesh, replicate_dim)
        if len(self.shard_of) != group.world_size:
            raise ValueError(f"the mesh has {len(self.shard_of)} ranks; the job has {group.world_size}")
        self._step_rng = torch.get_rng_state()
        self.keep_previous_step = keep_previous_step
        self._emit = emit
        #: (step, this rank's state at that step's start), kept by :meth:`before_update`: a rank a
        #: step ahead of another shard's survivors goes back to it (agree_sharded).
        self._previous: tuple[int, dict[str, Any]] | None = None
        #: Set while the optimizer applies a step: interrupted then (a tensor-parallel optimizer's
        #: collectives), the shard is half updated and is put back from ``_previous``.
        self._updating = False
        #: Host-RAM copies of a peer's shard (``ram_copy_every`` steps; ramcopies.py); None: none.
        self.copies = (
            RamCopies(
                ram_copy_every,
                group.rank,
                group.world_size,
                int(os.environ.get("LOCAL_WORLD_SIZE") or group.world_size),
            )
            if ram_copy_every
            else None
        )
        world.watch(group.settle)

    # ------------------------------------------------------------------ each step
    def step_started(self, step: int) -> None:
        """Remember the RNG as the step starts: a step run again draws the same numbers. Every
        ``ram_copy_every`` steps, keep a copy of this rank's shard and send one to its holder."""
        self._step_rng = torch.get_rng_state()
        if self.copies is not None and self.copies.due(step):
            number = self.group.generation
            started = time.monotonic()
            blob = _to_bytes(self._state())
            serialised_s = time.monotonic() - started
            last = self.copies.last
            self.copies.take(step, blob, lambda: self.group.aborted(number))
            waited_s = time.monotonic() - started - serialised_s
            exchanged = f"; step {last[0]}'s exchanged in {1000 * last[1]:.1f} ms (beside training)" if last else ""
            self._emit(
                f"rank {self.group.rank}: RAM copy of step {step}: {blob.numel()} bytes serialised in"
                f" {1000 * serialised_s:.1f} ms, {1000 * waited_s:.1f} ms waiting for the previous exchange{exchanged}"
            )

    def before_update(self, step: int, buffers: dict[str, torch.Tensor]) -> None:
        """Before the optimizer applies step ``step``: keep this rank's state as the step began
        (parameters and optimizer state as now, the step-start RNG and ``buffers``), one copy of
        the shard in RAM. The step's collectives are over here, but not necessarily every peer's:
        a rank may apply a step that another shard's survivors never complete."""
        self._updating = True
        if not self.keep_previous_step:
            return
        shard = local_state(self.model, self.optimizer)
        shard["rng"] = self._step_rng
        extra = {name: obj.state_dict() for name, obj in self.extra.items()}
        self._previous = (step, {"shard": shard, "buffers": buffers, "extra": extra})

    def after_update(self) -> None:
        self._updating = False

    def holds_previous(self, step: int) -> bool:
        """Whether this rank, having completed ``step`` steps, can go back one."""
        return self._previous is not None and self._previous[0] == step - 1

    @staticmethod
    def interrupted(error: BaseException, group: ResilientGroup) -> bool:
        """Whether ``error`` (out of forward, backward or the optimizer) is the generation failing:
        a GroupFailed, or anything raised after this rank left its generation (autograd may wrap
        what a hook raised)."""
        return isinstance(error, GroupFailed) or group.generation < 0

    def reset(self) -> None:
        """Put the interrupted step back before the next generation: FSDP2 forgets the iteration
        (its in-flight works of the failed generation are let go), gradients are dropped (a
        reduce-scatter may have written some), and the RNG is the step's start."""
        from torch.distributed.fsdp import FSDPModule

        self.group.dropping_stale_works = True
        try:
            if isinstance(self.model, FSDPModule):
                self.model.reset_iter_state()
        finally:
            self.group.dropping_stale_works = False
        self.optimizer.zero_grad(set_to_none=True)
        if self._updating:
            self._updating = False
            if self._previous is None:
                raise RuntimeError(
                    "a step was interrupted while the optimizer applied it and keep_previous_step=False:"
                    " this rank's shard is half updated"
                )
            self._load(self._previous[1])  # as the step began: its update is redone
        torch.set_rng_state(self._step_rng)

    # ------------------------------------------------------------------ each generation
    def connect(self, number: int) -> None:
        """Move every group of the mesh to generation ``number`` (formed by the trainer: the world's
        group is its own). The sub-groups connect on a helper thread, left behind if the generation
        is aborted meanwhile; the groups they leave are parked, never destroyed."""

        def make(prefix: str, rank: int, size: int) -> Any:
            return self.group.connect_group(number, prefix, rank, size)

        def connect_all() -> tuple[Any, Any]:
            groups = self.world.connect(number, make, world=self.group.process_group)
            copies = None
            if self.copies is not None:
                copies = make(f"g{number}/copies", self.group.rank, self.group.world_size)
            return groups, copies

        connected, copy_group = self.group.run_abortable("mesh-connect", connect_all)
        for left in self.world.install(connected):
            if left is not connected.world:
                self.group.park(left)
        if self.copies is not None:
            if self.copies.group is not None:
                self.group.park(self.copies.group)
            self.copies.connect(copy_group)

    def sync(self, everyone: Sequence[Holding], rank: int, emit: Callable[[str], None]) -> tuple[int, str]:
        """Agree on the step (:func:`agree_sharded`) and heal the ranks that need it from their
        shard's source. Returns the agreed step and what this rank resumes with."""
        try:
            agreed = agree_sharded(everyone, self.shard_of)
        except NoTwin as lost:
            if self.copies is None:
                raise  # the caller's rank exits: recoverd falls back to the checkpoint
            return self._restore_copies(everyone, rank, emit, lost.reason)
        shard = self.shard_of[rank]
        source, receivers = agreed.sources[shard], agreed.receivers[shard]
        mine = everyone[rank]
        if rank in agreed.back:
            assert self._previous is not None and self._previous[0] == agreed.step
            self._load(self._previous[1])
            emit(f"rank {rank}: back from step {mine.step} to {agreed.step} (its state as that step began)")
        elif mine.kind == max(h.kind for h in everyone) != Kind.NONE and mine.step > agreed.step:
            emit(f"rank {rank}: back from step {mine.step} to {agreed.step}")
        self._previous = None
        if rank == source and receivers:
            self.group.share(_to_bytes(self._state()), source, receivers)
        elif rank in receivers:
            received = self.group.share(None, source, receivers)
            assert received is not None
            self._load(torch.load(io.BytesIO(received.numpy().tobytes()), weights_only=False))
        return agreed.step, self._resumed_with(agreed, rank)

    def _restore_copies(
        self, everyone: Sequence[Holding], rank: int, emit: Callable[[str], None], why: str
    ) -> tuple[int, str]:
        """No twin holds a lost shard: every rank goes back to the last copy step all can restore
        (ramcopies.plan_restore, from every rank's copies said in an all-gather), the survivors from
        their own copy and each replacement from its holder's. NoTwin where there is none."""
        assert self.copies is not None
        own, held = self.copies.steps()
        mine = torch.tensor([*_padded(own), *_padded(held)], dtype=torch.int64)
        said = [t.tolist() for t in self.group.allgather(mine)]
        lost = [r for r, h in enumerate(everyone) if h.kind == Kind.NONE]
        world, per_node = self.group.world_size, self.copies.per_node
        plan = plan_restore(
            [s[:KEPT] for s in said], [s[KEPT:] for s in said], lost, lambda r: holder_of(r, world, per_node)
        )
        step = plan.step
        self._previous = None
        if rank in plan.senders:
            holder = plan.senders[rank]
            blob = self.group.share(None, holder, [rank])
            assert blob is not None
            self.copies.restored(step, blob)
            self._load(torch.load(io.BytesIO(blob.numpy().tobytes()), weights_only=False))
            return step, f"its shard as of step {step} from rank {holder}'s RAM copy"
        for lost_rank, holder in plan.senders.items():
            if holder == rank:
                self.group.share(self.copies.held[step], rank, [lost_rank])
        self._load(torch.load(io.BytesIO(self.copies.own[step].numpy().tobytes()), weights_only=False))
        self.copies.restored(step, None)
        emit(f"rank {rank}: back from step {everyone[rank].step} to step {step}, the last RAM copy ({why})")
        return step, f"its own RAM copy of step {step}"

    def _resumed_with(self, agreed: ShardedAgreement, rank: int) -> str:
        shard = self.shard_of[rank]
        source, receivers = agreed.sources[shard], agreed.receivers[shard]
        if rank in receivers:
            return f"the shard of rank {source} (its twin)"
        if rank == source and receivers:
            return f"its own shard {shard} (sent to rank {', '.join(map(str, receivers))})"
        return f"its own shard {shard}"

    def _state(self) -> dict[str, Any]:
        return {
            "shard": local_state(self.model, self.optimizer),
            "buffers": {name: b.detach().clone() for name, b in self.model.named_buffers()},
            "extra": {name: obj.state_dict() for name, obj in self.extra.items()},
        }

    def _load(self, state: dict[str, Any]) -> None:
        load_local_state(self.model, self.optimizer, state["shard"])
        with torch.no_grad():
            for name, buffer in self.model.named_buffers():
                if name in state["buffers"]:
                    buffer.copy_(state["buffers"][name])
        for name, obj in self.extra.items():
            if name in state["extra"]:
                obj.load_state_dict(state["extra"][name])


def _padded(steps: list[int]) -> list[int]:
    """``KEPT`` steps, -1 where fewer are kept (a fixed-size row of the all-gather)."""
    return (steps[-KEPT:] + [-1] * KEPT)[:KEPT]
