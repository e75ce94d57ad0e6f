"""Starting, watching, stopping and reaping rank processes: the mechanism, no policy.

* Each rank runs an argv list (never a shell string) in its **own session and process group**
  (``start_new_session=True``): a kill reaches the whole tree, and the rank does not die with the
  agent (no parent-death signal), so losing the agent never costs training time.
* The agent learns of an exit **when the kernel says so**: a pidfd (``os.pidfd_open``) registered
  with the event loop becomes readable when the process exits. No polling loop.
* On exit, what is left of the rank's process group is SIGKILLed *before* the leader is reaped
  (while its zombie still reserves the group id, so the id cannot have been reused), then the leader
  is reaped with ``waitid(P_PIDFD)``: nothing is left behind as a zombie or an orphan.
* :meth:`Launcher.stop` sends SIGTERM to the group, waits ``grace_s`` on one deadline, then SIGKILL.
* Output goes to one log file per rank, opened for append with a header line per attempt; the tail
  of that file is what a fault record carries.
* **Warm spares** (``Launcher.start(..., spare=True)``, :meth:`Launcher.assign`): processes of the job's
  command started ahead of time with ``RECOVERD_WARM_SPARE_FD`` set, which import the framework and
  then block reading that pipe. Assigning one writes the rank's environment and log file as one
  JSON line; the process becomes the rank without paying interpreter and import time
  (``taskd_client.pytorch.wait_for_rank`` is the other end).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO

import psutil

from recoverd import priority
from recoverd.errors import LaunchFailed

__all__ = [
    "SPARE_FD_ENV",
    "ExitInfo",
    "FoundRank",
    "Launcher",
    "RankLaunch",
    "RankProcess",
    "find_rank_processes",
    "open_rank_log",
    "process_start_time",
    "read_tail",
    "spawn_in_session",
    "stop_escalating",
]

#: The environment variable that tells a warm spare which inherited fd to read its rank from.
SPARE_FD_ENV = "RECOVERD_WARM_SPARE_FD"
#: RankProcess.rank of a warm spare not yet given a rank.
SPARE_RANK = -1

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RankLaunch:
    """How to start one incarnation of a rank (desired state)."""

    rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None = None
    log_path: str | None = None
    header: str = ""
    #: Seconds the process waits before it runs ``argv`` (crash-loop backoff: ``crashloop.py``). It
    #: is started at once, so it is the rank's process from the start (stopped, killed and reaped
    #: as any other), and only then sleeps and execs the command in place (same pid).
    start_delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ExitInfo:
    """How a process ended: ``exit_code`` for a normal exit, ``signal`` when a signal killed it."""

    pid: int
    exit_code: int | None
    signal: int | None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def describe(self) -> str:
        if self.signal is None and self.exit_code is None:
            return "failed (exit status unknown)"
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = str(self.signal)
            return f"killed by {name}"
        return f"exit code {self.exit_code}"


@dataclass(slots=True, eq=False)
class RankProcess:
    """One running incarnation of a rank (observed state)."""

    rank: int
    pid: int
    pgid: int
    started_at: float
    log_path: str | None
    exited: asyncio.Future[ExitInfo] = field(repr=False)
    _pidfd: int = field(default=-1, repr=False)
    _popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    #: A warm spare's end of its assignment pipe (-1 once assigned, or for a rank).
    _assign_fd: int = field(default=-1, repr=False)
    #: A warm spare's environment (an assignment sends only what differs).
    _env: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def is_spare(self) -> bool:
        return self._assign_fd >= 0

    @property
    def is_running(self) -> bool:
        return not self.exited.done()


def read_tail(path: str | None, limit: int = 2048) -> str:
    """The last ``limit`` bytes of a log file (decoded leniently); "" when there is none."""
    if not path:
        return ""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


async def stop_escalating(proc: RankProcess, send: Callable[[int], None], grace_s: float) -> ExitInfo:
    """The one stop: ``send(SIGTERM)``, wait ``grace_s`` on one deadline, then ``send(SIGKILL)``;
    return how the process ended. ``send`` decides what a signal reaches (the rank's group, or an
    adopted process and its descendants). Idempotent: a process already gone is not signalled."""
    if proc.is_running:
        send(signal.SIGTERM)
        try:
            async with asyncio.timeout(grace_s):  # not wait_for: it can swallow a cancel on 3.11
                return await asyncio.shield(proc.exited)
        except TimeoutError:
            log.warning("rank %d (pid %d) ignored SIGTERM for %.1fs; sending SIGKILL", proc.rank, proc.pid, grace_s)
            send(signal.SIGKILL)
    return await proc.exited


#: How far two readings of one process's start time may differ: psutil derives it from the boot
#: time, which two processes can read a second apart.
START_TIME_SLACK_S = 1.5


def process_start_time(pid: int) -> float:
    """When the kernel started ``pid`` (seconds since the epoch): with the PID, it names one process."""
    return float(psutil.Process(pid).create_time())


@dataclass(frozen=True, slots=True)
class FoundRank:
    """A process on this node that runs a rank of one run (found by :func:`find_rank_processes`)."""

    rank: int
    pid: int
    started_at: float
    generation: int


def find_rank_processes(run_uid: str, node: str) -> list[FoundRank]:
    """Every live process whose environment says it is a rank of run ``run_uid`` on ``node``.

    How a restarted agent finds what its predecessor started: the ranks run in their own sessions
    and outlive the agent. Warm spares (no rank yet) are listed with rank -1. Processes of other
    users, other runs or other nodes are never listed, so never touched.
    """
    found: list[FoundRank] = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            env = proc.environ()
            if env.get("RECOVERD_RUN") != run_uid or env.get("RECOVERD_NODE") != node:
                continue
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            raw = env.get("RANK", "")
            rank = int(raw) if raw.isdigit() else SPARE_RANK
            generation = env.get("RECOVERD_GENERATION", "")
            found.append(
                FoundRank(rank, proc.pid, float(proc.create_time()), int(generation) if generation.isdigit() else -1)
            )
        except (psutil.Error, OSError):
            continue
    return found


def open_rank_log(launch: RankLaunch, how: str = "") -> IO[bytes] | None:
    """The rank's log file opened for append, with this attempt's header line (``how``: how the
    process was made, e.g. "warm start"); None when the rank has no log file."""
    if not launch.log_path:
        return None
    os.makedirs(os.path.dirname(launch.log_path) or ".", exist_ok=True)
    log_file = open(launch.log_path, "ab", buffering=0)
    if launch.header:
        log_file.write(f"==== {launch.header}{f' ({how})' if how else ''} ====\n".encode())
    return log_file


def spawn_in_session(
    argv: list[str], env: Mapping[str, str], cwd: str | None, output: IO[bytes] | None, pass_fds: tuple[int, ...]
) -> subprocess.Popen[bytes]:
    """Start ``argv`` as the agent starts every process of a job: in its own session and process
    group (a kill reaches its whole tree; it does not die with the agent), stdin from /dev/null,
    stdout and stderr to ``output`` (None: the agent's), no inherited fd but ``pass_fds``, at the
    job's CPU priority, not the agent's (recoverd.priority): put back as soon as it has started,
    before the job's code can start a thread."""
    popen = subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT if output is not None else None,
        start_new_session=True,
        close_fds=True,
        pass_fds=pass_fds,
    )
    priority.as_job(popen.pid)
    return popen


