"""Hang detection, measured: SIGSTOP of a rank that reports progress -> its ``hang`` fault.

With the defaults (learned timeout: 3 x the longest recent step time, at least 5 s; the start-up
allowance only for a rank's first 3 reports), for two step times:

* 0.1 s steps: the floor applies, the timeout is 5 s;
* 2.5 s steps: the learned timeout is 3 x 2.5 = 7.5 s.

Each trial SIGSTOPs one rank of a 4-rank job of examples/worker.py (``--heartbeat``) that is past
its warm-up, reads the hang fault's ``detected_at`` from the recovery record, and waits for the
rank to be recovered in place before the next trial. A fifth rank-free check: over the whole run,
no rank that was not stopped got a hang fault (false hangs).

Then two real PyTorch jobs (4 gloo ranks on the CPU, examples/ddp_train.py, gloo's collective
timeout an hour, so a blocked collective waits "forever"):

* **trainer**: recoverd's ``ResilientTrainer``; rank 2 is SIGSTOPped, its peers block in the step's
  all-reduce and say they wait. Only rank 2 should be a fault; the peers keep their processes.
* **plain DDP**: ``torch.distributed`` + ``DistributedDataParallel`` with one
  ``taskd_client.heartbeat(step)`` per step; rank 1 deadlocks (``threading.Event().wait()``) and its
  peers block in DDP's all-reduce for good. None of them can say it waits: all four are hangs,
  restarted in place, and the job must finish.

``python bench/hangs.py [--trials 5] [--no-torch]`` (``make bench-hangs``); writes
bench/results/hangs.json and hangs.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import DDP, PY, RESULTS, WORKER, ctl_view, rank_pid, recoverd_job, wait
from recoverd.records import pb, ts_to_s


def _step_count(logs: Path, rank: int) -> int:
    path = logs / f"rank{rank}.log"
    if not path.exists():
        return 0
    text = path.read_text(errors="replace")
    return text.rsplit(" restart ", 1)[-1].count(f"rank {rank} step ")  # steps of the current attempt


def measure(workdir: Path, step_s: float, trials: int) -> dict[str, Any]:
    name = f"hang-{str(step_s).replace('.', '_')}"
    command = [PY, WORKER, "--steps", "1000000", "--step-time", str(step_s), "--heartbeat"]
    samples: list[float] = []
    false_hangs: list[str] = []
    with recoverd_job(workdir, name, 4, "recover-in-place,exit", command) as job:
        epoch = 0
        for _ in range(trials):
            rank = random.randrange(4)
            pid = rank_pid(job, rank)
            # Past warm-up (3 reports) and with a few learned intervals: every rank.
            wait("warm-up", lambda: all(_step_count(job.logs, r) >= 6 for r in range(4)), timeout=120 + 10 * step_s)
            time.sleep(random.random() * step_s)  # anywhere in a step
            stopped = time.time()
            os.kill(pid, signal.SIGSTOP)

            def recovered(previous: int = epoch) -> Any:
                rec = ctl_view(job.endpoint, name).recovery
                return rec if rec is not None and rec.epoch > previous and rec.phase == pb.PHASE_DONE else None

            rec = wait("the hang's recovery", recovered, timeout=60 + 5 * step_s)
            epoch = rec.epoch
            for fault in rec.faults:
                if fault.rank != rank or fault.kind != "hang":
                    false_hangs.append(f"rank {fault.rank} ({fault.kind}): {fault.detail}")
                else:
                    samples.append(ts_to_s(fault.detected_at) - stopped)
                    print(f"  step {step_s}s: SIGSTOP -> hang {samples[-1]:.2f}s ({fault.detail})", flush=True)
            wait("the stopped rank replaced", lambda r=rank, p=pid: rank_pid(job, r) != p, timeout=60)
    bound = max(3 * step_s, 5.0)
    return {
        "step_s": step_s,
        "bound_s": bound,
        "trials": len(samples),
        "median_s": statistics.median(samples) if samples else None,
        "max_s": max(samples) if samples else None,
        "within_bound": sum(s <= bound for s in samples),
        "samples_s": samples,
        "false_hangs": false_hangs,
    }


def torch_job(workdir: Path, kind: str) -> dict[str, Any]:
    """One PyTorch hang (see the module docstring); what was faulted, how soon, and whether the job
    finished with every rank."""
    name = f"hang-torch-{kind}"
    common = ["--steps", "150", "--step-sleep", "0.02", "--collective-timeout", "3600", "--seed", "3"]
    if kind == "plain":
        command = [PY, DDP, "--launcher", "torchrun", *common, "--hang-rank", "1", "--hang-at-step", "60"]
        extra: tuple[str, ...] = ("--master-addr", "127.0.0.1")
    else:
        command = [PY, DDP, *common]
        extra = ()
    with recoverd_job(workdir, name, 4, "recover-in-place,exit", command, extra) as job:
        before = {r: rank_pid(job, r) for r in range(4)}
        log = job.logs / ("rank1.log" if kind == "plain" else "rank2.log")
        marker = "deadlocking at step" if kind == "plain" else "rank 2 step 60 done"
        wait(marker, lambda: log.exists() and marker in log.read_text(errors="replace"), timeout=300)
        started = time.time()
        if kind == "trainer":
            os.kill(before[2], signal.SIGSTOP)

        def recovered() -> Any:
            rec = ctl_view(job.endpoint, name).recovery
            return rec if rec is not None and rec.phase == pb.PHASE_DONE else None

        rec = wait("the hang's recovery", recovered, timeout=120)
        finished = job.proc.wait(timeout=600) == 0
        finals = {
            r: next((ln for ln in (job.logs / f"rank{r}.log").read_text().splitlines() if "final sha256" in ln), "")
            for r in range(4)
        }
    faulted = sorted((f.rank, f.kind) for f in rec.faults)
    first = min(ts_to_s(f.detected_at) for f in rec.faults)
    return {
        "job": kind,
        "faults": faulted,
        "detected_after_s": first - started,
        "strategy": rec.strategy,
        "finished": finished and all(finals.values()),
        "bitwise_equal": len({ln.split()[-1] for ln in finals.values() if ln}) == 1,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--no-torch", action="store_true", help="skip the two PyTorch jobs")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="recoverd-bench-hangs-"))
    rows = [measure(workdir, step, args.trials) for step in (0.1, 2.5)]
    torch_rows = [] if args.no_torch else [torch_job(workdir, kind) for kind in ("trainer", "plain")]
    results = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "make bench-hangs",
        "rows": rows,
        "torch": torch_rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "hangs.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "# Hang detection (make bench-hangs)",
        "",
        f"{results['when']}; SIGSTOP of one of 4 worker ranks -> its hang fault, defaults (floor 5 s, 3 x step time).",
        "",
        "| step time | bound max(3 x step, 5 s) | trials | median | max | within bound | false hangs |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['step_s']} s | {row['bound_s']:.1f} s | {row['trials']} | {row['median_s']:.2f} s |"
            f" {row['max_s']:.2f} s | {row['within_bound']}/{row['trials']} | {len(row['false_hangs'])} |"
        )
    if torch_rows:
        lines += [
            "",
            "PyTorch, 4 gloo ranks, collectives blocked for good (gloo timeout 1 h), defaults:",
            "",
            "| job | hang | faults | detected after | strategy | job finished | ranks bitwise equal |",
            "|---|---|---|---|---|---|---|",
        ]
        hangs = {"trainer": "SIGSTOP of rank 2", "plain": "rank 1 deadlocked"}
        for row in torch_rows:
            faults = ", ".join(f"{rank} ({kind})" for rank, kind in row["faults"])
            lines.append(
                f"| {row['job']} | {hangs[row['job']]} | {faults} | {row['detected_after_s']:.2f} s |"
                f" {row['strategy']} | {row['finished']} | {row['bitwise_equal']} |"
            )
    (RESULTS / "hangs.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
