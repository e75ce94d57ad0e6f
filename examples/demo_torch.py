"""`make demo-torch`: 4 ranks of real PyTorch DDP training (gloo, CPU); rank 1 is SIGKILLed mid-run.

Runs ``recoverd run --nproc-per-node 4 --strategies recover-in-place,exit --warm-spares 1`` over
``examples/ddp_train.py``. The survivors keep their processes: their all-reduce fails, they form
the next generation of the process group with the replacement (a warm spare that had imported torch
already), which receives the model and optimizer state from rank 0, and every rank carries on from
the same step. Prints the rank table before and after, what each rank's log says about the
recovery, the time from the kill to the next completed step, and checks that every rank ends with
the same parameters.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from demo import ctl, etcd_endpoint, start_run, status, wait  # examples/demo.py: recoverctl from outside

ROOT = Path(__file__).resolve().parents[1]
JOB = "demo"
STEPS = 400


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="recoverd-demo-torch-"))
    logs = workdir / "logs"
    out_path = workdir / "recoverd-run.log"
    argv = [
        sys.executable, "-m", "recoverd.cli.main", "run", "--job", JOB, "--nproc-per-node", "4",
        "--strategies", "recover-in-place,exit", "--warm-spares", "1", "--log-dir", str(logs),
        "--fault-window", "0.05",
        "--", sys.executable, str(ROOT / "examples" / "ddp_train.py"), "--steps", str(STEPS),
    ]  # fmt: skip
    print("$ recoverd run --job demo --nproc-per-node 4 --strategies recover-in-place,exit --warm-spares 1 \\")
    print(f"      -- python examples/ddp_train.py --steps {STEPS}")
    run = start_run(argv, out_path)
    try:
        endpoint = etcd_endpoint(out_path)
        rank_log = logs / "rank1.log"
        wait(
            "training to reach step 60",
            lambda: rank_log.exists() and "rank 1 step 60 done" in rank_log.read_text(),
            120,
        )
        before = status(endpoint)
        print(ctl(endpoint, "status", JOB))
        victim = next(r for r in before["ranks"] if r["rank"] == 1)
        print(f"$ kill -9 {victim['pid']}    # rank 1, in the middle of training\n")
        killed_at = time.time()
        os.kill(victim["pid"], signal.SIGKILL)

        def next_step_after_kill() -> float | None:
            text = (logs / "rank0.log").read_text()
            times = [float(t) for t in re.findall(r"^rank 0 step \d+ done (\S+)", text, flags=re.M)]
            later = [t for t in times if t > killed_at]
            resumed = re.findall(r"^rank 0: generation 1 formed.*$", text, flags=re.M)
            return later[0] if later and resumed else None

        next_step = wait("the survivors' next step", next_step_after_kill, 60)
        after = status(endpoint)
        print(ctl(endpoint, "status", JOB))
        for rank in range(4):
            text = (logs / f"rank{rank}.log").read_text()
            for line in text.splitlines():
                if "interrupted" in line or "formed" in line or "warm spare" in line or "back from step" in line:
                    print(f"  {line[:160]}")
        print("\n$ recoverctl timeline demo\n")
        print(ctl(endpoint, "timeline", JOB))
        pids_before = {r["rank"]: r["pid"] for r in before["ranks"]}
        pids_after = {r["rank"]: r["pid"] for r in after["ranks"]}
        kept = [r for r in (0, 2, 3) if pids_before[r] == pids_after[r]]
        print(
            f"rank 1: pid {pids_before[1]} -> {pids_after[1]}; ranks {kept} kept their pids; the next step"
            f" completed {1000 * (next_step - killed_at):.0f} ms after the kill."
        )
        code = run.wait(timeout=300)
        finals = set()
        for rank in range(4):
            found = re.search(r"final sha256 (\w+)", (logs / f"rank{rank}.log").read_text())
            finals.add(found.group(1) if found else None)
        same = len(finals) == 1
        print(f"\nthe job finished; recoverd run exited {code}; final parameters identical in every rank: {same}")
        print(f"logs: {logs}")
        return 0 if code == 0 and kept == [0, 2, 3] and len(finals) == 1 and None not in finals else 1
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGTERM)
            run.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