def _delayed(launch: RankLaunch) -> list[str]:
    """The command line that runs ``launch.argv`` after its start delay: a shell that sleeps,
    then execs the command in its own place (the pid the agent holds stays the rank's)."""
    if launch.start_delay_s <= 0:
        return list(launch.argv)
    return ["/bin/sh", "-c", 'sleep "$0" && exec "$@"', f"{launch.start_delay_s:g}", *launch.argv]


class Launcher:
    """Owns the rank processes of one agent. ``on_exit(proc, info)`` is called once per exit."""

    #: Any rank can be started here from the job's command: this node can take ranks moved from
    #: another node (`recover` to a spare).
    starts_any_rank = True
    #: A plain command's rank restarted alone cannot rejoin its group (unless the job says its
    #: ranks are independent, or they run a recoverd client: the agent decides, ADR 0041).
    rejoins_alone = False

    def __init__(
        self,
        on_exit: Callable[[RankProcess, ExitInfo], None],
        protected_pids: Callable[[], set[int]] = set,
    ) -> None:
        self._on_exit = on_exit
        self._protected_pids = protected_pids
        self._procs: set[RankProcess] = set()
        self._loop = asyncio.get_running_loop()

    @property
    def processes(self) -> frozenset[RankProcess]:
        return frozenset(self._procs)

    def owns(self, pid: int) -> bool:
        return any(p.pid == pid for p in self._procs)

    def start(self, launch: RankLaunch, *, spare: bool = False) -> RankProcess:
        """Start one incarnation; raise LaunchFailed (with the OS error) if it cannot be started.

        ``spare``: start a warm spare instead (``launch.rank`` is ignored): see :meth:`assign`.
        """
        log_file = None
        read_fd = write_fd = -1
        env = dict(launch.env)
        if spare:
            read_fd, write_fd = os.pipe()
            os.set_inheritable(read_fd, True)
            env[SPARE_FD_ENV] = str(read_fd)
        try:
            log_file = open_rank_log(launch)
            popen = spawn_in_session(_delayed(launch), env, launch.cwd, log_file, (read_fd,) if spare else ())
        except OSError as err:
            if spare:
                os.close(write_fd)
            raise LaunchFailed(f"rank {launch.rank}: cannot start {launch.argv[0]!r}: {err}") from err
        finally:
            if log_file is not None:
                log_file.close()
            if spare:
                os.close(read_fd)
        pidfd = os.pidfd_open(popen.pid)
        proc = RankProcess(
            rank=SPARE_RANK if spare else launch.rank,
            pid=popen.pid,
            pgid=popen.pid,
            started_at=process_start_time(popen.pid),
            log_path=launch.log_path,
            exited=self._loop.create_future(),
            _pidfd=pidfd,
            _popen=popen,
            _assign_fd=write_fd,
            _env=env if spare else {},
        )
        self._procs.add(proc)
        self._loop.add_reader(pidfd, self._reap, proc)
        return proc

    def assign(self, spare: RankProcess, launch: RankLaunch) -> RankProcess:
        """Make a warm spare the rank ``launch`` describes: it takes ``launch.env`` and writes to
        ``launch.log_path`` from now on (same pid). Raise LaunchFailed if the spare is gone."""
        if not spare.is_spare or not spare.is_running:
            raise LaunchFailed(f"rank {launch.rank}: warm spare pid {spare.pid} is not available")
        # Only what differs from the spare's own environment: the message must fit the pipe.
        env = {k: v for k, v in launch.env.items() if spare._env.get(k) != v}
        message = (json.dumps({"env": env, "log_path": launch.log_path, "rank": launch.rank}) + "\n").encode()
        try:
            if len(message) > select.PIPE_BUF * 16:
                raise OSError(f"assignment of {len(message)} bytes would not fit the pipe")
            log_file = open_rank_log(launch, f"warm spare pid {spare.pid}")
            if log_file is not None:
                log_file.close()
            os.set_blocking(spare._assign_fd, False)  # never wait on a wedged spare
            if os.write(spare._assign_fd, message) != len(message):
                raise OSError("the assignment was only partly written")
        except OSError as err:
            raise LaunchFailed(f"rank {launch.rank}: warm spare pid {spare.pid} did not take it: {err}") from err
        finally:
            os.close(spare._assign_fd)
            spare._assign_fd = -1
        spare.rank = launch.rank
        spare.log_path = launch.log_path
        return spare

    def track_child(self, launch: RankLaunch, pid: int) -> RankProcess:
        """Watch a rank that was forked for us (a warm start, :mod:`recoverd.agent.warmstart`): it
        leads its own process group and has been re-parented to us (we are a subreaper), so it is
        reaped, and its exit status read, as for a process :meth:`start` made."""
        try:
            pidfd = os.pidfd_open(pid)
            started_at = process_start_time(pid)
        except (psutil.Error, OSError) as err:
            raise LaunchFailed(f"rank {launch.rank}: forked pid {pid} is gone ({err})") from err
        proc = RankProcess(
            rank=launch.rank,
            pid=pid,
            pgid=pid,
            started_at=started_at,
            log_path=launch.log_path,
            exited=self._loop.create_future(),
            _pidfd=pidfd,
        )
        self._procs.add(proc)
        self._loop.add_reader(pidfd, self._reap, proc)
        return proc

    def adopt(self, rank: int, pid: int, started_at: float, log_path: str | None) -> RankProcess:
        """Watch a rank that a previous incarnation of this agent started (same node, same run).

        The caller has matched the process to the rank (:func:`find_rank_processes`); here it is
        checked once more to be the same process (its start time: a reused PID has another) and to
        lead its own process group (every rank we start does), so the group kill on its end and
        :meth:`stop` reach only its tree. It is not our child: its end arrives through the pidfd as
        for our own ranks, but its exit status is unknown (``waitid`` cannot read it).
        """
        try:
            if abs(process_start_time(pid) - started_at) > START_TIME_SLACK_S:
                raise LaunchFailed(f"rank {rank}: pid {pid} is another process now (PID reused)")
            if os.getpgid(pid) != pid:
                raise LaunchFailed(f"rank {rank}: pid {pid} does not lead its own process group")
            pidfd = os.pidfd_open(pid)
        except (psutil.Error, ProcessLookupError, OSError) as err:
            raise LaunchFailed(f"rank {rank}: pid {pid} is gone ({err})") from err
        proc = RankProcess(
            rank=rank,
            pid=pid,
            pgid=pid,
            started_at=started_at,
            log_path=log_path,
            exited=self._loop.create_future(),
            _pidfd=pidfd,
        )
        self._procs.add(proc)
        self._loop.add_reader(pidfd, self._reap, proc)
        return proc

    def _reap(self, proc: RankProcess) -> None:
        """The pidfd is readable: the leader exited. Kill the rest of its group, then reap it."""
        self._loop.remove_reader(proc._pidfd)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pgid, signal.SIGKILL)
        try:
            result = os.waitid(os.P_PIDFD, proc._pidfd, os.WEXITED)
        except ChildProcessError:
            result = None
        os.close(proc._pidfd)
        proc._pidfd = -1
        if proc._assign_fd >= 0:
            os.close(proc._assign_fd)
            proc._assign_fd = -1
        if result is None:
            info = ExitInfo(proc.pid, None, None)
        elif result.si_code == os.CLD_EXITED:
            info = ExitInfo(proc.pid, result.si_status, None)
        else:
            info = ExitInfo(proc.pid, None, result.si_status)
        if proc._popen is not None:
            # Tell Popen the child is reaped, so it never waits on (or warns about) a recycled pid.
            proc._popen.returncode = info.exit_code if info.exit_code is not None else -(info.signal or 0)
        self._procs.discard(proc)
        if not proc.exited.done():
            proc.exited.set_result(info)
        self._on_exit(proc, info)

    async def stop(self, proc: RankProcess, grace_s: float) -> ExitInfo:
        """SIGTERM the rank's group, SIGKILL it after ``grace_s``; return how it ended. Idempotent."""

        def to_group(sig: int) -> None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pgid, sig)

        return await stop_escalating(proc, to_group, grace_s)

    async def watch(self) -> None:
        """Nothing to watch: exits arrive through the pidfds registered with the loop."""
        return

    def kill_strays(self) -> list[int]:
        """SIGKILL and reap every untracked child: descendants of our ranks that escaped their group.

        We are a subreaper, so only our own descendants can be re-parented to us; a rank's child
        that called setsid() outlives the group kill and lands here when the rank dies. Called when
        the agent ends, so nothing it started outlives it. Protected children are never touched.
        """
        protected = self._protected_pids()
        strays = [
            child for child in psutil.Process().children() if not self.owns(child.pid) and child.pid not in protected
        ]
        for child in strays:
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(strays, timeout=2.0)
        return [child.pid for child in strays]

    def reap_strays(self) -> list[int]:
        """Reap zombies re-parented to us (we are a subreaper): descendants of ranks that outlived them.

        Only zombies are touched, never a rank we track (its exit code comes through its pidfd) nor a
        protected child of the same process (the embedded etcd of ``recoverd run``).
        """
        reaped: list[int] = []
        protected = self._protected_pids()
        for child in psutil.Process().children():
            if self.owns(child.pid) or child.pid in protected:
                continue
            with contextlib.suppress(psutil.Error, ChildProcessError, OSError):
                if child.status() != psutil.STATUS_ZOMBIE:
                    continue
                pid, _ = os.waitpid(child.pid, os.WNOHANG)
                if pid:
                    reaped.append(pid)
        return reaped
