"""HSDP (FSDP2 on a 2 x 2 replicate x shard mesh) over gloo, on the CPU: issue 26's first slice.

Run by 4 processes with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (tests/integration/
test_mesh_groups.py starts them). ``--groups plain``: torch's own gloo groups; ``--groups stable``:
recoverd's stable groups (taskd_client.pytorch.mesh), which ``--rebind-at S`` moves to a new
generation of gloo groups before step S, under the live model and optimizer; ``--heal-at S``: rank 2
loses its state before step S and takes its twin's (rank 0's) shard, point to point. Each rank prints the
hash of its local shards (parameters and Adam's state) at the end: the twins (ranks r and r + 2)
hold the same shard, and every mode must give the same hashes.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

WORLD = 4


def local_sha256(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """The hash of this rank's shards: its parameters' local tensors and Adam's state for them."""
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.to_local().detach().numpy().tobytes())  # type: ignore[operator]
        for value in optimizer.state[param].values():
            local = value.to_local() if hasattr(value, "to_local") else value
            digest.update(local.detach().numpy().tobytes())
    return digest.hexdigest()


def heal_from_twin(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int) -> None:
    """Rank 2 forgets its shard (new parameters, no optimizer state, another RNG state: what a
    replacement starts with) and takes rank 0's, its twin in the other replica, point to point."""
    from taskd_client.pytorch.mesh import load_local_state, local_state

    if rank == 0:
        blob = io.BytesIO()
        torch.save(local_state(model, optimizer), blob)
        data = torch.frombuffer(bytearray(blob.getvalue()), dtype=torch.uint8)
        dist.send(torch.tensor([data.numel()]), dst=2)
        dist.send(data, dst=2)
    elif rank == 2:
        with torch.no_grad():
            for param in model.parameters():
                param.to_local().normal_()  # type: ignore[operator]
        optimizer.state.clear()
        torch.manual_seed(12345)
        size = torch.zeros(1, dtype=torch.int64)
        dist.recv(size, src=0)
        data = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.recv(data, src=0)
        load_local_state(model, optimizer, torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False))
        print(f"rank {rank} healed from rank 0", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", choices=("plain", "stable"), default="stable")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rebind-at", type=int, default=-1, help="stable groups: a new generation before this step")
    parser.add_argument(
        "--heal-at",
        type=int,
        default=-1,
        help="before this step rank 2 loses its state (as a replacement has none) and gets its twin's (rank 0)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)  # one summation order inside each rank
    rank = int(os.environ["RANK"])
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), WORLD, rank == 0, timeout=timedelta(seconds=60)
    )
    world = None
    if args.groups == "stable":
        from taskd_client.pytorch.mesh import resilient_mesh

        mesh, world = resilient_mesh((2, 2), ("replicate", "shard"), store=store, rank=rank, world_size=WORLD)
    else:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(args.steps):
        if world is not None and step == args.rebind_at:
            world.rebind(1)
            print(f"rank {rank} rebound to generation 1 before step {step}", flush=True)
        if step == args.heal_at:
            heal_from_twin(model, optimizer, rank)
        # Each replica (mesh row) trains on its own data; the two shards of a row see the same.
        data = torch.Generator().manual_seed(1000 * step + rank // 2)
        loss = model(torch.randn(8, 16, generator=data)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    print(f"rank {rank} final sha256 {local_sha256(model, optimizer)}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
