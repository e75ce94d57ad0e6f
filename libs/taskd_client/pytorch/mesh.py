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

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "BACKEND",
    "GroupFactory",
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


class StableGroup(dist.ProcessGroup):
    """A process group that stays the same object for the whole job; its work goes to ``inner``."""

    def __init__(self, rank: int, size: int, inner: dist.ProcessGroup) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the Python subclass's constructor
        self.inner = inner
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

    # Collectives: forwarded to this generation's group. The signatures are the C++ virtuals' that
    # torch's trampoline calls, not the Python overloads torch's stubs describe (hence the ignores).
    def allreduce(self, tensors: Any, opts: Any) -> Any:  # type: ignore[override]
        return self.inner.allreduce(tensors, opts)

    def allreduce_coalesced(self, tensors: Any, opts: Any) -> Any:  # type: ignore[override]
        return self.inner.allreduce_coalesced(tensors, opts)

    def allgather(self, outputs: Any, inputs: Any, opts: Any) -> Any:  # type: ignore[override]
        return self.inner.allgather(outputs, inputs, opts)

    def all_gather_single(self, output: Any, input: Any, opts: Any) -> Any:  # type: ignore[override]
        return self.inner.all_gather_single(output, input, opts)

    def _allgather_base(self, output: Any, input: Any, opts: Any) -> Any:  # type: ignore[override]
        return self.inner._allgather_base(output, input, opts)

    def reduce_scatter_single(self, output: Any, input: Any, opts: Any) -> Any:
        return self.inner.reduce_scatter_single(output, input, opts)

    def _reduce_scatter_base(self, output: Any, input: Any, opts: Any) -> Any:
        return self.inner._reduce_scatter_base(output, input, opts)

    def broadcast(self, tensors: Any, opts: Any) -> Any:  # type: ignore[override]
        return self.inner.broadcast(tensors, opts)

    def barrier(self, opts: Any) -> Any:  # type: ignore[override]
        return self.inner.barrier(opts)

    def send(self, tensors: Any, dst: int, tag: int) -> Any:
        return self.inner.send(tensors, dst, tag)

    def recv(self, tensors: Any, src: int, tag: int) -> Any:
        return self.inner.recv(tensors, src, tag)

    # The rest of torch.distributed (docs/notes/tp-findings.md): tensor parallel scatters and
    # broadcasts its parameters in parallelize_module, full_tensor and sequence parallelism use the
    # functional collectives' coalesced all-gather and reduce-scatter. torch's trampoline forwards
    # C++ callers to the first four here as well; the others are reached from torch.distributed's
    # Python functions only (which call the group's method by name): their C++ base looks for the
    # group's own C++ backend, which a Python group has none of ("No backend type associated with
    # device type cpu").
    def all_gather_single_coalesced(self, outputs: Any, inputs: Any, opts: Any) -> Any:  # type: ignore[override]
        return self.inner.all_gather_single_coalesced(outputs, inputs, opts)

    def reduce_scatter_single_coalesced(self, outputs: Any, inputs: Any, opts: Any) -> Any:  # type: ignore[override]
        return self.inner.reduce_scatter_single_coalesced(outputs, inputs, opts)

    def reduce_scatter(self, outputs: Any, inputs: Any, opts: Any) -> Any:  # type: ignore[override]
        return self.inner.reduce_scatter(outputs, inputs, opts)

    def all_to_all_single(self, output: Any, input: Any, output_splits: Any, input_splits: Any, opts: Any) -> Any:  # type: ignore[override]
        return self.inner.all_to_all_single(output, input, output_splits, input_splits, opts)

    def allgather_coalesced(self, outputs: Any, inputs: Any, opts: Any) -> Any:  # type: ignore[override]
        return self.inner.allgather_coalesced(outputs, inputs, opts)

    def reduce(self, tensors: Any, opts: Any) -> Any:  # type: ignore[override]
        return self.inner.reduce(tensors, opts)

    def gather(self, outputs: Any, inputs: Any, opts: Any) -> Any:  # type: ignore[override]
        return self.inner.gather(outputs, inputs, opts)

    def scatter(self, outputs: Any, inputs: Any, opts: Any) -> Any:  # type: ignore[override]
        return self.inner.scatter(outputs, inputs, opts)

    def alltoall(self, outputs: Any, inputs: Any, opts: Any) -> Any:  # type: ignore[override]
        return self.inner.alltoall(outputs, inputs, opts)

    def recv_anysource(self, tensors: Any, tag: int) -> Any:
        return self.inner.recv_anysource(tensors, tag)


class WorldGroup(StableGroup):
    """The default group: the world, and the maker of the mesh's sub-groups (``new_group``)."""

    def __init__(self, rank: int, size: int, factory: GroupFactory) -> None:
        self.factory = factory
        self.generation = 0
        super().__init__(rank, size, factory(self._prefix("world"), rank, size))
        #: The sub-groups this rank belongs to, by name.
        self.subgroups: dict[str, StableGroup] = {}

    def _prefix(self, name: str) -> str:
        return f"g{self.generation}/{name}"

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
        group = StableGroup(rank, len(members), self.factory(self._prefix(name), rank, len(members)))
        group._set_group_name(name)  # type: ignore[arg-type]  # a GroupName is a str
        if group_desc:
            group._set_group_desc(group_desc)
        self.subgroups[name] = group
        return group

    def rebind(self, generation: int) -> None:
        """Move the world and every sub-group to ``generation``'s real groups (made in one order
        on every rank, so their connections never wait on each other)."""
        self.generation = generation
        self.inner = self.factory(self._prefix("world"), self.rank(), self.size())
        for name, group in sorted(self.subgroups.items()):
            group.inner = self.factory(self._prefix(name), group.rank(), group.size())


def resilient_mesh(
    shape: tuple[int, ...],
    names: tuple[str, ...],
    *,
    store: dist.Store,
    rank: int,
    world_size: int,
    factory: GroupFactory | None = None,
) -> tuple[Any, WorldGroup]:
    """``init_device_mesh("cpu", shape)`` over stable groups; returns the mesh and the world group
    (whose :meth:`WorldGroup.rebind` moves every group of the mesh to a new generation). Once per
    process, as ``init_process_group`` is."""
    from torch.distributed.device_mesh import init_device_mesh

    make = factory or gloo_group(store)

    def create(opts: Any, backend_options: Any = None) -> WorldGroup:
        return WorldGroup(opts.group_rank, opts.group_size, make)

    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, create, extended_api=True, devices=["cpu"])
    dist.init_process_group(BACKEND, store=store, rank=rank, world_size=world_size)
    world = dist.group.WORLD
    if not isinstance(world, WorldGroup):
        raise RuntimeError(f"the default process group is a {type(world).__name__}, not recoverd's stable one")
    return init_device_mesh("cpu", shape, mesh_dim_names=names), world


def local_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's shard of the training state, as plain tensors: each parameter's local shard,
    its optimizer state (DTensors as their local shards, marked), and the CPU RNG state. What a
    twin sends a replacement (its twin holds the same shard: docs/adr/0047)."""
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    return {
        "params": [_local(p).detach().clone() for p in params],
        "optim": [
            {key: (isinstance(value, DTensor), _local(value).clone()) for key, value in optimizer.state[p].items()}
            for p in params
        ],
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
    torch.set_rng_state(state["rng"])


def _local(tensor: Any) -> torch.Tensor:
    """A DTensor's local shard (the same storage), or the tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor  # type: ignore[no-any-return]
