"""Running ranks through MindSpore msrun's four callbacks (the runtime behind ``MSRunPlugin``).

msrun (reference/msrun-contract.md) owns the worker processes and gives its plugin four bound
methods of its ``_ProcessManager``: ``KILL_WORKER(pids)``, ``START_ALL_WORKER()``,
``START_WORKER_LIST(local_ranks)`` and ``MONITOR(local_ranks)``. This runtime adapts them to what
the node agent expects, and guards against their documented traps:

* **MONITOR is the only signal** (no pidfd: msrun's ``Popen.poll`` reaps its children, and we must
  never reap them ourselves or msrun would read a failure as exit 0). :meth:`watch` calls it every
  ``poll_s`` (default 0.1 s) and turns a status change of a tracked pid into an exit: ``0`` is
  success, anything else (in practice 300) a failure whose exit code is lost. ``200`` ("never
  started") is valid and never aborts a tick.
* **KILL_WORKER takes pids**, silently ignores unknown ones and only SIGKILLs. A stop first sends
  SIGTERM to the worker's process group (msrun starts each in its own session), waits ``grace_s``,
  then calls ``KILL_WORKER([pid])`` with the pid of the *current* incarnation, and checks with psutil
  that it is gone.
* **START_WORKER_LIST** does not de-duplicate, range-check or kill a running copy: this runtime
  only starts a local rank that is in range and not running, one at a time.
* **The callbacks are not thread-safe**: every call goes through one lock.
* At the end, :meth:`kill_strays` calls ``KILL_WORKER([-1])`` (which also stops the ``tail -f``
  log followers) and terminates msrun's scheduler, the child that runs with ``MS_ROLE=MS_SCHED``:
  nothing msrun started outlives the plugin.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psutil

from recoverd.agent.launcher import ExitInfo, RankLaunch, RankProcess
from recoverd.agent.runtime import OnExit
from recoverd.errors import ConfigError, LaunchFailed

__all__ = ["CALLBACKS", "MsrunLayout", "MsrunRuntime", "kill_msrun_processes"]

log = logging.getLogger(__name__)

CALLBACKS = ("KILL_WORKER", "START_ALL_WORKER", "START_WORKER_LIST", "MONITOR")
_RUNNING, _SUCCEEDED, _NEVER_STARTED = None, 0, 200


@dataclass(frozen=True, slots=True)
class MsrunLayout:
    """Where this node's workers sit in the job: global rank = node_rank * local_workers + local."""

    worker_num: int
    local_worker_num: int
    node_rank: int

    def global_rank(self, local: int) -> int:
        return self.node_rank * self.local_worker_num + local

    def local_rank(self, global_rank: int) -> int:
        local = global_rank - self.node_rank * self.local_worker_num
        if not 0 <= local < self.local_worker_num:
            raise LaunchFailed(f"rank {global_rank} is not on this node (node rank {self.node_rank})")
        return local


