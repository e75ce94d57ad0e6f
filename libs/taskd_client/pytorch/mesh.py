"""Stable process groups for a ``DeviceMesh``: sharded models (FSDP2, HSDP) keep their groups
across generations (issue 26, docs/adr/0047).

FSDP2 and DTensor hold on to the mesh's process groups: every parameter's ``DTensor`` spec, each
``FSDPParam``'s mesh info, and Adam's state (DTensors too). After a peer dies, ``ResilientTrainer``
forms a new generation of gloo groups (group.py); re-wrapping the model on a new mesh would mean new
parameters and new optimizer state. Instead the mesh is built over groups that never change:

* :class:`StableGroup` is a Python ``ProcessGroup`` whose rank, size and name are fixed for the job.
  Every collective is forwarded to ``inner``, the current generation's real group, which
  :meth:`WorldGroup.rebind` replaces. FSDP2 calls its collectives through Python
  (``dist.all_gather_single``, ``reduce_scatter_single``, ``all_reduce``), so they reach it.
* :class:`WorldGroup` is the default group, installed by :func:`resilient_mesh` as the creator of the
  ``"recoverd"`` backend. torch 2.13 keeps a creator's ``ProcessGroup`` subclass as the group itself,
  and hands ``new_group`` (which ``init_device_mesh`` calls per sub-group) to a default group that
  implements it: so the mesh's row and column groups are :class:`StableGroup` too.

This module is the first slice: groups that can be rebound under a live FSDP2 model, bitwise the
same training as plain gloo (tests/integration/test_mesh_groups.py). Healing a replacement rank from
its twin is the next one; the design is in docs/adr/0047.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "BACKEND",
    "AbortableWork",
    "Connected",
    "GroupFactory",
    "NotConnected",
    "StableGroup",
    "WorldGroup",
    "gloo_group",
    "load_local_state",
    "local_state",
    "resilient_mesh",
]

#: The backend name under which :class:`WorldGroup` is registered with torch.distributed.
BACKEND = "recoverd"

#: Makes the real group of one generation: (store prefix, group rank, group size) -> group.
GroupFactory = Callable[[str, int, int], dist.ProcessGroup]


def gloo_group(store: dist.Store, timeout: timedelta = timedelta(seconds=30)) -> GroupFactory:
    """A factory of gloo groups on ``store`` (each under its own prefix)."""

    def make(prefix: str, rank: int, size: int) -> dist.ProcessGroup:
        prefixed = dist.PrefixStore(prefix, store)
        group = dist.ProcessGroup(prefixed, rank, size)
        backend = dist.ProcessGroupGloo(prefixed, rank, size, timeout)
        group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
        group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        return group

    return make


#: Waits for a work of one generation (ResilientGroup.settle): (work, what, generation) -> None,
#: raising GroupFailed when the generation fails or is aborted meanwhile.
Settle = Callable[[Any, str, int], None]


class AbortableWork(dist.Work):
    """A work of a stable group: its ``wait`` returns when the collective completes, and raises
    ``GroupFailed`` as soon as its generation is aborted (a peer died: gloo alone would block until
    its timeout). FSDP2 waits on these from Python, in its hooks."""

    def __init__(self, work: Any, what: str, generation: int, settle: Settle) -> None:
        super().__init__()
        self.work = work
        self.what = what
        self.generation = generation
        self._settle = settle

    def wait(self, timeout: Any = None) -> bool:
        self._settle(self.work, self.what, self.generation)
        return True

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())

    def get_future(self) -> Any:
        return self.work.get_future()


class NotConnected(RuntimeError):
    """A collective on a mesh whose groups the trainer has not connected yet."""


class StableGroup(dist.ProcessGroup):
    """A process group that stays the same object for the whole job; its work goes to ``inner``
    (None until the first generation is connected), the group of generation :attr:`generation`."""

    def __init__(self, rank: int, size: int, inner: dist.ProcessGroup | None) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the Python subclass's constructor
        self.inner = inner
        self.generation = 0
        #: Set by the trainer (ResilientGroup.settle): works become abortable. None: plain works.
        self.settle: Settle | None = None
        self._name = ""
        self._desc = ""

    # Names: torch keeps a Python group's name through these (the C++ base would not see it).
    def getBackendName(self) -> str:
        return BACKEND

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupName(self) -> str:
        return self._name

    def setGroupDesc(self, desc: str) -> None:
        self._desc = desc

    def getGroupDesc(self) -> str:
        return self._desc

    def _bound(self) -> dist.ProcessGroup:
        if self.inner is None:
            raise NotConnected(
                f"process group {self._name or 'WORLD'} is not connected yet: ResilientTrainer(mesh=...) connects"
                " the mesh's groups (and reconnects them after every recovery)"
            )
        return self.inner

    def _track(self, work: Any, what: str) -> Any:
        return work if self.settle is None else AbortableWork(work, what, self.generation, self.settle)

    # Collectives: forwarded to this generation's group. The signatures are the C++ virtuals' that
    # torch's trampoline calls, not the Python overloads torch's stubs describe (hence the ignores).
    def allreduce(self, tensors: Any, opts: Any) -> Any:  # type: ignore[override]
        return self._track(self._bound().allreduce(tensors, opts), "allreduce")

    def allreduce_coalesced(self, tensors: Any, opts: Any) -> Any:  # type: ignore[override]
        return self._track(self._bound().allreduce_coalesced(tensors, opts), "allreduce_coalesced")

    def allgather(self, outputs: Any, inputs: Any, opts: Any) -> Any:  # type: ignore[override]
        return self._track(self._bound().allgather(outputs, inputs, opts), "allgather")

    def all_gather_single(self, output: Any, input: Any, opts: Any) -> Any:  # type: ignore[override]
        return self._track(self._bound().all_gather_single(output, input, opts), "all_gather")

    def _allgather_base(self, output: Any, input: Any, opts: Any) -> Any:  # type: ignore[override]
        return self._track(self._bound()._allgather_base(output, input, opts), "all_gather")

    def reduce_scatter_single(self, output: Any, input: Any, opts: Any) -> Any:
        return self._track(self._bound().reduce_scatter_single(output, input, opts), "reduce_scatter")

    def _reduce_scatter_base(self, output: Any, input: Any, opts: Any) -> Any:
        return self._track(self._bound()._reduce_scatter_base(output, input, opts), "reduce_scatter")

    def broadcast(self, tensors: Any, opts: Any) -> Any:  # type: ignore[override]
        return self._track(self._bound().broadcast(tensors, opts), "broadcast")

    def barrier(self, opts: Any) -> Any:  # type: ignore[override]
        return self._track(self._bound().barrier(opts), "barrier")

    # The rest of torch.distributed (docs/notes/tp-findings.md). torch's trampoline forwards C++
    # callers (the functional collectives DTensor uses: tensor and sequence parallelism,
    # full_tensor, clip_grad_norm_) to allreduce, allgather, broadcast, barrier and these first
    # four; the others are reached from torch.distributed's Python functions only (tensor
    # parallelism's scatter, torch.distributed.checkpoint's gather and scatter of objects). Any
    # other virtual runs the C++ base, which fails loudly: a Python group has no C++ backend.
    def all_gather_single_coalesced(self, outputs: Any, inputs: Any, opts: Any) -> Any:  # type: ignore[override]
        return self._track(self._bound().all_gather_single_coalesced(outputs, inputs, opts), "all_gather")

    def reduce_scatter_single_coalesced(self, outputs: Any, inputs: Any, opts: Any) -> Any:  # type: ignore[override]
        return self._track(self._bound().reduce_scatter_single_coalesced(outputs, inputs, opts), "reduce_scatter")

    def reduce_scatter(self, outputs: Any, inputs: Any, opts: Any) -> Any:  # type: ignore[override]
        return self._track(self._bound().reduce_scatter(outputs, inputs, opts), "reduce_scatter")

    def all_to_all_single(self, output: Any, input: Any, output_splits: Any, input_splits: Any, opts: Any) -> Any:  # type: ignore[override]
        return self._track(
            self._bound().all_to_all_single(output, input, output_splits, input_splits, opts), "all_to_all"
        )

    def allgather_coalesced(self, outputs: Any, inputs: Any, opts: Any) -> Any:  # type: ignore[override]
        return self._track(self._bound().allgather_coalesced(outputs, inputs, opts), "allgather")

    def gather(self, outputs: Any, inputs: Any, opts: Any) -> Any:  # type: ignore[override]
        return self._track(self._bound().gather(outputs, inputs, opts), "gather")

    def scatter(self, outputs: Any, inputs: Any, opts: Any) -> Any:  # type: ignore[override]
        return self._track(self._bound().scatter(outputs, inputs, opts), "scatter")

    def reduce(self, tensors: Any, opts: Any) -> Any:  # type: ignore[override]
        return self._track(self._bound().reduce(tensors, opts), "reduce")

    def alltoall(self, outputs: Any, inputs: Any, opts: Any) -> Any:  # type: ignore[override]
        return self._track(self._bound().alltoall(outputs, inputs, opts), "all_to_all")

    # Point to point: plain works (gloo's cannot be waited for in slices, docs/adr/0038).
    def send(self, tensors: Any, dst: int, tag: int) -> Any:
        return self._bound().send(tensors, dst, tag)

    def recv(self, tensors: Any, src: int, tag: int) -> Any:
        return self._bound().recv(tensors, src, tag)

    def recv_anysource(self, tensors: Any, tag: int) -> Any:
        return self._bound().recv_anysource(tensors, tag)


@dataclass(frozen=True, slots=True)
class Connected:
    """One generation's real groups for a mesh: the world's and each sub-group's, by name."""

    generation: int
    world: dist.ProcessGroup
    subgroups: dict[str, dist.ProcessGroup]


