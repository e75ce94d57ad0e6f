"""`make bench-ddp`: what ResilientTrainer costs per training step against plain DDP.

The same model, batch and data (``--nproc`` ranks, default 2: one per core of a 2-core machine; gloo
on CPU, one intra-op thread each, no sleep standing for compute unless ``--step-sleep``), each run
as a job under ``recoverd run`` so that everything but the training loop is alike:

* **plain DDP**: examples/plain_ddp.py, torch's ``DistributedDataParallel`` with its built-in
  all-reduce, ``init_process_group`` (no recoverd code);
* **trainer + DDP**: examples/ddp_train.py ``--ddp``: ``ResilientTrainer(ddp=True)``, torch's DDP on
  the trainer's group with the abortable communication hook;
* **trainer, flat**: examples/ddp_train.py: the trainer's own flat all-reduce after the backward.

A step's time is the median interval between rank 0's consecutive ``step done`` lines after a
warm-up; the variants alternate round by round (the machine's load drifts) and each round's
ratio to plain DDP is taken side by side. Results: bench/results/ddp_overhead.{json,md}.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PY = sys.executable
STEP_RE = re.compile(r"^rank 0 step (\d+) done (\S+)", re.M)

VARIANTS = {
    "plain DDP": [str(ROOT / "examples" / "plain_ddp.py")],
    "trainer + DDP": [str(ROOT / "examples" / "ddp_train.py"), "--ddp"],
    "trainer, flat all-reduce": [str(ROOT / "examples" / "ddp_train.py")],
}


def step_time(workdir: Path, name: str, script: list[str], args: argparse.Namespace) -> float:
    logs = workdir / name
    argv = [PY, "-m", "recoverd.cli.main", "run", "--job", name, "--nproc-per-node", str(args.nproc),
            "--log-dir", str(logs), "--no-hang-detection", "--", PY, *script, "--steps", str(args.steps),
            "--step-sleep", str(args.step_sleep)]  # fmt: skip
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench-ddp: {name} failed:\n{done.stdout.decode(errors='replace')[-3000:]}")
    # The first incarnation only: a rank that aborts while exiting (torch's teardown, seen with a
    # TCPStore hosted by rank 0) makes recoverd run the job again, and its steps would mix in.
    first = (logs / "rank0.log").read_text().split(" restart (", 1)[0]
    times = sorted((int(s), float(t)) for s, t in STEP_RE.findall(first))
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(times) if a[0] >= args.warmup]
    return statistics.median(gaps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--nproc", type=int, default=2, help="ranks (2: one per core here, not oversubscribed)")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds standing for compute in a step")
    parser.add_argument("--name", default="ddp_overhead", help="results file name in bench/results/")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="recoverd-bench-ddp-"))
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for round_ in range(args.rounds):
        for variant, script in VARIANTS.items():
            name = f"r{round_}-{re.sub(r'[^a-z]+', '-', variant)}".strip("-")
            samples[variant].append(step_time(workdir, name, script, args))
            print(f"round {round_} {variant}: {1000 * samples[variant][-1]:.3f} ms/step", flush=True)
    base = samples["plain DDP"]
    results = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, Python {sys.version.split()[0]}",
        "rounds": args.rounds,
        "steps": args.steps,
        "nproc": args.nproc,
        "step_sleep_s": args.step_sleep,
        "variants": {
            v: {
                "median_ms": 1000 * statistics.median(s),
                "samples_ms": [1000 * x for x in s],
                "ratio_to_plain_ddp": statistics.median([x / b for x, b in zip(s, base, strict=True)]),
            }
            for v, s in samples.items()
        },
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(results, indent=2) + "\n")
    rows = [
        f"# ResilientTrainer against plain DDP (make bench-ddp, {results['when']}, {results['machine']})",
        "",
        f"{args.nproc} ranks, gloo on CPU, the MLP of examples/, {args.step_sleep:g} s of sleep standing for compute"
        f" per step, {args.steps} steps per run (first {args.warmup} skipped),"
        f" {args.rounds} alternating rounds; ratio: median of the per-round ratios to plain DDP.",
        "",
        "| variant | step time, median | ratio to plain DDP |",
        "|---|---|---|",
        *[f"| {v} | {r['median_ms']:.3f} ms | {r['ratio_to_plain_ddp']:.3f} |" for v, r in results["variants"].items()],
    ]
    (RESULTS / f"{args.name}.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
