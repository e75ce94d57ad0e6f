"""A training script that takes part in its own recovery through ``DLRecoverManager`` (no framework).

Run it as the ranks of a recoverd job, like examples/worker.py::

    recoverd run --nproc-per-node 4 --job demo --strategies recover-in-place,exit -- \\
        python examples/client_worker.py --steps 200 --step-time 0.1

Every rank runs ``--steps`` steps of ``--step-time`` seconds, prints each, and exits 0. For recovery
the ranks have two roles (MindCluster style: one controller per job):

* **Rank 0 hosts the job's controller.** A ``DLRecoverManager`` on a background thread runs
  ``init_clusterd``, ``register`` and ``start_subscribe``. While it is registered, the controller is
  the recovery's only participant: the coordinator waits for its answers, the agents stay silent.
  Its handlers: ``stop_train`` pauses rank 0's own loop, then ``report_stop_complete``;
  ``on_global_rank`` offers ``--offer`` (default ``exit``) with ``report_recover_strategy``
  (``recover-in-place`` needs no offer: it comes from the job's policy, ``--strategies``, and the
  agents carry it out; ``recover`` and ``elastic-training`` must be offered, since the job has to
  cope with ranks moving or leaving); ``change_strategy`` reports the outcome with
  ``report_recover_status``, then resumes; ``killMaster`` stops training and the rank exits 1.
* **Every other rank is an observer.** It runs ``observe()`` on a background thread: it receives
  the same signals, but it never registers, so nobody waits for it and it does not report. Its
  handlers: ``stop_train`` pauses its loop, ``change_strategy`` resumes it, ``killMaster`` stops it.

Retry and dump (``--offer retry,dump,...``): on ``changeStrategy retry`` every rank rolls back the
step it last ran and runs it again (no process restarts); on ``changeStrategy dump`` the controller
saves the last completed step to ``--checkpoint-dir``, and after the restart that follows
(dump_exit) every rank resumes from it. ``--fault-at-step N`` makes the controller report a fault of
``--fault-type`` (default ``0``, an uncorrectable memory error: retryable) for itself at step N of
its first run, the way a device-fault handler in a real job would.

Elastic training: on ``changeStrategy downgrade`` every rank drops the fault ranks from its world
(the job goes on with fewer data-parallel replicas), on ``changeStrategy upgrade`` it takes them
back; each step prints the world size it ran with (``rank 0 step 12 world 2``).

The agents still do what no script can do for itself: they detect a rank's exit (the fault) and
restart processes. With ``recover-in-place`` they restart only the faulty ranks: the survivors keep
their processes, pause at stopTrain and resume at changeStrategy. With ``exit`` they restart every
rank. A restarted rank (``RECOVERD_RESTART_COUNT`` > 0) starts like any other and says that it is
the replacement; a new rank 0 registers again as the controller.

If the controller's process dies, its registration lease expires after
``$RECOVERD_CLIENT_LEASE_TTL`` seconds (default 5; ``DLRecoverManager`` reads it) and the agents
answer the recovery in its place. At the end of its steps rank 0 closes the manager, which
deregisters the controller at once.

Environment, set by the agent: ``RANK``, ``RECOVERD_ETCD``, ``RECOVERD_JOB``, ``RECOVERD_PREFIX``,
``RECOVERD_RESTART_COUNT``. See docs/client.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from recoverd.codes import Code
from recoverd.mindcluster import recover_pb2 as pb
from taskd_client import DLRecoverManager

#: ``handler(fault_ranks, signal)``, as DLRecoverManager calls it: fault_ranks is ``{rank: faultType}``.
Handler = Callable[[dict[int, int], pb.ProcessManageSignal], None]

CONTROLLER_RANK = 0
KILLED_EXIT_CODE = 1
CLOSE_JOIN_S = 5.0


def say(rank: int, text: str) -> None:
    print(f"rank {rank}: {text}", flush=True)


@dataclass(frozen=True, slots=True)
class RankEnv:
    """What this process learns from the agent's environment."""

    rank: int
    restart: int
    job: str
    server_addr: str
    prefix: str | None

    @classmethod
    def from_environ(cls) -> RankEnv:
        job, etcd = os.environ.get("RECOVERD_JOB"), os.environ.get("RECOVERD_ETCD")
        if not job or not etcd:
            raise SystemExit("client_worker.py runs as a recoverd rank: RECOVERD_JOB and RECOVERD_ETCD are unset")
        return cls(
            rank=int(os.environ.get("RANK", "0")),
            restart=int(os.environ.get("RECOVERD_RESTART_COUNT", "0")),
            job=job,
            server_addr=etcd_server_addr(etcd),
            prefix=os.environ.get("RECOVERD_PREFIX") or None,
        )

    @property
    def is_controller(self) -> bool:
        return self.rank == CONTROLLER_RANK