class MsrunRuntime:
    """A :class:`~recoverd.agent.runtime.RankRuntime` over msrun's callbacks."""

    #: msrun starts only its own node's workers.
    starts_any_rank = False
    #: MindSpore's own fault-process restart rejoins the group (ARF, ENABLE_RESTART_FAULT_PROCESS).
    rejoins_alone = True

    def __init__(
        self,
        callbacks: Mapping[str, Callable[..., Any]],
        layout: MsrunLayout,
        on_exit: OnExit,
        *,
        poll_s: float = 0.1,
        kill_timeout_s: float = 5.0,
        export_env: Callable[[Mapping[str, str]], None] | None = None,
    ) -> None:
        missing = [name for name in CALLBACKS if name not in callbacks]
        if missing:
            raise ConfigError(f"msrun did not register the callbacks {missing}")
        self._callbacks = dict(callbacks)
        self.layout = layout
        self._on_exit = on_exit
        if poll_s <= 0:
            raise ConfigError(f"the MONITOR interval must be positive, got {poll_s}")
        self.poll_s = poll_s
        self.kill_timeout_s = kill_timeout_s
        self._export_env = export_env or _export_recoverd_env
        self._lock = threading.Lock()
        self._procs: dict[int, RankProcess] = {}  # local rank -> current incarnation
        self._loop = asyncio.get_running_loop()

    def _call(self, name: str, *args: Any) -> Any:
        with self._lock:
            return self._callbacks[name](*args)

    @property
    def processes(self) -> frozenset[RankProcess]:
        return frozenset(p for p in self._procs.values() if p.is_running)

    # ---------------------------------------------------------------- start
    def start(self, launch: RankLaunch) -> RankProcess:
        local = self.layout.local_rank(launch.rank)
        current = self._procs.get(local)
        if current is not None and current.is_running:
            raise LaunchFailed(f"rank {launch.rank} is already running (pid {current.pid}); not starting a copy")
        # msrun builds each worker's environment from its own os.environ: that is how recoverd's
        # variables (job, generation, restart count) reach the workers.
        self._export_env(launch.env)
        self._call("START_WORKER_LIST", [local])
        status = self._call("MONITOR", [local]).get(local, {})
        pid = status.get("pid")
        if not isinstance(pid, int) or status.get("status") is not _RUNNING:
            raise LaunchFailed(f"msrun did not start local rank {local}: MONITOR says {status!r}")
        proc = RankProcess(
            rank=launch.rank,
            pid=pid,
            pgid=pid,
            started_at=time.time(),
            log_path=None,
            exited=self._loop.create_future(),
        )
        self._procs[local] = proc
        return proc

    # ---------------------------------------------------------------- watch
    async def watch(self) -> None:
        """Turn MONITOR's status changes into exits, checking every ``poll_s`` (the only signal)."""
        while True:
            self.check_once()
            await asyncio.sleep(self.poll_s)

    def check_once(self) -> None:
        statuses = self._call("MONITOR", [-1])
        for local, proc in list(self._procs.items()):
            if not proc.is_running:
                continue
            entry = statuses.get(local) if isinstance(statuses, Mapping) else None
            if not isinstance(entry, Mapping):
                continue
            if entry.get("pid") != proc.pid:
                # Another copy is the one MONITOR shows now: ours is gone (msrun only keeps the newest).
                self._exited(proc, ExitInfo(proc.pid, None, None))
                continue
            status = entry.get("status")
            if status is _RUNNING or status == _NEVER_STARTED:
                continue
            self._exited(proc, ExitInfo(proc.pid, 0 if status == _SUCCEEDED else None, None))

    def _exited(self, proc: RankProcess, info: ExitInfo) -> None:
        if not proc.exited.done():
            proc.exited.set_result(info)
            self._on_exit(proc, info)

    # ---------------------------------------------------------------- stop
    async def stop(self, proc: RankProcess, grace_s: float) -> ExitInfo:
        if proc.is_running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pgid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while proc.is_running and time.monotonic() < deadline:
                self.check_once()
                await asyncio.sleep(min(self.poll_s, 0.05))
            if proc.is_running:
                log.warning("rank %d (pid %d) ignored SIGTERM for %.1fs; KILL_WORKER", proc.rank, proc.pid, grace_s)
                self._call("KILL_WORKER", [proc.pid])
                deadline = time.monotonic() + self.kill_timeout_s
                while proc.is_running and time.monotonic() < deadline:
                    self.check_once()
                    if proc.is_running and not _alive(proc.pid):
                        self._exited(proc, ExitInfo(proc.pid, None, signal.SIGKILL))
                    await asyncio.sleep(min(self.poll_s, 0.05))
                if proc.is_running:
                    # KILL_WORKER ignores pids it does not know: kill the group ourselves.
                    log.error("KILL_WORKER left rank %d (pid %d) alive; SIGKILL to its group", proc.rank, proc.pid)
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pgid, signal.SIGKILL)
                    self._exited(proc, ExitInfo(proc.pid, None, signal.SIGKILL))
        return await proc.exited

    # ---------------------------------------------------------------- the end
    def kill_strays(self) -> list[int]:
        """KILL_WORKER([-1]) (workers and their log followers), then msrun's scheduler."""
        killed = [p.pid for p in self._procs.values() if p.is_running]
        with self._lock:
            killed += kill_msrun_processes(self._callbacks)
        for proc in list(self._procs.values()):
            self._exited(proc, ExitInfo(proc.pid, None, signal.SIGKILL))
        return killed

    def reap_strays(self) -> list[int]:
        """Never reap here: msrun's own ``poll()`` must see its children's exits."""
        return []


def kill_msrun_processes(callbacks: Mapping[str, Callable[..., Any]]) -> list[int]:
    """Everything msrun started: ``KILL_WORKER([-1])`` (workers, log followers), then its scheduler.

    Also called when the plugin cannot even start (bad settings): msrun started the scheduler
    before handing over, and nothing else would stop it.
    """
    kill = callbacks.get("KILL_WORKER")
    if kill is not None:
        with contextlib.suppress(Exception):
            kill([-1])
    schedulers = _schedulers()
    for child in schedulers:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _gone, alive = psutil.wait_procs(schedulers, timeout=3.0)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    return [child.pid for child in schedulers]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _schedulers() -> list[psutil.Process]:
    """msrun's scheduler: a child of this process running with MS_ROLE=MS_SCHED."""
    found = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if child.environ().get("MS_ROLE") == "MS_SCHED" and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
    return found


def _export_recoverd_env(env: Mapping[str, str]) -> None:
    for key, value in env.items():
        if key.startswith("RECOVERD_") or key == "TORCHELASTIC_RESTART_COUNT":
            os.environ[key] = value
