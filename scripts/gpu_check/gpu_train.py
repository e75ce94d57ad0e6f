"""The rank script of scripts/gpu_check.sh's jobs: examples/ddp_train.py's MLP on a GPU, through
``ResilientTrainer(ddp=True)`` on the job's backend (``RECOVERD_TORCH_BACKEND``, else the trainer's
default: ``cpu:gloo,cuda:nccl`` where CUDA is available).

Before it touches CUDA it prints what a warm start must leave it: ``torch`` imported beforehand
(the warm-start server preloaded it), CUDA not initialised and not a "bad fork" (torch marks a
process forked from one that had initialised CUDA: such a rank cannot use the GPU). The checks read
these lines from the rank's log (scripts/gpu_check/checks.py), and the per-step lines as
examples/ddp_train.py prints them: ``rank R step S done T pid P``, ``rank R final sha256 H``.

``--share-gpu``: every local rank uses GPU 0 (one GPU, several ranks: NCCL refuses two ranks of one
communicator on the same GPU, so such a job runs ``cuda:gloo``). ``--device cpu`` is the CPU
rehearsal of the same job (``gpu_check.sh --rehearse-on-cpu``).
"""

from __future__ import annotations

import sys

PRELOADED = "torch" in sys.modules  # before this script imports it: forked from the warm-start server

import argparse  # noqa: E402
import hashlib  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

IN, HIDDEN, OUT = 64, 256, 10


def cuda_state() -> str:
    """What this process's CUDA looks like, without initialising it."""
    bad_fork = getattr(torch.cuda, "_is_in_bad_fork", lambda: False)()
    return f"cuda initialised {torch.cuda.is_initialized()}, bad fork {bad_fork}"


def make_model(seed: int, device: torch.device) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT)
    )
    return model.to(device)


def batch(seed: int, step: int, rank: int, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's shard of step ``step``: the same numbers in every run (made on the CPU)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    return torch.randn(size, IN, generator=g).to(device), torch.randint(0, OUT, (size,), generator=g).to(device)


def params_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def save_checkpoint(path: Path, step: int, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"step": step, "state": state}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path | None, device: torch.device) -> tuple[int, dict[str, Any]] | None:
    if path is None or not path.exists():
        return None
    saved = torch.load(path, map_location=device, weights_only=False)
    print(f"loaded checkpoint of step {saved['step']} onto {device}", flush=True)
    return int(saved["step"]), saved["state"]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--step-sleep", type=float, default=0.05, help="seconds per step (time to kill a rank)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--share-gpu", action="store_true", help="every local rank on GPU 0")
    parser.add_argument("--ckpt-dir", default=None, help="rank 0 checkpoints here every --ckpt-every steps")
    parser.add_argument("--ckpt-every", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rank = int(os.environ["RANK"])
    print(
        f"gpu-check rank {rank} pid {os.getpid()} start: torch preloaded {PRELOADED}, {cuda_state()},"
        f" restart {os.environ.get('RECOVERD_RESTART_COUNT', '0')}",
        flush=True,
    )
    torch.set_num_threads(1)
    if args.device == "cuda":
        if args.share_gpu:
            # ResilientGroup puts a job's GPU-only collectives on cuda:LOCAL_RANK: here, GPU 0 for all.
            os.environ["LOCAL_RANK"] = "0"
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
        # Bitwise comparable runs (a recovered run against a fault-free one).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        print(
            f"gpu-check rank {rank} on {device}: {torch.cuda.get_device_name(device)}; now {cuda_state()}", flush=True
        )
    else:
        device = torch.device("cpu")

    from taskd_client.pytorch import ResilientTrainer

    model = make_model(args.seed, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    ckpt = Path(args.ckpt_dir) / "checkpoint.pt" if args.ckpt_dir else None
    trainer = ResilientTrainer(
        model,
        optimizer,
        load_state=lambda: load_checkpoint(ckpt, device),
        timeout=timedelta(seconds=60),
        on_event=lambda text: print(f"{text} (at {time.time():.6f})", flush=True),
        ddp=True,
    )
    print(f"gpu-check rank {rank}: backends {trainer.group.backends}, group device {trainer.group.device}", flush=True)
    for step in trainer.steps(args.steps):
        with trainer.step_scope():
            optimizer.zero_grad()
            x, y = batch(args.seed, step, rank, args.batch, device)
            assert trainer.ddp is not None
            loss_fn(trainer.ddp(x), y).backward()
            time.sleep(args.step_sleep)
            if trainer.apply():
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                print(f"rank {rank} step {step} done {time.time():.6f} pid {os.getpid()}", flush=True)
                if ckpt is not None and rank == 0 and args.ckpt_every and (step + 1) % args.ckpt_every == 0:
                    save_checkpoint(ckpt, step + 1, trainer.state())
    print(f"rank {rank} final sha256 {params_sha256(model)}", flush=True)
    trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
