"""`make bench-fsdp`: a sharded model's recovery, recoverd against torchrun on the same FSDP2 script.

examples/fsdp_train.py: 4 ranks on the CPU (gloo), FSDP2 with Adam on a 2 x 2 HSDP mesh (replicate x
shard). Rank 1 is SIGKILLed at a random moment after a random step in 30..60, and the time from the
kill to the next completed training step is measured (as in make bench's P3):

* **torchrun** ``--max-restarts 3`` (c10d rendezvous): every rank restarts and resumes from the
  script's torch.distributed.checkpoint (DCP) checkpoint, written every 10 steps;
* **recoverd recover-in-place** (``recoverd run``'s defaults: warm starts, fault window): the
  survivors keep their processes, the replacement is forked from the warm-start server and takes
  its shard from its twin (``ResilientTrainer(mesh=)``, docs/adr/0047).

The systems alternate trial by trial, so drifts in the machine's load hit both alike; results are
medians, and recoverd's as a ratio of torchrun's measured in the same run: bench/results/fsdp.{json,md}.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import PY, RESULTS, kill_after_step, recoverd_job, time_to_next_step, torchrun_job, wait

FSDP = str(Path(__file__).resolve().parents[1] / "examples" / "fsdp_train.py")
SYSTEMS = {
    "torchrun": "torchrun --max-restarts 3, DCP checkpoint every 10 steps",
    "recoverd-in-place": "recoverd recover-in-place, healed from the twin (warm start)",
}


def command(steps: int, ckpt: Path, launcher: str) -> list[str]:
    return [PY, FSDP, "--launcher", launcher, "--steps", str(steps), "--ckpt-dir", str(ckpt), "--ckpt-every", "10"]


def step_time(job: Any, before: float) -> float:
    """The median time of rank 0's fault-free steps (from step 10 on, until the kill)."""
    times = [at for rank, step, at, _pid in job.steps() if rank == 0 and step >= 10 and at < before]
    return statistics.median(b - a for a, b in itertools.pairwise(times))


def trial(workdir: Path, system: str, number: int) -> tuple[float, float]:
    """(SIGKILL -> next step, the median fault-free step before it), in seconds."""
    name = f"fsdp-{system}-{number}"
    ckpt = workdir / name / "ckpt"
    if system == "torchrun":
        job_context = torchrun_job(workdir, name, 4, command(10**6, ckpt, "torchrun")[1:], 3)
    else:
        job_context = recoverd_job(
            workdir, name, 4, "recover-in-place,exit", command(10**6, ckpt, "recoverd"), (), fast=()
        )
    with job_context as job:
        if system != "torchrun":
            wait("the warm-start server", lambda: " ready in " in job.out.read_text(), 120)
        pid, killed = kill_after_step(job, 1, random.randrange(30, 60), 0.004)
        took = wait(f"{name}: the next step", lambda: time_to_next_step(job, killed, pid), 180)
        return float(took), step_time(job, killed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=6, help="trials per system (alternated)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="recoverd-bench-fsdp-"))
    print(f"bench-fsdp: work in {workdir}", flush=True)
    samples: dict[str, list[float]] = {system: [] for system in SYSTEMS}
    steps: dict[str, list[float]] = {system: [] for system in SYSTEMS}
    for number in range(args.trials):
        for system in SYSTEMS:
            took, step = trial(workdir, system, number)
            samples[system].append(took)
            steps[system].append(step)
            print(f"{system} trial {number}: {took:.3f} s (steps of {1000 * step:.1f} ms before)", flush=True)
    base = statistics.median(samples["torchrun"])
    results: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "command": "make bench-fsdp  # python bench/fsdp.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "systems": {
            system: {
                "label": SYSTEMS[system],
                "trials": len(values),
                "median_s": statistics.median(values),
                "ratio": statistics.median(values) / base,
                "samples_s": values,
                "step_ms": 1000 * statistics.median(steps[system]),
            }
            for system, values in samples.items()
        },
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / "fsdp.json").write_text(json.dumps(results, indent=2) + "\n")
    rows = [
        f"# FSDP2 (HSDP 2 x 2, Adam, 4 CPU ranks): SIGKILL of rank 1 -> next step ({results['when']},"
        f" {results['machine']})",
        "",
        f"Command: `{results['command']}`",
        "",
        "| System | SIGKILL → next step, median (s) | x torchrun | Target | Met | Fault-free step (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for system, entry in results["systems"].items():
        target, met = (
            ("≤ 0.1 x torchrun", "yes" if entry["ratio"] <= 0.1 else "no") if system != "torchrun" else ("", "")
        )
        rows.append(
            f"| {entry['label']} ({entry['trials']} trials) | {entry['median_s']:.3f} | {entry['ratio']:.3f}"
            f" | {target} | {met} | {entry['step_ms']:.1f} |"
        )
    rows += [
        "",
        "The fault-free step includes the example's 10 ms of sleep standing for compute; recoverd's runs every"
        " collective of the model through its stable groups (Python), torchrun's through torch's own.",
    ]
    (args.results_dir / "fsdp.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
