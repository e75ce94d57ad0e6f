"""A test double of MindSpore 2.10.0 msrun's ``_ProcessManager``, written from the compatibility contract.

This is **test code**. It reproduces the behaviour that ``/work/shared/reference/msrun-contract.md``
documents for ``mindspore-2.10.0`` (``mindspore/parallel/cluster/process_entity/_api.py``,
"MS ``_api.py``" below), so that recoverd's ``MSRunPlugin`` can be driven exactly the way msrun
drives it without installing MindSpore. No MindSpore code is copied: every method is re-written
from the contract's description and observations. The bugs are reproduced on purpose, because the
plugin has to cope with the real launcher:

* no locking: the four callbacks are plain bound methods (the plugin must serialise its calls);
* ``KILL_WORKER`` takes OS PIDs; unknown PIDs (a rank number passed by mistake) are a logged no-op,
  and it always returns 0;
* ``MONITOR`` reports every non-zero exit or kill as 300 (``poll()`` reaps first, so
  ``psutil.pid_exists`` is false and the real code is lost), keeps stale PIDs until a rank is
  restarted, and shows only the newest copy of a rank;
* ``START_WORKER_LIST`` neither de-duplicates nor range-checks (an out-of-range rank spawns a stray
  worker and then raises ``KeyError``);
* worker variables are written into the manager's **own** ``os.environ`` before each spawn, and the
  scheduler's ``MS_ROLE=MS_SCHED``/``RANK_ID=0`` leak the same way;
* worker logs are opened with mode ``"w"``, so a restart truncates the previous attempt's log;
* nothing is cleaned up when the plugin's ``start()`` ends.

What each part mirrors (line numbers are MS 2.10.0's, as cited by the contract):

* ``_export_node_env``: the variables every node exports, ``_Node.run`` and subclasses,
  ``_api.py:96-121`` (``MS_TOPO_TIMEOUT`` included, as section 8 lists it);
* ``start_scheduler``: ``_ProcessManager.start_scheduler`` (``RANK_ID=0`` at ``_api.py:284``);
* ``_start_single_worker``, ``_node_id``: ``_start_single_worker``, ``_api.py:293-322``, and the
  node id and log follower helpers, ``_api.py:567-586``;
* ``callbacks``, ``register_with_plugin``, ``enable_mindx``: ``_check_taskd``, ``_api.py:228-248``,
  and the plugin path of ``RSCPluginHandle.register_callback``, ``utils.py:165-191``;
* ``run``: ``_ProcessManager.run``, ``_api.py:250-276``, with ``RSCPluginHandle.start``,
  ``utils.py:193-202``; ``run_to_exit_status``: msrun's exit status, ``run.py:247-262``;
* ``kill_all_workers``: ``_api.py:444-454``; ``kill_single_worker``: ``_api.py:456-476``;
* ``kill_workers`` (KILL_WORKER): ``_api.py:478-490``;
* ``monitor_rank_status`` (MONITOR): ``_api.py:492-532``;
* ``start_all_workers`` (START_ALL_WORKER): ``_api.py:534-548``;
* ``start_worker_list`` (START_WORKER_LIST): ``_api.py:550-565``;
* ``start_workers``, ``join_processes``: msrun's plain (non-mindx) mode, simplified (see below);
* ``cleanup``: **test only**; msrun never cleans up.

Log texts and the ``TypeError`` message follow the contract's quotes; where it gives none they are
plausible stand-ins, and no test of the plugin should depend on them.

Deliberate differences, none of them visible to a plugin:

* the command is ``[sys.executable, script, *args]`` instead of ``python`` looked up on ``PATH``
  (no ``taskset``/``numactl`` prefix), so workers run in the test's virtual environment;
* workers get their own session with ``start_new_session=True``, which is what
  ``preexec_fn=os.setsid`` does, without ``preexec_fn``'s hazards in a threaded test process;
* the master node is decided by ``is_master`` (default: ``node_rank`` is -1 or 0) rather than by
  comparing ``master_addr`` with the host's addresses, so one host can play several nodes;
* plain mode always joins the workers (real msrun joins only with ``--join True``), and
  :func:`fake_msrun.main` then calls :meth:`ProcessManager.cleanup`, because the trivial
  scheduler, unlike MindSpore's, does not exit by itself when the workers are done;
* ``tail_cgn_processes`` holds ``None`` for a worker without a follower (no ``join``), so it stays
  index-aligned with ``cgn_processes``;
* :meth:`cleanup` and the private bookkeeping behind it exist only so tests leave no process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import psutil

log = logging.getLogger("msrun_port")

KILL_WORKER = "KILL_WORKER"
START_ALL_WORKER = "START_ALL_WORKER"
START_WORKER_LIST = "START_WORKER_LIST"
MONITOR = "MONITOR"
CALLBACK_ORDER = (KILL_WORKER, START_ALL_WORKER, START_WORKER_LIST, MONITOR)
"""The order in which msrun passes the callbacks to ``register_callbacks`` (contract section 3)."""

STATUS_NOT_STARTED = 200
STATUS_FAILED = 300

_TAIL = shutil.which("tail") or "/usr/bin/tail"
_CLEANUP_WAIT_S = 5.0
#: How long cleanup waits for a scheduler that has not printed its first line yet (a loaded machine).
_SCHEDULER_START_S = 30.0
_JOIN_POLL_S = 0.1


class Plugin(Protocol):
    """What msrun needs from a TaskD ``MSRunPlugin``."""

    def register_callbacks(self, operator: str, func: Callable[..., Any]) -> None: ...

    def start(self) -> Any: ...


class Handler(Protocol):
    """Whatever ``run`` starts in mindx mode: a plugin, or an agent handle."""

    def start(self) -> Any: ...


class _Spawned:
    """Test-only record of one spawned process, so ``cleanup`` can kill and reap it.

    The ``Popen`` is held weakly: msrun drops its references when it clears its lists, and CPython
    then reaps a dead child (or queues a running one for ``subprocess._cleanup``). Holding it
    strongly would keep zombies around longer than under the real msrun. ``psutil.Process``
    remembers the create time, so a recycled PID is never killed by mistake.
    """

    def __init__(self, popen: subprocess.Popen[bytes], kind: str) -> None:
        self.kind = kind  # "worker" (own process group), "tail" or "scheduler"
        self.pid = popen.pid
        self._popen = weakref.ref(popen)
        try:
            self._proc: psutil.Process | None = psutil.Process(popen.pid)
        except psutil.Error:  # cannot happen for an unreaped child; be safe
            self._proc = None

    def alive(self) -> bool:
        """True while the process exists (a zombie counts) and is still the one we started."""
        return self._proc is not None and self._proc.is_running()

    def kill(self) -> None:
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.kind == "worker":
                os.killpg(self.pid, signal.SIGKILL)  # its own session: pgid == pid
            else:
                os.kill(self.pid, signal.SIGKILL)

    def reap(self, timeout_s: float) -> None:
        popen = self._popen()
        if popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=timeout_s)
        elif self._proc is not None and self._proc.is_running():
            with contextlib.suppress(psutil.Error, ChildProcessError):
                self._proc.wait(timeout=timeout_s)


class ProcessManager:
    """msrun's ``_ProcessManager`` for one node: scheduler, workers and the four TaskD callbacks.

    Attribute names follow msrun: ``cgn_processes`` (running workers, in spawn order),
    ``tail_cgn_processes`` (their ``tail -f`` followers, ``None`` without ``join``; kept
    index-aligned with ``cgn_processes``), ``proc_rank_map`` (local rank to the newest ``Popen``
    of that rank, never cleared) and ``msn_process`` (the scheduler).

    Spawning writes worker and scheduler variables into this process's ``os.environ`` (msrun's
    leak); tests should snapshot and restore the environment around it.
    """

    def __init__(
        self,
        script: str,
        script_args: Sequence[str],
        *,
        worker_num: int,
        local_worker_num: int,
        node_rank: int = -1,
        log_dir: str | os.PathLike[str],
        master_addr: str = "127.0.0.1",
        master_port: int,
        join: bool = False,
        cluster_time_out: int = 600,
        is_master: bool | None = None,
    ) -> None:
        if local_worker_num < 1 or worker_num < 1:
            raise ValueError("worker_num and local_worker_num must be positive")
        if local_worker_num > worker_num:
            raise ValueError(f"local_worker_num ({local_worker_num}) must not exceed worker_num ({worker_num})")
        self.script = str(script)
        self.script_args = list(script_args)
        self.worker_num = worker_num
        self.local_worker_num = local_worker_num
        self.node_rank = node_rank
        self.log_dir = Path(log_dir)
        self.master_addr = master_addr
        self.master_port = master_port
        self.join = join
        self.cluster_time_out = cluster_time_out
        self.is_master = node_rank in (-1, 0) if is_master is None else is_master
        self.log_dir.mkdir(parents=True, exist_ok=True)

        self.cgn_processes: list[subprocess.Popen[bytes]] = []
        self.tail_cgn_processes: list[subprocess.Popen[bytes] | None] = []
        self.proc_rank_map: dict[int, subprocess.Popen[bytes]] = {}
        self.msn_process: subprocess.Popen[bytes] | None = None
        self.handler: Handler | None = None  # set once mindx controls the processes

        self._spawned: list[_Spawned] = []  # test-only bookkeeping for cleanup()

    # ------------------------------------------------------------------ registration and run

    def callbacks(self) -> dict[str, Callable[..., Any]]:
        """The dict ``_check_taskd`` hands to ``RSCPluginHandle.register_callback``, in msrun's order."""
        return {
            KILL_WORKER: self.kill_workers,
            START_ALL_WORKER: self.start_all_workers,
            START_WORKER_LIST: self.start_worker_list,
            MONITOR: self.monitor_rank_status,
        }

    def register_with_plugin(self, plugin: Plugin) -> None:
        """Register the four callbacks with ``plugin`` and switch to mindx mode.

        Mirrors ``utils.py:176-177`` followed by ``_api.py:240-248``: ``register_callbacks(name,
        func)`` four times, in the order KILL_WORKER, START_ALL_WORKER, START_WORKER_LIST, MONITOR,
        then ``MS_ENABLE_RECOVERY=1`` in msrun's environment (every later scheduler and worker
        inherits it). An exception from ``register_callbacks`` propagates and leaves the manager in
        plain mode; real msrun turns it into "process controlled by msrun" (``fake_msrun`` does too).
        """
        for name, func in self.callbacks().items():
            plugin.register_callbacks(name, func)
        self.enable_mindx(plugin)

    def enable_mindx(self, handler: Handler) -> None:
        """Second half of ``_check_taskd`` on success (``_api.py:244-248``)."""
        log.info("Mindx enabled, process controlled by mindx.")
        os.environ["MS_ENABLE_RECOVERY"] = "1"
        self.handler = handler

    def run(self, plugin: Handler | None = None) -> None:
        """``_ProcessManager.run`` (``_api.py:250-276``).

        Exports ``RANK_SIZE``, starts the scheduler on the master node, then in mindx mode calls
        only ``handler.start()`` and returns whatever happens (its return value is ignored; an
        exception or ``SystemExit`` propagates). Without a handler it runs plain msrun: start all
        workers and join them (raising ``RuntimeError`` when one fails).

        ``plugin``, when given and not registered yet, is registered first: real msrun registers
        in ``__init__``, which also comes before anything ``run`` does.
        """
        if plugin is not None and plugin is not self.handler:
            if not hasattr(plugin, "register_callbacks"):
                raise TypeError("run(plugin) needs an MSRunPlugin, or a handler set by enable_mindx()")
            self.register_with_plugin(plugin)  # type: ignore[arg-type]
        os.environ["RANK_SIZE"] = str(self.worker_num)
        if self.is_master:
            self.start_scheduler()
        if self.handler is not None:
            self.handler.start()  # RSCPluginHandle.start: return value unused, no cleanup
            return
        self.start_workers()
        self.join_processes()

    def run_to_exit_status(self, plugin: Handler | None = None) -> int:
        """``run`` and the exit status msrun would give (``run.py``): return 0, exception 1, exit(n) n."""
        try:
            self.run(plugin)
        except SystemExit as exc:
            code = exc.code
            if code is None:
                return 0
            if isinstance(code, int):
                return code
            return 1  # like the interpreter: a message goes to stderr and the status is 1
        except Exception:
            log.exception("msrun would exit 1 with this traceback")
            return 1
        return 0

    # ------------------------------------------------------------------ spawning

    def _node_id(self, local_rank: int) -> int | None:
        """Node id of a worker (contract section 8): its global rank when msrun knows it, else None."""
        if self.local_worker_num == self.worker_num:
            return local_rank
        if self.node_rank >= 0:
            return self.node_rank * self.local_worker_num + local_rank
        return None

    def _command(self) -> list[str]:
        return [sys.executable, self.script, *self.script_args]

    def _export_node_env(self) -> None:
        """Variables every node exports into msrun's own environment before it spawns (``_api.py:96-121``)."""
        os.environ["MS_WORKER_NUM"] = str(self.worker_num)
        os.environ["MS_SCHED_HOST"] = self.master_addr
        os.environ["MS_SCHED_PORT"] = str(self.master_port)
        os.environ["MS_TOPO_TIMEOUT"] = str(self.cluster_time_out)

    def start_scheduler(self) -> subprocess.Popen[bytes]:
        """Run the user's script as the scheduler: ``MS_ROLE=MS_SCHED``, ``RANK_ID=0``, ``scheduler.log``.

        The variables are set in ``os.environ`` and stay there (the leak the plugin sees). The
        scheduler stays in msrun's process group; no callback ever touches it.
        """
        os.environ["RANK_ID"] = "0"
        self._export_node_env()
        os.environ["MS_ROLE"] = "MS_SCHED"
        with open(self.log_dir / "scheduler.log", "w") as out:
            process = subprocess.Popen(self._command(), stdout=out, stderr=subprocess.STDOUT)
        self._spawned.append(_Spawned(process, "scheduler"))
        self.msn_process = process
        log.info("Start scheduler process, pid: %d, log: %s", process.pid, self.log_dir / "scheduler.log")
        return process

    def _start_single_worker(self, local_rank: int) -> subprocess.Popen[bytes]:
        """``_start_single_worker`` (``_api.py:293-322``): no range check, no de-duplication."""
        node_id = self._node_id(local_rank)
        os.environ["DEVICE_ID"] = str(local_rank)
        if node_id is not None:
            os.environ["RANK_ID"] = str(node_id)
        self._export_node_env()
        if node_id is not None:
            os.environ["MS_NODE_ID"] = str(node_id)
        os.environ["MS_ROLE"] = "MS_WORKER"
        log_file = self.log_dir / f"worker_{local_rank}.log"
        with open(log_file, "w") as out:  # "w": a restart truncates the previous attempt's log
            process = subprocess.Popen(self._command(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._spawned.append(_Spawned(process, "worker"))
        tail: subprocess.Popen[bytes] | None = None
        if self.join:
            tail = subprocess.Popen([_TAIL, "-f", str(log_file)])
            self._spawned.append(_Spawned(tail, "tail"))
        self.cgn_processes.append(process)
        self.tail_cgn_processes.append(tail)
        self.proc_rank_map[local_rank] = process
        log.info("Start worker process with rank id: %d, pid: %d, log: %s", local_rank, process.pid, log_file)
        return process

    def start_workers(self) -> None:
        """Plain mode: spawn local ranks ``0..local_worker_num-1``."""
        for local_rank in range(self.local_worker_num):
            self._start_single_worker(local_rank)

    def join_processes(self) -> None:
        """Plain mode: wait for every worker; on the first failure SIGKILL the rest and raise.

        Simplified from msrun's ``join_processes`` (no SIGINT handler, no log analysis). It does not
        wait for the scheduler; ``fake_msrun`` stops it with :meth:`cleanup` afterwards.
        """
        failed: subprocess.Popen[bytes] | None = None
        while failed is None:
            codes = [p.poll() for p in self.cgn_processes]
            failed = next((p for p, code in zip(self.cgn_processes, codes, strict=True) if code), None)
            if failed is None and all(code == 0 for code in codes):
                log.info("All workers successfully exit!")
                return
            if failed is None:
                time.sleep(_JOIN_POLL_S)  # msrun polls too; there is no event to wait for
        log.error("Worker process %d exit with exception.", failed.pid)
        for p in self.cgn_processes:
            if p.poll() is None:
                os.killpg(os.getpgid(p.pid), signal.SIGKILL)
        raise RuntimeError(f"Distributed job exited with exception. Please check logs in directory: {self.log_dir}.")

    # ------------------------------------------------------------------ the four callbacks

    def kill_all_workers(self) -> None:
        """``kill_all_workers`` (``_api.py:444-454``): SIGKILL every running worker's group and every
        log follower, then clear ``cgn_processes`` and ``tail_cgn_processes`` but not ``proc_rank_map``."""
        for p in self.cgn_processes:
            if p.poll() is None:
                os.killpg(os.getpgid(p.pid), signal.SIGKILL)
        for tail in self.tail_cgn_processes:
            if tail is not None:
                tail.kill()
        self.cgn_processes.clear()
        self.tail_cgn_processes.clear()

    def kill_single_worker(self, pid: int) -> None:
        """``kill_single_worker`` (``_api.py:456-476``): the first running worker with ``pid``."""
        for i, p in enumerate(self.cgn_processes):
            if p.pid == pid and p.poll() is None:
                os.killpg(os.getpgid(p.pid), signal.SIGKILL)
                tail = self.tail_cgn_processes[i]
                if tail is not None:
                    tail.kill()
                del self.cgn_processes[i]
                del self.tail_cgn_processes[i]
                return
        log.warning("There's no active worker with pid: %s", pid)

    def kill_workers(self, pids: list[int]) -> int:
        """KILL_WORKER (``_api.py:478-490``). Takes OS PIDs; ``-1`` kills all. Always returns 0."""
        if -1 in pids:
            self.kill_all_workers()
        else:
            for pid in pids:
                self.kill_single_worker(pid)
        return 0

    def monitor_rank_status(self, local_ranks: list[int]) -> dict[int, dict[str, Any]]:
        """MONITOR (``_api.py:492-532``): status per local rank; ``-1`` means every local rank.

        ``None`` running, ``0`` clean exit, ``200`` never started (``pid`` None, no ``local_rank``
        or ``node_id`` keys, bare local rank as ``global_rank``), ``300`` any other ending: ``poll()``
        reaps the child before ``psutil.pid_exists`` is asked, so the real code is always lost.
        Out-of-range ranks are dropped with "Invalid rank id!".
        """
        if -1 in local_ranks:
            local_ranks = list(range(self.local_worker_num))
        rank_status: dict[int, dict[str, Any]] = {}
        for local_rank in local_ranks:
            if local_rank < 0 or local_rank >= self.local_worker_num:
                log.warning("Invalid rank id!")
                continue
            try:
                process = self.proc_rank_map[local_rank]
            except KeyError:
                log.info("Process rank %d has not been initialized.", local_rank)
                rank_status[local_rank] = {"pid": None, "status": STATUS_NOT_STARTED, "global_rank": local_rank}
                continue
            status = process.poll()
            if status != 0 and not psutil.pid_exists(process.pid):
                status = STATUS_FAILED
            if self.node_rank >= 0:
                global_rank = self.node_rank * self.local_worker_num + local_rank
            else:
                global_rank = local_rank
            rank_status[local_rank] = {
                "pid": process.pid,
                "status": status,
                "global_rank": global_rank,
                "local_rank": local_rank,
                "node_id": self.node_rank,
            }
        return rank_status

    def start_all_workers(self) -> int:
        """START_ALL_WORKER (``_api.py:534-548``).

        Kills all workers first if any were ever started and not killed through KILL_WORKER
        (``cgn_processes`` non-empty, even if they already exited), spawns every local rank, then
        returns 1 if MONITOR([-1]) at once shows any non-None status, else 0. Never touches the
        scheduler.
        """
        if self.cgn_processes:
            self.kill_all_workers()
        for local_rank in range(self.local_worker_num):
            self._start_single_worker(local_rank)
        rank_status = self.monitor_rank_status([-1])
        for status in rank_status.values():
            if status["status"] is not None:
                return 1
        return 0

    def start_worker_list(self, rank_ids: list[int]) -> int:
        """START_WORKER_LIST (``_api.py:550-565``).

        ``rank_ids`` must be a list (``TypeError`` otherwise). Each rank is spawned as given: a
        duplicate gives a second live copy, and an out-of-range rank spawns a stray worker, after
        which looking its status up in MONITOR's result raises ``KeyError(rank)``. Returns 1 if any
        of the ranks already has a non-None status, else 0.
        """
        if not isinstance(rank_ids, list):
            raise TypeError(f"The type of 'rank_ids' must be a list, but got {type(rank_ids).__name__}.")
        for local_rank in rank_ids:
            self._start_single_worker(local_rank)
        rank_status = self.monitor_rank_status(rank_ids)
        for local_rank in rank_ids:
            if rank_status[local_rank]["status"] is not None:
                return 1
        return 0

    # ------------------------------------------------------------------ test-only

    def cleanup(self) -> None:
        """Test only: SIGKILL and reap everything this manager ever started.

        Workers (by process group, strays and duplicates included), ``tail -f`` followers and the
        scheduler. msrun's own bookkeeping is left as it is (MONITOR afterwards shows 300). Safe
        to call more than once.

        The scheduler is first given time to say who it is (its first line): on a loaded machine
        a short job's workers can be done before the scheduler's interpreter has started, and the
        tests read what it said.
        """
        log_file = self.log_dir / "scheduler.log"
        deadline = time.monotonic() + _SCHEDULER_START_S
        while (
            self.msn_process is not None
            and self.msn_process.poll() is None
            and log_file.exists()
            and not log_file.stat().st_size
            and time.monotonic() < deadline
        ):
            time.sleep(0.02)
        for spawned in self._spawned:
            spawned.kill()
        for spawned in self._spawned:
            spawned.reap(_CLEANUP_WAIT_S)

    def __enter__(self) -> ProcessManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
