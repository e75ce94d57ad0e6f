"""`make demo`: a 4-rank job loses rank 2 to SIGKILL and only rank 2 is restarted.

Runs ``recoverd run --nproc-per-node 4 --strategies recover-in-place,exit --independent-ranks``
(embedded etcd, coordinator, strategy selector and node agent in one command) over
``examples/worker.py``, whose ranks never talk to each other (ADR 0041), waits for
the ranks, kills rank 2 with SIGKILL, then prints what an operator would look at: the rank table
before and after, the incident's events and its timeline phase by phase. The job then finishes and
``recoverd run`` exits 0. No torch needed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
JOB = "demo"


def ctl(endpoint: str, *args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "recoverd.cli.ctl", "--etcd", endpoint, *args],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip


def status(endpoint: str) -> dict[str, Any]:
    return json.loads(ctl(endpoint, "status", JOB, "--json"))  # type: ignore[no-any-return]


def wait(what: str, predicate: Any, timeout: float = 30.0) -> Any:
    # The demo watches from outside, like an operator re-running recoverctl.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = predicate()
        except subprocess.CalledProcessError:
            result = None
        if result:
            return result
        time.sleep(0.05)
    raise SystemExit(f"demo: timed out waiting for {what}")


def start_run(argv: list[str], out_path: Path) -> subprocess.Popen[bytes]:
    """Start ``recoverd run`` with its output in ``out_path``."""
    with open(out_path, "w") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "GRPC_VERBOSITY": "ERROR"}
        )


def etcd_endpoint(out_path: Path) -> str:
    """The embedded etcd's address, from the line ``recoverd run`` prints first."""
    return str(
        wait(
            "the embedded etcd",
            lambda: next(
                (
                    w.split("etcd ", 1)[1].split(",")[0]
                    for w in out_path.read_text().splitlines()
                    if w.startswith("recoverd run:")
                ),
                None,
            ),
        )
    )


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="recoverd-demo-"))
    out_path = workdir / "recoverd-run.log"
    argv = [
        sys.executable, "-m", "recoverd.cli.main", "run", "--job", JOB, "--nproc-per-node", "4",
        "--strategies", "recover-in-place,exit", "--independent-ranks", "--log-dir", str(workdir / "logs"),
        "--fault-window", "0.05", "--", sys.executable, str(ROOT / "examples" / "worker.py"),
        "--steps", "40", "--step-time", "0.1",
    ]  # fmt: skip
    # worker.py's ranks never talk to each other: one restarted alone goes on with no client (ADR 0041).
    print(
        "$ recoverd run --job demo --nproc-per-node 4 --strategies recover-in-place,exit --independent-ranks"
        " -- python worker.py"
    )
    run = start_run(argv, out_path)
    try:
        endpoint = etcd_endpoint(out_path)
        before = wait(
            "4 running ranks",
            lambda: (
                (s := status(endpoint))["ranks"]
                and len(s["ranks"]) == 4
                and all(r["state"] == "RUNNING" for r in s["ranks"])
                and s
            ),
        )
        print(f"\nembedded etcd at {endpoint}; ranks running:\n")
        print(ctl(endpoint, "status", JOB))

        victim = next(r for r in before["ranks"] if r["rank"] == 2)
        print(f"$ kill -9 {victim['pid']}    # rank 2\n")
        killed_at = time.time()
        os.kill(victim["pid"], signal.SIGKILL)

        after = wait(
            "the recovery", lambda: (s := status(endpoint))["recovery"] and s["recovery"]["phase"] == "DONE" and s
        )
        took = time.time() - killed_at
        print(ctl(endpoint, "status", JOB))
        print("$ recoverctl events demo\n")
        print(ctl(endpoint, "events", JOB))
        print("$ recoverctl timeline demo\n")
        print(ctl(endpoint, "timeline", JOB))

        pids_before = {r["rank"]: r["pid"] for r in before["ranks"]}
        pids_after = {r["rank"]: r["pid"] for r in after["ranks"]}
        kept = [r for r in (0, 1, 3) if pids_before[r] == pids_after[r]]
        print(
            f"rank 2: pid {pids_before[2]} -> {pids_after[2]}; ranks {kept} kept their pids;"
            f" recovered {took * 1000:.0f} ms after the kill (as seen by polling recoverctl)."
        )
        code = run.wait(timeout=60)
        print(f"\nthe job finished; recoverd run exited {code}. Logs: {workdir}")
        ok = code == 0 and kept == [0, 1, 3] and pids_after[2] != pids_before[2]
        return 0 if ok else 1
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGTERM)
            run.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
