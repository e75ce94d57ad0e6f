"""Tensor parallel (DTensor ``parallelize_module``) with a data-parallel replica dimension, over gloo
on the CPU: issue 26, item 3.

Run by 4 processes with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (tests/integration/
test_tp_groups.py starts them). The mesh is 2 x 2, ("dp", "tp") = [[0, 1], [2, 3]]. Ranks 0 and 1
are one replica: each holds half of every layer of two MLP blocks (a column-wise then a row-wise
parallel linear; ``--sequence-parallel`` adds sequence parallel norms). Ranks 2 and 3 are the other
replica. Twins (ranks r and r + 2) hold the same TP shard. Every step averages each local gradient
over the dp group, so both replicas take the same Adam step bit for bit. ``--dp allreduce`` does it
with one flat all-reduce, as DDP's bucket does; ``--dp replicate`` uses FSDP2's ``replicate()`` on
the dp dimension, which gives the same bits. Every step also clips the gradient norm
(``clip_grad_norm_`` over DTensor gradients: a TP all-reduce of the norm). The end gathers the
full parameters (``DTensor.full_tensor``: a TP all-gather).

``--groups plain``: torch's own gloo groups. ``--groups stable``: recoverd's stable groups
(taskd_client.pytorch.mesh). ``--rebind-at S`` moves them to a new generation of gloo groups before
step S, under the live model and optimizer. ``--heal-at S``: rank ``--heal-rank`` loses its TP
shard, Adam's state and its RNG before step S and takes its twin's, point to point. Each rank prints
the hash of its local shards (parameters and Adam's state) and of the full parameters at the end:
every mode must give the same hashes. ``RECOVERD_TRACE=1`` (stable groups) prints each method of
the stable group that torch called, the path it came by and what asked for it
(docs/notes/tp-findings.md).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import sys
from collections import Counter
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

WORLD = 4
DIM, HIDDEN, SEQ = 16, 32, 8
TRACE: Counter[str] = Counter()


class Block(nn.Module):
    """An MLP block with a residual: the up projection is column-wise parallel, the down one
    row-wise. The second block's input needs a gradient, so its backward all-reduces over tp."""

    def __init__(self, sequence_parallel: bool) -> None:
        super().__init__()
        # A norm only with sequence parallelism, where its parameters are replicated DTensors
        # (without it they would be plain tensors among DTensors, which clip_grad_norm_ refuses).
        self.norm = nn.LayerNorm(DIM) if sequence_parallel else nn.Identity()
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))  # type: ignore[no-any-return]


def tp_plan(sequence_parallel: bool) -> dict[str, Any]:
    """ColwiseParallel then RowwiseParallel in each block; with sequence parallelism the norm
    works on this rank's part of the sequence, the up projection all-gathers it and the down
    projection reduce-scatters its output back to it."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    plan: dict[str, Any] = {}
    for block in ("0", "1"):
        if sequence_parallel:
            plan[f"{block}.norm"] = SequenceParallel()
            plan[f"{block}.up"] = ColwiseParallel(input_layouts=Shard(1))
            plan[f"{block}.down"] = RowwiseParallel(output_layouts=Shard(1))
        else:
            plan[f"{block}.up"] = ColwiseParallel()
            plan[f"{block}.down"] = RowwiseParallel()
    return plan


def local_sha256(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """The hash of this rank's shards: its parameters' local tensors and Adam's state for them."""
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.to_local().detach().numpy().tobytes())  # type: ignore[operator]
        for value in optimizer.state[param].values():
            local = value.to_local() if hasattr(value, "to_local") else value
            digest.update(local.detach().numpy().tobytes())
    return digest.hexdigest()


def full_sha256(model: nn.Module) -> str:
    """The hash of the whole model (every parameter gathered over the tp group: ``full_tensor``)."""
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.full_tensor().detach().numpy().tobytes())  # type: ignore[operator]
    return digest.hexdigest()


