"""A plain PyTorch DDP script with no recoverd code at all: what most jobs look like.

It joins with ``init_process_group("gloo")`` on a ``TCPStore`` at MASTER_ADDR:MASTER_PORT (which
torchrun and recoverd's agent both set; a per-attempt prefix, as torchrun's restarts need), wraps an MLP in
``DistributedDataParallel``, resumes from ``--ckpt-dir`` if a checkpoint is there, and rank 0
saves one every ``--ckpt-every`` steps. Every rank prints ``rank R step S done T pid P`` after
each step and ``rank R final sha256 H`` at the end. The benchmark runs it under torchrun and under
recoverd's ``exit`` strategy (every rank restarted, forked from the warm-start server)::

    recoverd run --nproc-per-node 4 -- python examples/plain_ddp.py --steps 300 --ckpt-dir /tmp/ck
    torchrun --nproc-per-node 4 --max-restarts 3 examples/plain_ddp.py --steps 300 --ckpt-dir /tmp/ck
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

IN, HIDDEN, OUT = 64, 256, 10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--step-sleep", type=float, default=0.01, help="extra seconds per step (stands for compute)")
    parser.add_argument("--ckpt-dir", default=None)
    parser.add_argument("--ckpt-every", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)  # several ranks share this machine's cores
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # torchrun's agent hosts the store and keeps it across restarts: each attempt takes its own
    # prefix, or a restarted rank would read a dead peer's address (and time out connecting to it).
    # Under recoverd rank 0 hosts a new store in each incarnation, which the prefix does not hurt.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=rank == 0 and not agent_store, timeout=timedelta(seconds=30))  # fmt: skip
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))  # fmt: skip
    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ckpt = Path(args.ckpt_dir) / "checkpoint.pt" if args.ckpt_dir else None
    start = 0
    if ckpt is not None and ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        start = int(saved["step"])
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
    ddp = DistributedDataParallel(model)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(start, args.steps):
        time.sleep(args.step_sleep)
        optimizer.zero_grad()
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1_009 + rank)
        x, y = torch.randn(args.batch, IN, generator=g), torch.randint(0, OUT, (args.batch,), generator=g)
        loss_fn(ddp(x), y).backward()
        optimizer.step()
        print(f"rank {rank} step {step} done {time.time():.6f} pid {os.getpid()}", flush=True)
        if ckpt is not None and rank == 0 and (step + 1) % args.ckpt_every == 0:
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"step": step + 1, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp)
            os.replace(tmp, ckpt)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    print(f"rank {rank} final sha256 {digest}", flush=True)
    dist.barrier()  # nobody tears the group (and rank 0 the store) down while a peer still uses it
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