class WorldGroup(StableGroup):
    """The default group: the world, and the maker of the mesh's sub-groups (``new_group``).

    Made unconnected (no network: a script builds its mesh, model and optimizer before the trainer
    joins the job), unless a ``factory`` connects each group at once (tests without an agent)."""

    def __init__(self, rank: int, size: int, factory: GroupFactory | None = None) -> None:
        self.factory = factory
        super().__init__(rank, size, factory(_prefix(0, "world"), rank, size) if factory else None)
        #: The sub-groups this rank belongs to, by name.
        self.subgroups: dict[str, StableGroup] = {}

    def new_group(
        self,
        ranks: Sequence[int],
        timeout: Any = None,
        pg_options: Any = None,
        group_name: str | None = None,
        group_desc: str | None = None,
    ) -> StableGroup | None:
        """A stable sub-group of ``ranks`` (None where this rank is not one of them)."""
        members = tuple(ranks)
        if self.rank() not in members:
            return None
        name = group_name or "-".join(map(str, members))
        rank = members.index(self.rank())
        inner = self.factory(_prefix(self.generation, name), rank, len(members)) if self.factory else None
        group = StableGroup(rank, len(members), inner)
        group.generation, group.settle = self.generation, self.settle
        group._set_group_name(name)  # type: ignore[arg-type]  # a GroupName is a str
        if group_desc:
            group._set_group_desc(group_desc)
        self.subgroups[name] = group
        return group

    def stable_groups(self) -> list[StableGroup]:
        """The world, then every sub-group by name (one order on every rank)."""
        return [self, *(group for _, group in sorted(self.subgroups.items()))]

    def connect(self, generation: int, factory: GroupFactory, world: dist.ProcessGroup | None = None) -> Connected:
        """Make ``generation``'s real groups (the world's may be given: the trainer's generation
        group), in one order on every rank, so that their connections never wait on each other.
        Changes nothing here: :meth:`install` does (a connect left behind by an abort must not
        install its groups later)."""
        made = world if world is not None else factory(_prefix(generation, "world"), self.rank(), self.size())
        return Connected(
            generation,
            made,
            {
                name: factory(_prefix(generation, name), group.rank(), group.size())
                for name, group in sorted(self.subgroups.items())
            },
        )

    def install(self, connected: Connected) -> list[dist.ProcessGroup]:
        """Move the world and every sub-group to ``connected``'s groups; returns the groups they
        leave (kept alive by the caller: a gloo thread may still be blocked in one)."""
        left: list[dist.ProcessGroup] = []
        for group in self.stable_groups():
            inner = connected.world if group is self else connected.subgroups[group.getGroupName()]
            if group.inner is not None and group.inner is not inner:
                left.append(group.inner)
            group.inner, group.generation = inner, connected.generation
        return left

    def rebind(self, generation: int) -> None:
        """Connect and install ``generation``'s groups with this group's own factory."""
        if self.factory is None:
            raise NotConnected("rebind needs a factory; ResilientTrainer(mesh=...) connects the groups itself")
        self.install(self.connect(generation, self.factory))

    def watch(self, settle: Settle | None) -> None:
        """Make every group's works abortable through ``settle`` (None: plain works)."""
        for group in self.stable_groups():
            group.settle = settle