def etcd_server_addr(etcd: str) -> str:
    """DLRecoverManager's ``server_addr`` for ``$RECOVERD_ETCD``: its first endpoint, as ``etcd://host:port``."""
    first = etcd.split(",")[0].strip()
    return first if first.startswith(("etcd://", "http://", "https://")) else f"etcd://{first}"


class World:
    """The ranks training runs with; a downgrade drops some, an upgrade brings them back."""

    def __init__(self, size: int) -> None:
        self._lock = threading.Lock()
        self._full = size
        self._out: set[int] = set()

    @property
    def size(self) -> int:
        with self._lock:
            return self._full - len(self._out)

    def change(self, strategy: str, ranks: Sequence[int]) -> bool:
        """Apply a changeStrategy; True when the world changed."""
        with self._lock:
            before = set(self._out)
            if strategy == "downgrade":
                self._out |= set(ranks)
            elif strategy == "upgrade":
                self._out -= set(ranks)
            return self._out != before


class Progress:
    """The last step this rank completed, read by the dump handler on the client's thread."""

    def __init__(self, step: int = -1) -> None:
        self._lock = threading.Lock()
        self._step = step

    @property
    def step(self) -> int:
        with self._lock:
            return self._step

    def done(self, step: int) -> None:
        with self._lock:
            self._step = step


def checkpoint_path(directory: str) -> Path:
    return Path(directory) / "checkpoint.json"


def load_checkpoint(directory: str | None) -> int:
    """The step to start at: one after the saved step, or 0."""
    if not directory or not checkpoint_path(directory).exists():
        return 0
    return int(json.loads(checkpoint_path(directory).read_text())["step"]) + 1