def average_over_replicas(model: nn.Module, dp_group: dist.ProcessGroup) -> None:
    """Average each local gradient over the dp group: one flat all-reduce (gloo has no AVG)."""
    grads = [param.grad.to_local() for param in model.parameters()]  # type: ignore[union-attr]
    flat = torch.cat([grad.reshape(-1) for grad in grads])
    dist.all_reduce(flat, group=dp_group)
    flat.div_(dist.get_world_size(dp_group))
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def heal_from_twin(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int, healed: int) -> None:
    """Rank ``healed`` forgets its shard (new parameters, no optimizer state, another RNG state:
    what a replacement starts with) and takes its twin's (the same TP shard in the other replica),
    point to point over the world group."""
    from taskd_client.pytorch.mesh import load_local_state, local_state

    twin = (healed + 2) % WORLD
    if rank == twin:
        blob = io.BytesIO()
        torch.save(local_state(model, optimizer), blob)
        data = torch.frombuffer(bytearray(blob.getvalue()), dtype=torch.uint8)
        dist.send(torch.tensor([data.numel()]), dst=healed)
        dist.send(data, dst=healed)
    elif rank == healed:
        with torch.no_grad():
            for param in model.parameters():
                param.to_local().normal_()  # type: ignore[operator]
        optimizer.state.clear()
        torch.manual_seed(12345)
        size = torch.zeros(1, dtype=torch.int64)
        dist.recv(size, src=twin)
        data = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.recv(data, src=twin)
        load_local_state(model, optimizer, torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False))
        print(f"rank {rank} healed from rank {twin}", flush=True)


def trace_stable_groups() -> None:
    """Count each call torch makes to a method of a stable group: the mesh dimension, the path (a
    Python call of torch.distributed, or C++: a ``_c10d_functional`` op calling the trampolined
    virtual), the line of this script that led to it, and the torch function that asked for it."""
    import linecache

    from taskd_client.pytorch.mesh import StableGroup

    plumbing = ("_ops.py", "distributed_c10d.py", "c10d_logger.py", "_functional_collectives.py", "autograd.py")

    def traced(name: str, method: Any) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            frame: Any = sys._getframe(1)
            path = "C++" if frame.f_code.co_filename.endswith("_ops.py") else "Python"
            asker, line = "", ""
            while frame is not None:
                filename = frame.f_code.co_filename
                if not asker and os.path.basename(filename) not in plumbing:
                    asker = f"{os.path.basename(filename)}:{frame.f_code.co_name}"
                if filename == __file__:
                    line = linecache.getline(filename, frame.f_lineno).strip()
                    break
                frame = frame.f_back
            TRACE[f"{name} [{self.getGroupDesc() or self.getGroupName()}] {path} <- {line} <- {asker}"] += 1
            return method(self, *args, **kwargs)

        return call

    for name, method in list(vars(StableGroup).items()):
        if callable(method) and not name.startswith("__") and "Group" not in name and "Backend" not in name:
            setattr(StableGroup, name, traced(name, method))


