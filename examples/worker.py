"""A light rank process for demos and tests: no framework, no client.

Each rank runs ``--steps`` steps of ``--step-time`` seconds and exits 0. It prints its identity
(rank, pid, generation, restart count) at start so logs show who came back. ``--fail-rank R``
makes rank R exit with code 3 at start on every attempt (a crash loop); ``--fail-once-rank R``
makes it fail once, at step ``--fail-at``, on its first attempt only. ``--heartbeat`` reports each
step to the agent (``taskd_client.heartbeat``); ``--hang-rank R`` makes rank R deadlock at step
``--fail-at`` on its first attempt (hang detection tests); ``--slow-rank R`` makes its steps
``--slow-factor`` times longer.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time


def _spawn_daemon(rank: int) -> None:
    """Double-fork a process in its own session: it escapes the rank's process group (tests only)."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execvp(sys.executable, [sys.executable, "-c", f"import time; time.sleep(300)  # daemon of rank {rank}"])
        os._exit(0)
    os.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-time", type=float, default=0.1)
    parser.add_argument("--fail-rank", type=int, default=None, help="this rank exits 3 at start, every attempt")
    parser.add_argument("--fail-once-rank", type=int, default=None, help="this rank exits 3 once, at --fail-at")
    parser.add_argument("--fail-at", type=int, default=2)
    parser.add_argument("--spawn-daemon", action="store_true", help="leave a setsid() grandchild behind (tests)")
    parser.add_argument("--start-file", default=None, help="wait until this file exists before the first step (tests)")
    parser.add_argument("--heartbeat", action="store_true", help="report each step to the agent (hang detection)")
    parser.add_argument("--hang-rank", type=int, default=None, help="this rank deadlocks once, at --fail-at")
    parser.add_argument("--slow-rank", type=int, default=None, help="this rank's steps take --slow-factor longer")
    parser.add_argument("--slow-factor", type=float, default=5.0)
    args = parser.parse_args()
    heartbeat = None
    if args.heartbeat:
        from taskd_client.progress import heartbeat
    rank = int(os.environ.get("RANK", "0"))
    restart = int(os.environ.get("RECOVERD_RESTART_COUNT", "0"))
    print(
        f"rank {rank} pid {os.getpid()} world {os.environ.get('WORLD_SIZE')} generation"
        f" {os.environ.get('RECOVERD_GENERATION')} restart {restart}",
        flush=True,
    )
    if args.spawn_daemon:
        _spawn_daemon(rank)
    if args.fail_rank == rank:
        print(f"rank {rank}: failing at start (--fail-rank)", file=sys.stderr, flush=True)
        return 3
    while args.start_file and not os.path.exists(args.start_file):
        time.sleep(0.02)
    for step in range(args.steps):
        if args.fail_once_rank == rank and restart == 0 and step == args.fail_at:
            print(f"rank {rank}: failing at step {step} (--fail-once-rank)", file=sys.stderr, flush=True)
            return 3
        if args.hang_rank == rank and restart == 0 and step == args.fail_at:
            print(f"rank {rank}: deadlocking at step {step} (--hang-rank)", file=sys.stderr, flush=True)
            threading.Event().wait()
        time.sleep(args.step_time * (args.slow_factor if args.slow_rank == rank else 1.0))
        print(f"rank {rank} step {step}", flush=True)
        if heartbeat is not None:
            heartbeat(step)
    if heartbeat is not None:
        from taskd_client.progress import done

        done()
    print(f"rank {rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