class TrainingGate:
    """The training loop's brake, worked by the signal handlers from the client's thread.

    The loop calls :meth:`between_steps` before each step; a pause takes effect there (a step is
    never cut in half), and :meth:`pause` can wait until it has.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._paused = False
        self._parked = False  # the loop is outside a step: held at a pause, or finished
        self._exit_code: int | None = None
        self._retry = False

    def request_retry(self) -> None:
        """Roll back: the loop runs its last completed step again before going on."""
        with self._cond:
            self._retry = True

    def take_retry(self) -> bool:
        with self._cond:
            retry, self._retry = self._retry, False
            return retry

    def pause(self, timeout_s: float | None = None) -> bool:
        """Hold the loop at its next step boundary; with a timeout, True once it is held there."""
        with self._cond:
            self._paused = True
            self._cond.notify_all()
            return timeout_s is None or self._cond.wait_for(lambda: self._parked, timeout_s)

    def resume(self) -> bool:
        """Let the loop go on; True if it was paused."""
        with self._cond:
            was_paused, self._paused = self._paused, False
            self._cond.notify_all()
            return was_paused

    def abort(self, exit_code: int) -> None:
        """End training at the next step boundary (or at once, if it is held) with ``exit_code``."""
        with self._cond:
            self._exit_code = exit_code
            self._cond.notify_all()

    def between_steps(self) -> int | None:
        """Wait while paused; the exit code once aborted, else None (go on)."""
        with self._cond:
            self._parked = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._paused or self._exit_code is not None)
            self._parked = self._exit_code is not None
            return self._exit_code

    def finish(self) -> None:
        with self._cond:
            self._parked = True
            self._cond.notify_all()


# ---------------------------------------------------------------------- handlers


def follower_handlers(rank: int, gate: TrainingGate, world: World) -> dict[str, Handler]:
    """What every rank does with the signals: pause at stopTrain, resume at changeStrategy (a
    downgrade or upgrade changes the world first), stop at killMaster."""

    def stop_train(fault_ranks: dict[int, int], _signal: pb.ProcessManageSignal) -> None:
        gate.pause()
        say(rank, f"paused: stopTrain for fault ranks {fault_ranks}")

    def change_strategy(fault_ranks: dict[int, int], signal: pb.ProcessManageSignal) -> None:
        # A real job would rebuild its communicators here before going on.
        if signal.changeStrategy == "retry":
            gate.request_retry()
        if world.change(signal.changeStrategy, sorted(fault_ranks)):
            say(rank, f"world {world.size}: {signal.changeStrategy} of ranks {sorted(fault_ranks)}")
        resumed = gate.resume()
        say(rank, f"{'resumed' if resumed else 'running'}: changeStrategy {signal.changeStrategy} {signal.extraParams}")

    def fault_nodes_restart(fault_ranks: dict[int, int], _signal: pb.ProcessManageSignal) -> None:
        say(rank, f"the agents restart only ranks {sorted(fault_ranks)}")

    def kill_master(_fault_ranks: dict[int, int], _signal: pb.ProcessManageSignal) -> None:
        say(rank, "killMaster: the job failed, stopping")
        gate.abort(KILLED_EXIT_CODE)

    return {
        "stop_train": stop_train,
        "change_strategy": change_strategy,
        "fault_nodes_restart": fault_nodes_restart,
        "killMaster": kill_master,
    }


def controller_handlers(
    rank: int,
    gate: TrainingGate,
    world: World,
    manager: DLRecoverManager,
    stop_timeout_s: float,
    offer: Sequence[str] = ("exit",),
    progress: Progress | None = None,
    checkpoint_dir: str | None = None,
) -> dict[str, Handler]:
    """The follower's handlers plus the controller's answers, one per phase of the recovery."""
    handlers = follower_handlers(rank, gate, world)
    resume = handlers["change_strategy"]

    def stop_train(fault_ranks: dict[int, int], _signal: pb.ProcessManageSignal) -> None:
        stopped = gate.pause(stop_timeout_s)
        code, message = (0, "") if stopped else (Code.CLIENT_ERROR, f"rank {rank} still in a step")
        answer = manager.report_stop_complete(code, message, fault_ranks)
        say(rank, f"paused: stopTrain for fault ranks {fault_ranks}; stop-complete {code} answered {answer}")

    def on_global_rank(fault_ranks: dict[int, int], _signal: pb.ProcessManageSignal) -> None:
        answer = manager.report_recover_strategy(fault_ranks, list(offer))
        say(rank, f"globalFault for {fault_ranks}: offered {list(offer)}, answered {answer}")

    def change_strategy(fault_ranks: dict[int, int], signal: pb.ProcessManageSignal) -> None:
        code, message = 0, ""
        if signal.changeStrategy == "dump":
            code, message = save_checkpoint(rank, checkpoint_dir, progress)
        answer = manager.report_recover_status(code, message, fault_ranks, signal.changeStrategy)
        say(rank, f"recover status {code} for {signal.changeStrategy} answered {answer}")
        resume(fault_ranks, signal)

    return {**handlers, "stop_train": stop_train, "on_global_rank": on_global_rank, "change_strategy": change_strategy}


def save_checkpoint(rank: int, directory: str | None, progress: Progress | None) -> tuple[int, str]:
    """The dying-gasp checkpoint: the last completed step. (code, message) for the recover status."""
    if not directory or progress is None:
        return Code.DUMP_ERROR, "no --checkpoint-dir to save to"
    try:
        path = checkpoint_path(directory)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"step": progress.step}))
        os.replace(tmp, path)
    except OSError as err:
        return Code.DUMP_ERROR, f"checkpoint not saved: {err}"
    say(rank, f"dump: saved step {progress.step} to {path}")
    return 0, ""


# ---------------------------------------------------------------------- the client thread


def serve_as_controller(manager: DLRecoverManager, rank: int) -> None:
    """Init, register, then answer the job's recoveries until killMaster or close()."""
    if not manager.init_clusterd():
        say(rank, "the job allows only exit: no controller, the agents answer recoveries")
        return
    status = manager.register(manager.info)
    if status.code != Code.OK:
        say(rank, f"register refused ({status.code} {status.info}): the agents answer recoveries")
        return
    say(rank, f"registered as the controller of job {manager.info.jobId} (client {manager.client_id})")
    manager.start_subscribe()


def serve_as_observer(manager: DLRecoverManager, rank: int) -> None:
    """Follow the job's recoveries without taking part in them, until killMaster or close()."""
    say(rank, f"observing the recoveries of job {manager.info.jobId}")
    manager.observe()


