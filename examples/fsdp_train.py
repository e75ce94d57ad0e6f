"""A sharded (FSDP2) training script whose survivors outlive a peer's death: HSDP on the CPU.

Under recoverd (docs/pytorch.md, "Sharded models")::

    recoverd run --nproc-per-node 4 --strategies recover-in-place,exit -- \\
        python examples/fsdp_train.py --steps 200

four ranks train a small MLP with FSDP2 (``fully_shard``) on a 2 x 2 mesh: two replicas
("replicate") of a model sharded over two ranks ("shard"). Ranks r and r + 2 hold the same shard:
they are twins. When a rank is killed, the others keep their processes, recoverd restarts only the
dead rank, every group of the mesh moves to the next generation, and the replacement receives its
shard (parameters, Adam's state, RNG) from its twin, point to point: no checkpoint is read.

Under torchrun (``--launcher torchrun``: the benchmark's baseline) it is the same model on torch's
own groups, checkpointed with torch.distributed.checkpoint every ``--ckpt-every`` steps and resumed
from it after a restart of every rank.

Every rank prints ``rank R step S done T`` after each step, and at the end ``rank R final sha256 H``
of its shard (local parameter shards and Adam's state): equal hashes across runs mean bitwise-equal
shards, and twins print the same hash.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn

IN, HIDDEN, OUT = 64, 256, 16
#: --mesh: HSDP (two replicas of a model sharded over two ranks: twins) or pure FSDP (no twin).
MESHES = {"hsdp": ((2, 2), ("replicate", "shard")), "fsdp": ((4,), ("shard",))}


def make_model(seed: int, mesh: Any) -> nn.Module:
    """The same initial model on every rank (the seed), sharded by FSDP2 over ``mesh``."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT)
    )
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def batch(seed: int, step: int, replica: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Replica ``replica``'s data at ``step`` (the ranks of one replica see the same batch)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + replica)
    return torch.randn(size, IN, generator=g), torch.randint(0, OUT, (size,), generator=g)


def shard_sha256(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """The hash of this rank's shard: its parameters' local tensors and Adam's state for them."""
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.to_local().detach().numpy().tobytes())  # type: ignore[operator]
        for key, value in sorted(optimizer.state[param].items()):
            digest.update(key.encode())
            local = value.to_local() if hasattr(value, "to_local") else value
            digest.update(local.detach().numpy().tobytes())
    return digest.hexdigest()


def save_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, ckpt: Path, step: int, rank: int) -> None:
    """Every rank writes its shards (torch.distributed.checkpoint, a collective); rank 0 then
    records the step, once every rank has written."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(ckpt / f"step{step}"))
    dist.barrier()
    if rank == 0:
        (ckpt / "step.tmp").write_text(str(step))
        os.replace(ckpt / "step.tmp", ckpt / "step")


def load_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, ckpt: Path | None) -> int | None:
    """The step of the last checkpoint, loaded into the model and optimizer in place; None if none."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if ckpt is None or not (ckpt / "step").exists():
        return None
    step = int((ckpt / "step").read_text())
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(ckpt / f"step{step}"))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    print(f"rank {os.environ.get('RANK')} loaded the checkpoint of step {step}", flush=True)
    return step


def done(rank: int, step: int) -> None:
    print(f"rank {rank} step {step} done {time.time():.6f} pid {os.getpid()}", flush=True)


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, args: argparse.Namespace, step: int, rank: int
) -> None:
    shape, _names = MESHES[args.mesh]
    optimizer.zero_grad(set_to_none=True)
    x, y = batch(args.seed, step, rank // shape[-1] if len(shape) > 1 else rank, args.batch)
    nn.functional.cross_entropy(model(x), y).backward()  # FSDP2 reduces the gradients here
    time.sleep(args.step_sleep)


def run_recoverd(args: argparse.Namespace) -> int:
    from taskd_client.pytorch import ResilientTrainer, wait_for_rank
    from taskd_client.pytorch.mesh import resilient_mesh

    wait_for_rank()  # a warm spare waits here, torch imported, to be given a rank
    rank = int(os.environ["RANK"])
    mesh, _ = resilient_mesh(*MESHES[args.mesh])  # no network: the trainer connects the groups
    model = make_model(args.seed, mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    ckpt = Path(args.ckpt_dir) if args.ckpt_dir else None

    def load_state() -> tuple[int, None] | None:
        # Read only when no rank holds live state (the job's start, or recoverd's `exit`): a
        # replacement beside survivors takes its shard from its twin or a RAM copy instead.
        step = load_checkpoint(model, optimizer, ckpt)
        return None if step is None else (step, None)

    say = lambda text: print(f"{text} (at {time.time():.6f})", flush=True)  # noqa: E731
    trainer = ResilientTrainer(
        model,
        optimizer,
        mesh=mesh,
        ram_copy_every=args.ram_copy_every,
        load_state=load_state if ckpt is not None else None,
        timeout=timedelta(seconds=args.collective_timeout),
        on_event=say,
    )
    for step in trainer.steps(args.steps):
        with trainer.step_scope():
            train_step(model, optimizer, args, step, rank)
            if trainer.apply():
                done(rank, step)
                if ckpt is not None and args.ckpt_every and (step + 1) % args.ckpt_every == 0:
                    save_checkpoint(model, optimizer, ckpt, step + 1, rank)  # inside: a peer may die
    print(f"rank {rank} final sha256 {shard_sha256(model, optimizer)}", flush=True)
    trainer.close()
    return 0


def run_torchrun(args: argparse.Namespace) -> int:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from taskd_client import heartbeat
    from taskd_client.progress import done as taskd_client_done

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    tcp = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                        timeout=timedelta(seconds=30))  # fmt: skip
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", tcp), rank=rank, world_size=world,
                            timeout=timedelta(seconds=args.collective_timeout))  # fmt: skip
    shape, names = MESHES[args.mesh]
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    model = make_model(args.seed, mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    ckpt = Path(args.ckpt_dir) if args.ckpt_dir else None
    start = load_checkpoint(model, optimizer, ckpt) or 0
    for step in range(start, args.steps):
        train_step(model, optimizer, args, step, rank)
        optimizer.step()
        done(rank, step)
        heartbeat(step)
        if ckpt is not None and args.ckpt_every and (step + 1) % args.ckpt_every == 0:
            save_checkpoint(model, optimizer, ckpt, step + 1, rank)
    taskd_client_done()
    print(f"rank {rank} final sha256 {shard_sha256(model, optimizer)}", flush=True)
    dist.destroy_process_group()
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launcher", choices=("recoverd", "torchrun"), default="recoverd")
    parser.add_argument("--mesh", choices=tuple(MESHES), default="hsdp", help="HSDP 2 x 2 (twins) or FSDP over 4")
    parser.add_argument(
        "--ram-copy-every",
        type=int,
        default=0,
        help="recoverd: keep a copy of a peer's shard in RAM every N steps (what heals pure FSDP)",
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--step-sleep", type=float, default=0.01, help="extra seconds per step (stands for compute)")
    parser.add_argument(
        "--ckpt-dir",
        default=None,
        help="checkpoint here (torch.distributed.checkpoint) every --ckpt-every steps; read when no peer is live",
    )
    parser.add_argument("--ckpt-every", type=int, default=0)
    parser.add_argument("--collective-timeout", type=float, default=60.0, help="gloo's timeout in seconds")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # one summation order inside each rank; several ranks share the cores
    return run_torchrun(args) if args.launcher == "torchrun" else run_recoverd(args)


if __name__ == "__main__":
    sys.exit(main())
