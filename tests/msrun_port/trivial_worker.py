"""A worker script for msrun tests that needs no MindSpore.

msrun runs the same script as the scheduler (``MS_ROLE=MS_SCHED``) and as every worker:

* **scheduler**: prints one line, then stays alive like MindSpore's scheduler would (it waits for
  the cluster) until killed, at most ``MSRUN_TEST_SCHED_S`` seconds (default 120), and exits 0.
  It never counts as a rank.
* **worker**: prints ``RANK_ID``/``DEVICE_ID``, runs ``--steps`` steps of ``--step-time`` seconds
  (one line each) and exits with ``--exit-code``. With ``--fail-rank R`` the worker on local rank R
  (``DEVICE_ID``) exits 3 at once on its first attempt only; later attempts run normally. The first
  attempt leaves a marker file ``.msrun_fail_rank_<R>`` in the marker directory: ``--marker-dir``,
  else ``$MSRUN_TEST_MARKER_DIR``, else the directory of the worker's log (its stdout), else the
  working directory.

Every line is flushed, so a log can be read as soon as the process has exited.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import time
from collections.abc import Sequence
from pathlib import Path

FAIL_EXIT_CODE = 3


def _marker_dir(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    from_env = os.environ.get("MSRUN_TEST_MARKER_DIR")
    if from_env:
        return Path(from_env)
    try:  # msrun sends stdout to <log_dir>/worker_<rank>.log
        if stat.S_ISREG(os.fstat(1).st_mode):
            return Path(os.readlink("/proc/self/fd/1")).parent
    except OSError:
        pass
    return Path.cwd()


def _first_attempt(marker: Path) -> bool:
    """True exactly once per marker: the first process to create it wins."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    pid = os.getpid()
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        print(f"scheduler pid={pid} MS_ROLE=MS_SCHED RANK_ID={os.environ.get('RANK_ID')}", flush=True)
        time.sleep(float(os.environ.get("MSRUN_TEST_SCHED_S", "120")))
        return 0

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--step-time", type=float, default=0.1)
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--marker-dir", default=None)
    args = parser.parse_args(argv)

    rank_id = os.environ.get("RANK_ID")
    device_id = os.environ.get("DEVICE_ID")
    print(
        f"worker pid={pid} RANK_ID={rank_id} DEVICE_ID={device_id} MS_ROLE={os.environ.get('MS_ROLE')} "
        f"MS_NODE_ID={os.environ.get('MS_NODE_ID')}",
        flush=True,
    )
    if args.fail_rank is not None and device_id == str(args.fail_rank):
        if _first_attempt(_marker_dir(args.marker_dir) / f".msrun_fail_rank_{args.fail_rank}"):
            print(f"failing on first attempt: exit {FAIL_EXIT_CODE}", flush=True)
            return FAIL_EXIT_CODE
    for step in range(1, args.steps + 1):
        time.sleep(args.step_time)
        print(f"RANK_ID={rank_id} DEVICE_ID={device_id} step {step}/{args.steps}", flush=True)
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
