"""Adopting rank processes started outside recoverd (``recoverd adopt``, reset_process reborn).

Upstream's ``reset_process.py`` (reference/mindcluster-contract.md section 11) is started by the
launch script with the PIDs of the training processes it just started. ``capture`` records what is
needed to run each again (command line, environment, working directory, start time) with psutil,
refusing a process of another user and one that is already gone; :class:`AdoptRuntime` then lets
the node agent supervise them like its own ranks:

* an adopted process is **not our child**: a pidfd (which works for any process) says when it ended
  but not how. If its zombie can still be read (``/proc/<pid>/stat`` keeps the exit status until the
  parent reaps it), that status is used; otherwise the exit is unknown and, after ``vanish_grace_s``,
  counts as a fault, unless the agent is ending meanwhile (upstream's launcher sends SIGTERM when the
  job finished), in which case it was a normal end;
* stopping an adopted process signals it **and its descendants**, never its process group: a rank
  started by a shell script shares the script's group, and a group kill would kill the script;
* a restart runs the captured command with the captured environment and directory (plus recoverd's
  generation and restart-count variables) as a child of the agent, with the full process hygiene of
  :class:`~recoverd.agent.launcher.Launcher`; its exit status is known again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import psutil

from recoverd.agent.launcher import ExitInfo, Launcher, RankLaunch, RankProcess, stop_escalating
from recoverd.agent.runtime import OnExit
from recoverd.errors import ConfigError, LaunchFailed

__all__ = ["AdoptRuntime", "Captured", "capture", "zombie_exit_status"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Captured:
    """One adopted rank process, as it was when adopted."""

    pid: int
    rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    create_time: float


def _rank_of(env: Mapping[str, str]) -> int | None:
    for name in ("RANK_ID", "RANK"):
        raw = env.get(name, "").strip()
        if raw:
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r} is not a rank number") from None
    return None


def capture(pids: Sequence[int], *, with_rank: bool, uid: int | None = None) -> list[Captured]:
    """Capture every PID, or raise ConfigError naming the first that cannot be adopted.

    Ranks come from each process's ``RANK_ID`` (MindCluster) or ``RANK`` (torchrun); with
    ``with_rank`` a process without one is refused, otherwise ranks follow the order of ``pids``.
    """
    if not pids:
        raise ConfigError("no PID to adopt")
    if len(set(pids)) != len(pids):
        raise ConfigError(f"a PID is given twice: {list(pids)}")
    me = os.getuid() if uid is None else uid
    captured: list[Captured] = []
    for index, pid in enumerate(pids):
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                owner = proc.uids().real
                if owner != me:
                    raise ConfigError(f"PID {pid} belongs to uid {owner}, not {me}: refusing to adopt it")
                if proc.status() == psutil.STATUS_ZOMBIE:
                    raise ConfigError(f"PID {pid} has already exited: nothing to adopt")
                env = proc.environ()
                item = Captured(
                    pid=pid,
                    rank=-1,
                    argv=tuple(proc.cmdline()),
                    env=env,
                    cwd=proc.cwd(),
                    create_time=proc.create_time(),
                )
        except psutil.NoSuchProcess:
            raise ConfigError(f"PID {pid} does not exist (it exited before it could be adopted)") from None
        except psutil.AccessDenied as err:
            raise ConfigError(f"PID {pid} cannot be inspected ({err}): refusing to adopt it") from None
        if not item.argv:
            raise ConfigError(f"PID {pid} has no command line (a kernel thread or a zombie): refusing to adopt it")
        rank = _rank_of(item.env)
        if rank is None:
            if with_rank:
                raise ConfigError(f"PID {pid} has no RANK_ID or RANK in its environment (-r needs one)")
            rank = index
        captured.append(dataclasses.replace(item, rank=rank))
    ranks = [c.rank for c in captured]
    if len(set(ranks)) != len(ranks):
        raise ConfigError(f"two adopted processes claim the same rank: {ranks}")
    return captured


def zombie_exit_status(pid: int) -> ExitInfo | None:
    """How a process ended, read from its zombie's ``/proc/<pid>/stat``; None once it was reaped.

    Field 52 (``exit_code``, Linux 3.5+) is the wait status; readable only while the process is a
    zombie, i.e. before its parent reaped it.
    """
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    if len(fields) < 50 or fields[0] != "Z":
        return None
    status = int(fields[49])
    if os.WIFSIGNALED(status):
        return ExitInfo(pid, None, os.WTERMSIG(status))
    return ExitInfo(pid, os.WEXITSTATUS(status), None)


class AdoptRuntime(Launcher):
    """Adopts the captured processes as generation 0; restarts them as children of the agent."""

    #: Only the captured ranks can be restarted (their own command lines): nothing moves here.
    starts_any_rank = False
    #: reset_process jobs restart fault processes in place by design (MindCluster's reset.json
    #: RestartFaultProcess): their framework rejoins.
    rejoins_alone = True

    def __init__(
        self,
        on_exit: OnExit,
        protected_pids: Callable[[], set[int]],
        captured: Sequence[Captured],
        *,
        vanish_grace_s: float = 2.0,
    ) -> None:
        super().__init__(on_exit, protected_pids)
        self._captured = {c.rank: c for c in captured}
        self._to_adopt = dict(self._captured)
        self._adopted: dict[RankProcess, int] = {}  # adopted incarnation -> its pidfd (-1 once ended)
        self.vanish_grace_s = vanish_grace_s
        self._adopt_exit = on_exit

    def start(self, launch: RankLaunch, *, spare: bool = False) -> RankProcess:
        if spare:
            raise LaunchFailed("adopted ranks have no warm spares: each restarts with its own captured command")
        found = self._to_adopt.pop(launch.rank, None)
        if found is not None:
            return self._adopt(found)
        original = self._captured.get(launch.rank)
        if original is None:
            raise LaunchFailed(f"rank {launch.rank} was not adopted: there is no command to run it")
        ours = {k: v for k, v in launch.env.items() if k.startswith("RECOVERD_") or k == "TORCHELASTIC_RESTART_COUNT"}
        return super().start(
            dataclasses.replace(launch, argv=original.argv, env={**original.env, **ours}, cwd=original.cwd)
        )

    def _adopt(self, found: Captured) -> RankProcess:
        try:
            proc = psutil.Process(found.pid)
            if proc.create_time() != found.create_time or proc.status() == psutil.STATUS_ZOMBIE:
                raise psutil.NoSuchProcess(found.pid)
            pidfd = os.pidfd_open(found.pid)
        except (psutil.NoSuchProcess, ProcessLookupError) as err:
            raise LaunchFailed(f"adopted rank {found.rank} (pid {found.pid}) is gone") from err
        rank_proc = RankProcess(
            rank=found.rank,
            pid=found.pid,
            pgid=-1,  # never signalled as a group: it may share its launcher's group
            started_at=found.create_time,
            log_path=None,
            exited=self._loop.create_future(),
            _pidfd=-1,
        )
        self._adopted[rank_proc] = pidfd
        self._procs.add(rank_proc)
        self._loop.add_reader(pidfd, self._adopted_ended, rank_proc)
        log.info("adopted rank %d (pid %d): %s", found.rank, found.pid, " ".join(found.argv)[:200])
        return rank_proc

    def _adopted_ended(self, proc: RankProcess) -> None:
        pidfd = self._adopted.get(proc, -1)
        if pidfd >= 0:
            self._loop.remove_reader(pidfd)
            os.close(pidfd)
            self._adopted[proc] = -1
        info = zombie_exit_status(proc.pid)
        if info is not None:
            self._deliver(proc, info)
            return
        # Not our child and already reaped: how it ended is unknown. A fault, unless the agent is
        # told to end meanwhile (stop() then settles it as a normal end).
        self._loop.call_later(self.vanish_grace_s, self._deliver, proc, ExitInfo(proc.pid, None, None))

    def _deliver(self, proc: RankProcess, info: ExitInfo) -> None:
        self._procs.discard(proc)
        if not proc.exited.done():
            proc.exited.set_result(info)
            self._adopt_exit(proc, info)

    async def stop(self, proc: RankProcess, grace_s: float) -> ExitInfo:
        if proc not in self._adopted:
            return await super().stop(proc, grace_s)
        if self._adopted[proc] < 0 and not proc.exited.done():
            # It already ended (exit unknown) and the agent is stopping it: a normal end.
            self._deliver(proc, ExitInfo(proc.pid, 0, None))
        return await stop_escalating(proc, lambda sig: _signal_tree(proc.pid, sig), grace_s)


def _signal_tree(pid: int, sig: int) -> None:
    """Signal a process and its descendants (snapshot first, so children are not missed)."""
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