def _prefix(generation: int, name: str) -> str:
    """Where a group's keys live: the world's under ``g<n>/world``, a sub-group's under ``g<n>/sub/``
    (torch names them by a counter: kept apart from the generation's own keys)."""
    return f"g{generation}/world" if name == "world" else f"g{generation}/sub/{name}"


def resilient_mesh(
    shape: tuple[int, ...],
    names: tuple[str, ...],
    *,
    store: dist.Store | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    factory: GroupFactory | None = None,
) -> tuple[Any, WorldGroup]:
    """``init_device_mesh("cpu", shape)`` over stable groups; returns the mesh and the world group.
    Once per process, as ``init_process_group`` is.

    Under recoverd, call it with the shape and names only: no network yet (rank and world size
    come from the environment), and ``ResilientTrainer(model, optimizer, mesh=mesh)`` connects
    the groups, and reconnects them on every recovery. With a ``store`` (or ``factory``) the groups
    are gloo groups on it at once, and :meth:`WorldGroup.rebind` moves them (tests, no agent)."""
    from torch.distributed.device_mesh import init_device_mesh

    rank = int(os.environ["RANK"]) if rank is None else rank
    world_size = int(os.environ["WORLD_SIZE"]) if world_size is None else world_size
    make = factory or (gloo_group(store) if store is not None else None)

    def create(opts: Any, backend_options: Any = None) -> WorldGroup:
        return WorldGroup(opts.group_rank, opts.group_size, make)

    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, create, extended_api=True, devices=["cpu"])
    dist.init_process_group(BACKEND, store=store or dist.HashStore(), rank=rank, world_size=world_size)
    world = dist.group.WORLD
    if not isinstance(world, WorldGroup):
        raise RuntimeError(f"the default process group is a {type(world).__name__}, not recoverd's stable one")
    return init_device_mesh("cpu", shape, mesh_dim_names=names), world


