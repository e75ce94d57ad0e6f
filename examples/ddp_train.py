"""A data-parallel (DDP-style, gloo, CPU) training script whose survivors outlive a peer's death.

Under recoverd (``make demo-torch``; docs/pytorch.md)::

    recoverd run --nproc-per-node 4 --strategies recover-in-place,exit -- \\
        python examples/ddp_train.py --steps 300

each rank trains a small MLP on its own deterministic shard of synthetic data, through
``taskd_client.pytorch.ResilientTrainer``: when a rank is killed, the others keep their processes,
recoverd restarts only the dead rank, the group is re-formed with the replacement, which receives
the model and optimizer state from a healthy peer, and training continues from the same step.

Under torchrun (the benchmark's baseline, ``--launcher torchrun``) it is a plain
``DistributedDataParallel`` script at its best: it joins through a per-attempt ``PrefixStore`` with a
short timeout (without that, restarted workers hang on the dead worker's old address) and resumes
from its own checkpoint (``--ckpt-every`` steps, rank 0 writes it).

Every rank prints ``rank R step S done T`` (T: wall-clock seconds) after each step, and at the end
``rank R final sha256 H`` of its parameters: equal hashes across runs mean bitwise-equal models.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn

IN, HIDDEN, OUT = 64, 256, 10


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def batch(seed: int, step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's shard of step ``step``: the same numbers in every run."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    return torch.randn(size, IN, generator=g), torch.randint(0, OUT, (size,), generator=g)


def params_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def save_checkpoint(path: Path, step: int, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"step": step, "state": state}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path | None) -> tuple[int, dict[str, Any]] | None:
    if path is None or not path.exists():
        return None
    saved = torch.load(path, weights_only=False)
    return int(saved["step"]), saved["state"]


def done(rank: int, step: int) -> None:
    print(f"rank {rank} step {step} done {time.time():.6f} pid {os.getpid()}", flush=True)


def run_recoverd(args: argparse.Namespace) -> int:
    from taskd_client.pytorch import RecoveryProtocol, ResilientTrainer, RetryableFault, wait_for_rank

    wait_for_rank()  # a warm spare (--warm-spares) waits here, torch imported, to be given a rank
    rank = int(os.environ["RANK"])
    model = make_model(args.seed)
    optimizer = make_optimizer(model)
    loss_fn = nn.CrossEntropyLoss()
    ckpt = Path(args.ckpt_dir) / "checkpoint.pt" if args.ckpt_dir else None
    say = lambda text: print(f"{text} (at {time.time():.6f})", flush=True)  # noqa: E731
    # --via-agent: every rank joins recoverd's protocol through its node agent, so that recoverd
    # decides on a RetryableFault (retry, or a costlier strategy) instead of the trainer alone.
    protocol = (
        RecoveryProtocol(offer=("retry", "recover-in-place", "exit"), via_agent=True, on_event=say)
        if args.via_agent
        else None
    )
    trainer = ResilientTrainer(
        model,
        optimizer,
        load_state=lambda: load_checkpoint(ckpt),
        timeout=timedelta(seconds=args.collective_timeout or 60.0),
        on_event=say,
        ddp=args.ddp,
        protocol=protocol,
    )
    injected = int(os.environ.get("RECOVERD_RESTART_COUNT", "0")) > 0
    for step in trainer.steps(args.steps):
        with trainer.step_scope():
            optimizer.zero_grad()
            x, y = batch(args.seed, step, rank, args.batch)
            loss_fn((trainer.ddp if args.ddp else model)(x), y).backward()
            if step == args.retry_at_step and rank == args.retry_rank and not injected:
                injected = True
                with torch.no_grad():  # the memory error scribbled on this rank's parameters:
                    for param in model.parameters():  # the retry repairs them from a healthy peer
                        param.add_(1.0)
                raise RetryableFault("simulated uncorrectable memory error")
            time.sleep(args.step_sleep)
            if trainer.apply():
                done(rank, step)
                if ckpt is not None and rank == 0 and args.ckpt_every and (step + 1) % args.ckpt_every == 0:
                    save_checkpoint(ckpt, step + 1, trainer.state())
    print(f"rank {rank} final sha256 {params_sha256(model)}", flush=True)
    trainer.close()
    return 0


def run_torchrun(args: argparse.Namespace) -> int:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from taskd_client import heartbeat
    from taskd_client.progress import done as taskd_client_done

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    # Under torchrun its agent hosts the store; under a recoverd agent (plain torch.distributed, no
    # recoverd client but heartbeat) rank 0 does.
    hosts_store = rank == 0 and "RECOVERD_RUN" in os.environ
    tcp = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=hosts_store,
                        timeout=timedelta(seconds=30))  # fmt: skip
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", tcp), rank=rank, world_size=world,
                            timeout=timedelta(seconds=args.collective_timeout or 10.0))  # fmt: skip
    model = make_model(args.seed)
    optimizer = make_optimizer(model)
    ckpt = Path(args.ckpt_dir) / "checkpoint.pt" if args.ckpt_dir else None
    start = 0
    loaded = load_checkpoint(ckpt)
    if loaded is not None:
        start, state = loaded
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    ddp = DistributedDataParallel(model)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(start, args.steps):
        if step == args.hang_at_step and rank == args.hang_rank and attempt == "0":
            print(f"rank {rank}: deadlocking at step {step} (--hang-rank)", flush=True)
            threading.Event().wait()  # its peers block in the step's all-reduce, for good
        time.sleep(args.step_sleep)  # stands for compute, before the all-reduce (as in run_recoverd)
        optimizer.zero_grad()
        x, y = batch(args.seed, step, rank, args.batch)
        loss_fn(ddp(x), y).backward()  # DDP all-reduces the gradients here
        optimizer.step()
        done(rank, step)
        heartbeat(step)  # hang detection under a recoverd agent; nothing otherwise
        if ckpt is not None and rank == 0 and args.ckpt_every and (step + 1) % args.ckpt_every == 0:
            save_checkpoint(ckpt, step + 1, {"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    taskd_client_done()  # tearing the group down makes no progress: not a hang
    print(f"rank {rank} final sha256 {params_sha256(model)}", flush=True)
    dist.destroy_process_group()
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launcher", choices=("recoverd", "torchrun"), default="recoverd")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--step-sleep", type=float, default=0.01, help="extra seconds per step (stands for compute)")
    parser.add_argument("--ckpt-dir", default=None, help="checkpoint here every --ckpt-every steps; resume from it")
    parser.add_argument("--ckpt-every", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    parser.add_argument(
        "--ddp", action="store_true", help="recoverd: wrap the model in DistributedDataParallel (ddp=True)"
    )
    parser.add_argument("--retry-at-step", type=int, default=-1, help="raise a RetryableFault at this step ...")
    parser.add_argument("--retry-rank", type=int, default=-1, help="... in this rank (once)")
    parser.add_argument(
        "--via-agent",
        action="store_true",
        help="recoverd: every rank takes part in recoverd's protocol through its node agent (docs/adr/0036):"
        " recoverd decides what a RetryableFault gets",
    )
    parser.add_argument(
        "--collective-timeout", type=float, default=None, help="gloo's timeout in seconds (recoverd: 60, torchrun: 10)"
    )
    parser.add_argument("--hang-at-step", type=int, default=-1, help="deadlock at this step (torchrun mode) ...")
    parser.add_argument("--hang-rank", type=int, default=-1, help="... in this rank, on its first attempt")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)  # several ranks share this machine's cores
    return run_torchrun(args) if args.launcher == "torchrun" else run_recoverd(args)


if __name__ == "__main__":
    sys.exit(main())