def run_recoverd(args: argparse.Namespace) -> None:
    """Under recoverd (``recoverd run --nproc-per-node 4 --strategies recover-in-place,exit -- python
    examples/tp_train.py --launcher recoverd``): the same model and steps, through
    ``ResilientTrainer(mesh=)``. A killed rank is replaced and takes its TP shard from its twin."""
    import time

    from torch.distributed.tensor.parallel import parallelize_module

    from taskd_client.pytorch import ResilientTrainer, wait_for_rank
    from taskd_client.pytorch.mesh import resilient_mesh

    wait_for_rank()
    rank = int(os.environ["RANK"])
    mesh, _ = resilient_mesh((2, 2), ("dp", "tp"))  # no network: the trainer connects the groups
    torch.manual_seed(0)
    model = nn.Sequential(Block(args.sequence_parallel), Block(args.sequence_parallel))
    # Each rank cuts its shard from its own (same-seeded) full weights: no collective before the
    # trainer has connected the groups (src_data_rank=0 would scatter rank 0's).
    parallelize_module(model, mesh["tp"], tp_plan(args.sequence_parallel), src_data_rank=None)
    tp_rank = mesh.get_local_rank("tp")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    say = lambda text: print(f"{text} (at {time.time():.6f})", flush=True)  # noqa: E731
    trainer = ResilientTrainer(model, optimizer, mesh=mesh, replicate_dim="dp", on_event=say)
    dp_group = mesh.get_group("dp")
    for step in trainer.steps(args.steps):
        with trainer.step_scope():
            optimizer.zero_grad(set_to_none=True)
            data = torch.Generator().manual_seed(1000 * step + rank // 2)
            if args.sequence_parallel:
                inputs = torch.randn(4, SEQ, DIM, generator=data).chunk(2, dim=1)[tp_rank].contiguous()
                loss = model(inputs).square().sum() / (4 * SEQ * DIM)
            else:
                loss = model(torch.randn(8, DIM, generator=data)).square().mean()
            loss.backward()
            average_over_replicas(model, dp_group)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
            time.sleep(args.step_sleep)
            if trainer.apply():
                print(f"rank {rank} step {step} done {time.time():.6f} pid {os.getpid()}", flush=True)
    print(f"rank {rank} final sha256 {local_sha256(model, optimizer)}", flush=True)
    trainer.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--launcher", choices=("test", "recoverd"), default="test", help="test: the 4-process harness; recoverd"
    )
    parser.add_argument(
        "--step-sleep", type=float, default=0.01, help="recoverd: seconds per step standing for compute"
    )
    parser.add_argument("--groups", choices=("plain", "stable"), default="stable")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rebind-at", type=int, default=-1, help="stable groups: a new generation before this step")
    parser.add_argument(
        "--heal-at",
        type=int,
        default=-1,
        help="before this step --heal-rank loses its state (as a replacement has none) and gets its twin's",
    )
    parser.add_argument("--heal-rank", type=int, default=2, help="the rank healed; its twin is (R + 2) % 4")
    parser.add_argument(
        "--dp",
        choices=("allreduce", "replicate"),
        default="allreduce",
        help="the gradient average over dp: one flat all-reduce, or FSDP2's replicate() (the same bits)",
    )
    parser.add_argument(
        "--sequence-parallel",
        action="store_true",
        help="sequence parallel norms; the TP linears all-gather and reduce-scatter along the sequence",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)  # one summation order inside each rank
    if args.launcher == "recoverd":
        run_recoverd(args)
        return
    rank = int(os.environ["RANK"])
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), WORLD, rank == 0, timeout=timedelta(seconds=60)
    )
    world = None
    if args.groups == "stable":
        from taskd_client.pytorch.mesh import resilient_mesh

        if os.environ.get("RECOVERD_TRACE"):
            trace_stable_groups()
        mesh, world = resilient_mesh((2, 2), ("dp", "tp"), store=store, rank=rank, world_size=WORLD)
    else:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = nn.Sequential(Block(args.sequence_parallel), Block(args.sequence_parallel))
    parallelize_module(model, mesh["tp"], tp_plan(args.sequence_parallel))
    tp_rank = mesh.get_local_rank("tp")
    dp_group = mesh.get_group("dp")
    if args.dp == "replicate":  # FSDP2's DDP on the dp dimension: it all-reduces in backward
        from torch.distributed._composable.replicate_with_fsdp import replicate

        replicate(model, mesh=mesh["dp"])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(args.steps):
        if world is not None and step == args.rebind_at:
            world.rebind(1)
            print(f"rank {rank} rebound to generation 1 before step {step}", flush=True)
        if step == args.heal_at:
            heal_from_twin(model, optimizer, rank, args.heal_rank)
        # Each replica (mesh row) trains on its own data; the two TP ranks of a row see the same.
        data = torch.Generator().manual_seed(1000 * step + rank // 2)
        if args.sequence_parallel:  # each TP rank takes its part of the sequence (batch, seq, dim)
            inputs = torch.randn(4, SEQ, DIM, generator=data).chunk(2, dim=1)[tp_rank].contiguous()
            loss = model(inputs).square().sum() / (4 * SEQ * DIM)  # summed over the TP ranks: the mean
        else:
            loss = model(torch.randn(8, DIM, generator=data)).square().mean()
        loss.backward()
        if args.dp == "allreduce":
            average_over_replicas(model, dp_group)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    print(f"rank {rank} final sha256 {local_sha256(model, optimizer)}", flush=True)
    print(f"rank {rank} full sha256 {full_sha256(model)}", flush=True)
    for call, count in sorted(TRACE.items()):
        print(f"rank {rank} trace {call} x{count}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
