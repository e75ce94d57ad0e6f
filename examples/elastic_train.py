"""Data-parallel training (gloo, CPU) that takes part in recoverd's recoveries: elastic world, dump.

Under recoverd, two nodes of two ranks, a node lost -> the job shrinks to 2 ranks; a spare agent
registers later -> it grows back to 4 (docs/pytorch.md, "Elastic world size")::

    recoverd agent --job J --node a --nproc-per-node 2 --nnodes 2 --node-rank 0 \\
        --strategies elastic-training,exit -- python examples/elastic_train.py --steps 400
    recoverd agent --job J --node b ... --node-rank 1 ...
    recoverd agent --job J --node spare --nproc-per-node 2 --nnodes 2 --spare ...   # later

or, saving and resuming (``--strategies dump,exit``, ``--dump-dir DIR``; with ``--via-agent`` every
rank answers through its node agent instead of rank 0's relay, docs/adr/0036).

Each rank trains a small MLP to imitate a fixed random "teacher" network on a synthetic dataset,
which it shards with ``ElasticShards``: the global batch of a step is the same samples whatever the
world, so a downgrade or an upgrade changes only how a step's batch is split. Rank 0 (the job's
recovery client, ``RecoveryProtocol``) offers ``--offer`` to recoverd. Every rank prints
``rank R step S done T pid P world W loss L`` after each step and ``rank R world change A -> B at
step S`` when the world changes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from datetime import timedelta

import torch
from torch import nn

IN, HIDDEN, OUT = 32, 64, 8


def make_data(seed: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and the teacher's labels: the same in every rank and every run."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, IN, generator=g)
    teacher = torch.randn(IN, OUT, generator=g)
    return x, (x @ teacher).argmax(dim=1)


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))


def run(args: argparse.Namespace) -> int:
    from taskd_client.pytorch import ElasticShards, RecoveryProtocol, ResilientTrainer, wait_for_rank

    wait_for_rank()
    rank = int(os.environ["RANK"])

    def say(text: str) -> None:
        print(f"{text} (at {time.time():.6f})", flush=True)

    def on_world_change(old: int, new: int) -> None:
        # The global batch is fixed (ElasticShards), so the update rule does not change; a job that
        # fixes the per-rank batch instead would scale its learning rate by new / old here.
        print(f"rank {rank} world change {old} -> {new} at step {trainer.step}", flush=True)

    x, y = make_data(args.seed, args.dataset)
    model = make_model(args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    protocol = RecoveryProtocol(
        offer=args.offer,
        dump_dir=args.dump_dir,
        on_world_change=on_world_change,
        on_event=say,
        via_agent=args.via_agent,
    )
    trainer = ResilientTrainer(
        model,
        optimizer,
        protocol=protocol,
        load_state=protocol.load_dump,
        timeout=timedelta(seconds=args.collective_timeout),
        on_event=say,
    )
    shards = ElasticShards(len(x), args.global_batch, seed=args.seed)
    loss_fn = nn.CrossEntropyLoss()
    for step in trainer.steps(args.steps):
        with trainer.step_scope():
            optimizer.zero_grad()
            idx = shards.indices(step, trainer.rank, trainer.world_size)
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            world = trainer.world_size
            full = world == int(os.environ["WORLD_SIZE"])
            time.sleep(args.step_sleep if full else args.small_world_sleep or args.step_sleep)
            if trainer.apply():
                print(
                    f"rank {rank} step {step} done {time.time():.6f} pid {os.getpid()} world {world}"
                    f" loss {loss.item():.4f}",
                    flush=True,
                )
    print(f"rank {rank} finished {args.steps} steps", flush=True)
    trainer.close()
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--dataset", type=int, default=4096, help="samples in the synthetic dataset")
    parser.add_argument("--global-batch", type=int, default=64, help="samples per step, over all ranks")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--step-sleep", type=float, default=0.02, help="extra seconds per step (stands for compute)")
    parser.add_argument(
        "--small-world-sleep",
        type=float,
        default=None,
        help="seconds per step instead of --step-sleep while the world is smaller than WORLD_SIZE"
        " (fewer replicas each take more of the global batch; tests use it to give a spare time to start)",
    )
    parser.add_argument(
        "--offer",
        type=lambda text: tuple(s.strip() for s in text.split(",") if s.strip()),
        default=("elastic-training", "dump", "exit"),
        help="strategies rank 0 offers recoverd (comma-separated)",
    )
    parser.add_argument("--dump-dir", default=None, help="where a dump saves, and a restart resumes from")
    parser.add_argument(
        "--via-agent",
        action="store_true",
        help="every rank takes part in recoverd's protocol through its node agent (docs/adr/0036)"
        " instead of rank 0's relay client",
    )
    parser.add_argument("--collective-timeout", type=float, default=60.0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # several ranks share this machine's cores
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