def start_client(
    me: RankEnv,
    gate: TrainingGate,
    world: World,
    stop_timeout_s: float,
    offer: Sequence[str] = ("exit",),
    progress: Progress | None = None,
    checkpoint_dir: str | None = None,
) -> tuple[DLRecoverManager, threading.Thread]:
    """This rank's DLRecoverManager, serving on a daemon thread (handlers run on that thread)."""
    role = "controller" if me.is_controller else "observer"
    manager = DLRecoverManager(pb.ClientInfo(jobId=me.job, role=role), me.server_addr, prefix=me.prefix)
    if me.is_controller:
        handlers = controller_handlers(me.rank, gate, world, manager, stop_timeout_s, offer, progress, checkpoint_dir)
        serve = serve_as_controller
    else:
        handlers = follower_handlers(me.rank, gate, world)
        serve = serve_as_observer
    for action, handler in handlers.items():
        manager.set_handler(action, handler)

    def run() -> None:
        try:
            serve(manager, me.rank)
        except Exception:
            logging.getLogger(__name__).exception("the recovery client failed; training goes on without it")
            manager.close()  # a controller that cannot answer must not stay registered

    thread = threading.Thread(target=run, name=f"recovery-{role}", daemon=True)
    thread.start()
    return manager, thread


# ---------------------------------------------------------------------- training


def train(
    rank: int,
    steps: int,
    step_time: float,
    gate: TrainingGate,
    world: World,
    progress: Progress,
    start: int = 0,
    fault_at: tuple[int, Callable[[], None]] | None = None,
) -> int:
    step = start
    while step < steps:
        exit_code = gate.between_steps()
        if exit_code is not None:
            say(rank, f"stopped before step {step}, exit {exit_code}")
            return exit_code
        if gate.take_retry() and step > start:
            step -= 1
            say(rank, f"step {step} rolled back: running it again (retry)")
        if fault_at is not None and fault_at[0] == step:
            fault_at[1]()
            fault_at = None
        time.sleep(step_time)
        print(f"rank {rank} step {step} world {world.size}", flush=True)
        progress.done(step)
        step += 1
    gate.finish()
    print(f"rank {rank} done", flush=True)
    return 0


def _exit_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through main's finally: the manager is closed


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-time", type=float, default=0.1)
    parser.add_argument(
        "--offer",
        type=lambda text: tuple(s.strip() for s in text.split(",") if s.strip()),
        default=("exit",),
        help="strategies the controller reports it supports (comma-separated; default: exit)",
    )
    parser.add_argument("--checkpoint-dir", default=None, help="where a dump saves, and where a restart resumes from")
    parser.add_argument("--fault-at-step", type=int, default=None, help="the controller reports a fault at this step")
    parser.add_argument("--fault-type", default="0", choices=("0", "1", "2"), help="its fault type (default 0: UCE)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    me = RankEnv.from_environ()
    logging.basicConfig(level=logging.WARNING, format=f"rank {me.rank} %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    print(
        f"rank {me.rank} pid {os.getpid()} world {os.environ.get('WORLD_SIZE')} generation"
        f" {os.environ.get('RECOVERD_GENERATION')} restart {me.restart}",
        flush=True,
    )
    if me.restart:
        say(me.rank, f"the replacement (restart {me.restart}) starts")
    gate = TrainingGate()
    world = World(int(os.environ.get("WORLD_SIZE", "1")))
    start = load_checkpoint(args.checkpoint_dir)
    if start:
        say(me.rank, f"resumed from the checkpoint: starting at step {start}")
    progress = Progress(start - 1)
    manager, thread = start_client(
        me, gate, world, max(1.0, 2 * args.step_time), args.offer, progress, args.checkpoint_dir
    )
    fault_at = None
    if args.fault_at_step is not None and me.is_controller and not me.restart:
        fault_type = int(args.fault_type)

        def report() -> None:
            code = manager.report_process_fault({me.rank: fault_type})
            say(me.rank, f"fault type {fault_type} at step {args.fault_at_step} reported: {code}")

        fault_at = (args.fault_at_step, report)
    try:
        return train(me.rank, args.steps, args.step_time, gate, world, progress, start, fault_at)
    finally:
        manager.close()  # deregisters the controller: the agents answer for the job from now on
        thread.join(CLOSE_JOIN_S)


if __name__ == "__main__":
    sys.exit(main())
