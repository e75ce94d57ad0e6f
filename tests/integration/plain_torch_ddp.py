"""The plainest PyTorch DDP script there is, as users write it: no recoverd code, no checkpoint,
``init_process_group("gloo")`` from the environment (env://), a DDP model, and a line per step.

Used by tests/integration/test_plain_scripts.py: under ``recoverd run --strategies
recover-in-place,exit`` a rank's SIGKILL must restart every rank (a lone restart would wait in
init_process_group for good) and the job must end 0 (docs/adr/0041).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-time", type=float, default=0.05)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        print(f"rank {rank} step {step} pid {os.getpid()}", flush=True)
        time.sleep(args.step_time)
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