def local_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's shard of the training state, as plain tensors: each parameter's local shard,
    its optimizer state (DTensors as their local shards, marked), the optimizer's hyper-parameters
    and the CPU RNG state. What a
    twin sends a replacement (its twin holds the same shard: docs/adr/0047)."""
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    return {
        "params": [_local(p).detach().clone() for p in params],
        "optim": [
            {key: (isinstance(value, DTensor), _local(value).clone()) for key, value in optimizer.state[p].items()}
            for p in params
        ],
        # Hyper-parameters a scheduler may have changed (the learning rate).
        "groups": [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups],
        "rng": torch.get_rng_state(),
    }


def load_local_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Make this rank's shard the one ``state`` holds (:func:`local_state` of its twin): the
    parameters' local shards are written in place (FSDP2 keeps their storage), the optimizer state
    is rebuilt on each parameter's mesh and placements, and the RNG state is restored."""
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    if len(state["params"]) != len(params):
        raise ValueError(f"the state has {len(state['params'])} parameters; this model has {len(params)}")
    with torch.no_grad():
        for param, value in zip(params, state["params"], strict=True):
            _local(param).copy_(value)
    for param, saved in zip(params, state["optim"], strict=True):
        spec: Any = param  # an FSDP2 or a TP parameter is a DTensor: its mesh and placements
        optimizer.state[param] = {
            key: DTensor.from_local(
                value, spec.device_mesh, spec.placements, run_check=False, shape=param.shape, stride=param.stride()
            )
            if was_dtensor
            else value
            for key, (was_dtensor, value) in saved.items()
        }
    for group, saved_group in zip(optimizer.param_groups, state.get("groups", ()), strict=False):
        group.update(saved_group)
    torch.set_rng_state(state["rng"])


def _local(tensor: Any) -> torch.Tensor:
    """A DTensor's local shard (the same storage), or the tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor  # type: ignore[no-any-return]
