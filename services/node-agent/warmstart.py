"""Warm starts: a restarted rank is forked from a pre-imported interpreter, with no code change.

When the job's command is ``python [options] script.py ...`` (or ``python -m module ...``), the
agent keeps one **warm-start server** per node (:mod:`recoverd.agent.warmstart_server`, run by the
job's own interpreter in the job's environment): it has imported the job's framework once
(``--warm-start-modules``; the default, ``auto``, is the framework the script imports: for
``torch``, torch and its distributed, parallel and optimizer modules, plus ``taskd_client.pytorch``
if the script uses it; a script that imports no framework is started plainly). Every rank the agent
starts while the server is ready is forked from it and runs the script with ``runpy``: the
restart skips interpreter start-up and ``import torch``. The rank is re-parented to the agent
(a child subreaper), so it is reaped, stopped and re-adopted like any rank the agent starts.

It falls back to a plain start, with the reason in the agent's log, whenever it cannot be used:
the command is not a plain Python command, the agent is not a subreaper, the server is still
importing or has died (it is started again, later each time), or it refuses a fork (threads or
CUDA in the server). Warm spares (``--warm-spares``, :mod:`.warm`) are taken first when present.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import ctypes
import json
import logging
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from recoverd import priority
from recoverd.agent.launcher import Launcher, RankLaunch, RankProcess, open_rank_log, spawn_in_session
from recoverd.agent.warmstart_server import STANDBY_FLAG
from recoverd.errors import LaunchFailed

__all__ = [
    "AUTO",
    "FRAMEWORKS",
    "SERVER",
    "WarmStart",
    "WarmStartCommand",
    "frameworks_imported",
    "is_subreaper",
    "parse_command",
    "preload_list",
]

log = logging.getLogger(__name__)

SERVER = str(Path(__file__).with_name("warmstart_server.py"))
#: ``--warm-start-modules auto``: the server imports what the job's interpreter has of these.
AUTO = "auto"
#: Per framework the script imports (a top-level package name): what the server imports for it.
FRAMEWORKS: dict[str, tuple[str, ...]] = {
    "torch": (
        "torch",
        "torch.distributed",
        "torch.nn.parallel",
        "torch.optim",
        "torch._dynamo",  # what the first optimizer step imports lazily (~0.9 s here)
    ),
    # stackdump: what the trainer's first progress report imports (~5-8 ms of a replacement).
    "taskd_client": ("taskd_client.pytorch", "taskd_client.stackdump"),
    "mindspore": ("mindspore",),
}
#: Padding in the server's environment and command line: a forked rank writes its own there, so
#: that ``ps`` and ``/proc/<pid>/environ`` show the rank (rank variables added to the job's fit).
ROOM_ENV = "RECOVERD_WARM_START_ROOM"
ENV_ROOM = 16384
ARGV_ROOM = 4096
#: How long a fork request may take before the server is given up as wedged. The agent waits for
#: the answer (a fork takes milliseconds), so this bounds how long a wedged server can hold it.
FORK_TIMEOUT_S = 1.0
#: A server that died is started again after this long, doubled each time (at most RESTART_MAX_S).
RESTART_S = 1.0
RESTART_MAX_S = 60.0

_PYTHON = re.compile(r"python(\d+(\.\d+)*)?$")
#: Interpreter options the server can take as they are (they apply to the whole interpreter).
_FLAGS = frozenset({"-u", "-O", "-OO", "-B", "-s", "-E", "-I", "-b", "-bb", "-q", "-P"})
_WITH_VALUE = ("-X", "-W")


@dataclass(frozen=True, slots=True)
class WarmStartCommand:
    """The job's command split into what the server runs as and what each rank runs."""

    interpreter: str
    options: tuple[str, ...]
    #: ``-m module``: the module; else None and ``argv[0]`` is the script.
    module: str | None
    argv: tuple[str, ...]


def parse_command(argv: Sequence[str]) -> WarmStartCommand | str:
    """The command as a :class:`WarmStartCommand`, or why it cannot be warm-started."""
    if not argv or not _PYTHON.match(os.path.basename(argv[0])):
        return "the command is not a Python interpreter"
    options: list[str] = []
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in _FLAGS:
            options.append(arg)
            i += 1
        elif arg in _WITH_VALUE and i + 1 < len(argv):
            options += argv[i : i + 2]
            i += 2
        elif arg.startswith(_WITH_VALUE) and len(arg) > 2:
            options.append(arg)
            i += 1
        elif arg == "-m" and i + 1 < len(argv):
            return WarmStartCommand(argv[0], tuple(options), argv[i + 1], tuple(argv[i + 2 :]))
        elif arg.startswith("-m") and len(arg) > 2:
            return WarmStartCommand(argv[0], tuple(options), arg[2:], tuple(argv[i + 1 :]))
        elif arg.startswith("-"):
            return f"interpreter option {arg!r} is not supported by warm starts"
        else:
            return WarmStartCommand(argv[0], tuple(options), None, tuple(argv[i:]))
    return "the command names no script"


def script_path(command: WarmStartCommand, cwd: str) -> str | None:
    """The file the command runs (a ``-m`` module is looked for below ``cwd``), or None."""
    if command.module is None:
        return os.path.join(cwd, command.argv[0])
    base = os.path.join(cwd, *command.module.split("."))
    for candidate in (base + ".py", os.path.join(base, "__main__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def frameworks_imported(path: str | None) -> list[str]:
    """The frameworks of :data:`FRAMEWORKS` that the script's source imports, anywhere in it
    (``auto``): a script that imports none is started plainly, as it gains nothing."""
    if path is None:
        return []
    try:
        tree = ast.parse(Path(path).read_bytes(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return []
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return [name for name in FRAMEWORKS if name in found]


def preload_list(modules: str, command: WarmStartCommand, cwd: str) -> list[str]:
    """``--warm-start-modules`` made concrete: ``auto`` is the modules of the frameworks the script
    imports (taskd_client's PyTorch part only beside torch), else the list given."""
    if modules != AUTO:
        return [m.strip() for m in modules.split(",") if m.strip()]
    frameworks = frameworks_imported(script_path(command, cwd))
    if "taskd_client" in frameworks and "torch" not in frameworks:
        frameworks.remove("taskd_client")
    return [module for name in frameworks for module in FRAMEWORKS[name]]


def is_subreaper() -> bool:
    """PR_GET_CHILD_SUBREAPER: whether orphans re-parent to this process (a forked rank must)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        flag = ctypes.c_int(0)
        return int(libc.prctl(37, ctypes.byref(flag), 0, 0, 0)) == 0 and flag.value == 1
    except (OSError, AttributeError):
        return False


class WarmStart:
    """One node's warm-start server: started by :meth:`start`, used by :meth:`spawn`."""

    def __init__(
        self,
        launcher: Launcher,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | None,
        modules: str,
        log_path: str | None,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self._launcher = launcher
        self._env = dict(env)
        self._cwd = cwd
        self._modules = modules
        self._log_path = log_path
        self._on_change = on_change
        self._popen: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._buffer = b""
        self._ready = False
        #: Set when the server being started is ready or gone (:meth:`wait_ready`).
        self._settled: asyncio.Event | None = None
        self._stopping = False
        self._restarts = 0
        self._restart: asyncio.TimerHandle | None = None
        parsed = parse_command(argv)
        self.command = parsed if isinstance(parsed, WarmStartCommand) else None
        #: Why warm starts are not used now ("" while they are, or the server is starting).
        self.unavailable = parsed if isinstance(parsed, str) else ""
        self.preloaded: list[str] = []

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def starting(self) -> bool:
        """The server is importing: not ready yet, not given up, not dead."""
        return self._popen is not None and not self._ready and self._settled is not None and not self._settled.is_set()

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None and self._popen.poll() is None else None

    # ------------------------------------------------------------------ the server
    def start(self) -> None:
        """Start the server (it imports in the background); idempotent. Logs why not, once."""
        self._restart = None
        if self._stopping or self._popen is not None or self.command is None:
            if self.command is None and self.unavailable:
                log.info("warm starts off: %s", self.unavailable)
            return
        if not is_subreaper():
            self.unavailable = "the agent is not a child subreaper (a forked rank would not be its child)"
            log.warning("warm starts off: %s", self.unavailable)
            return
        command = self.command
        cwd = self._cwd or os.getcwd()
        path0 = cwd if command.module else os.path.dirname(os.path.abspath(os.path.join(cwd, command.argv[0])))
        modules = ",".join(preload_list(self._modules, command, cwd))
        if not modules:
            self.unavailable = "the script imports no known framework (set --warm-start-modules to preload some)"
            log.info("warm starts off: %s", self.unavailable)
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(self._env)
        env.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS pool would be a thread at the fork
        # Room for a forked rank to show its own command line and environment (warmstart_server.show_as_rank).
        env[ROOM_ENV] = "." * ENV_ROOM
        argv = [command.interpreter, *command.options, SERVER, "--fd", str(theirs.fileno()), "--path0", path0,
                "--preload", modules, "--job-nice", str(priority.current().job_nice),
                *(("--script", command.argv[0]) if command.module is None else ()),
                "--room", "." * ARGV_ROOM]  # fmt: skip
        out = None
        try:
            if self._log_path:
                os.makedirs(os.path.dirname(self._log_path) or ".", exist_ok=True)
                out = open(self._log_path, "ab", buffering=0)
            self._popen = spawn_in_session(argv, env, self._cwd, out, (theirs.fileno(),))
        except OSError as err:
            ours.close()
            self.unavailable = f"cannot start the warm-start server: {err}"
            log.warning("warm starts off: %s", self.unavailable)
            return
        finally:
            theirs.close()
            if out is not None:
                out.close()
        ours.setblocking(False)
        self._sock = ours
        self._buffer = b""
        self._started_at = time.monotonic()
        self._settled = asyncio.Event()
        asyncio.get_running_loop().add_reader(ours.fileno(), self._readable)
        log.info("warm-start server pid %d importing %s", self._popen.pid, modules)

    def _readable(self) -> None:
        """The hello line while the server imports; afterwards only its end (EOF) is expected."""
        assert self._sock is not None
        try:
            chunk = self._sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._lost("the warm-start server ended")
            return
        if self._ready:
            return  # nothing is expected between requests
        self._buffer += chunk
        if b"\n" not in self._buffer:
            return
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            hello = json.loads(line)
        except ValueError:
            self._lost("the warm-start server sent garbage")
            return
        self.preloaded = [str(m) for m in hello.get("preloaded", [])]
        failed = hello.get("failed") or {}
        if failed and self._modules != AUTO:
            log.warning("warm-start server could not import %s", failed)
        if hello.get("hazard"):
            self._give_up(f"the server cannot fork safely: {hello['hazard']}")
            return
        if not self.preloaded:
            self._give_up(f"nothing to preload ({failed or 'no modules'}): a warm start would gain nothing")
            return
        self._ready = True
        if self._settled is not None:
            self._settled.set()
        if self._popen is not None:
            # It forks the replacements: at the control plane's priority; each rank it forks puts
            # itself back at the job's before it runs anything of the job (recoverd.priority).
            priority.as_control_plane(self._popen.pid)
        self._restarts = 0
        self.unavailable = ""
        log.info(
            "warm-start server pid %s ready in %.1fs with %s%s",
            hello.get("pid"),
            time.monotonic() - self._started_at,
            ", ".join(self.preloaded),
            " (warmed up)" if hello.get("warmed_up") else "",
        )
        self._on_change()

    async def wait_ready(self, bound_s: float) -> bool:
        """Whether the server is ready, waiting up to ``bound_s`` while it imports; False at once
        when none is starting (warm starts off, or it could not start) and as soon as it dies or is
        given up, so that a caller falls back to plain starts without waiting out the bound."""
        if self._ready:
            return True
        if not self.starting:
            return False
        assert self._settled is not None  # starting implies it
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._settled.wait(), bound_s)
        return self._ready

    def _close(self) -> None:
        self._ready = False
        if self._settled is not None:
            self._settled.set()
        if self._sock is not None:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        if self._popen is not None:
            if self._popen.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self._popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
                self._popen.wait(timeout=2.0)
            self._popen = None

    def _give_up(self, why: str) -> None:
        """A reason that will not go away by itself: no more warm starts for this agent."""
        self.unavailable = why
        self._stopping = True
        log.warning("warm starts off: %s", why)
        self._close()

    def _lost(self, why: str) -> None:
        """The server died or misbehaved: plain starts until a new one is ready."""
        self.unavailable = why
        log.warning("%s; plain starts until it is back", why)
        self._close()
        if not self._stopping and self._restart is None:
            delay = min(RESTART_MAX_S, RESTART_S * 2**self._restarts)
            self._restarts += 1
            self._restart = asyncio.get_running_loop().call_later(delay, self.start)

    def standby_pids(self) -> set[int]:
        """The server's standbys now (re-parented to the agent: ``ps`` shows ``--standby-of PID``).
        They end with the server, but may still be ending when the agent sweeps what its ranks
        left behind: they are recoverd's own, not the ranks'."""
        server = self.pid
        if server is None:
            return set()
        mark = [STANDBY_FLAG, str(server)]
        found = set()
        for proc in psutil.Process().children():
            with contextlib.suppress(psutil.Error):
                cmdline = proc.cmdline()
                if any(cmdline[i : i + 2] == mark for i in range(len(cmdline))):
                    found.add(proc.pid)
        return found

    def stop(self) -> None:
        """Stop the server; no more warm starts (idempotent). The ranks it forked are untouched."""
        self._stopping = True
        if self._restart is not None:
            self._restart.cancel()
            self._restart = None
        self._close()

    # ------------------------------------------------------------------ ranks
    def spawn(self, launch: RankLaunch) -> RankProcess | None:
        """The rank forked from the server, or None (not ready, or it failed: start it plainly)."""
        if not self._ready or self._sock is None or self.command is None:
            return None
        if tuple(launch.argv) != (self.command.interpreter, *self.command.options,
                                  *(("-m", self.command.module) if self.command.module else ()),
                                  *self.command.argv):  # fmt: skip
            return None  # not the job's command (cannot happen today; never guess)
        request = {
            "cmdline": list(launch.argv),
            "argv": list(self.command.argv),
            "module": self.command.module,
            "env": dict(launch.env),
            "cwd": launch.cwd,
            "log_path": launch.log_path,
            "nice": priority.current().job_nice,
        }
        try:
            log_file = open_rank_log(launch, "warm start")
            if log_file is not None:
                log_file.close()
            answer = self._ask(request)
        except OSError as err:
            self._lost(f"the warm-start server did not answer: {err}")
            return None
        if "pid" not in answer:
            self._give_up(f"the server refused to fork: {answer.get('error', answer)}")
            return None
        try:
            return self._launcher.track_child(launch, int(answer["pid"]))
        except LaunchFailed as err:
            log.warning("%s", err)
            return None

    def _ask(self, request: Mapping[str, object]) -> dict[str, Any]:
        """One request, one answer line; blocking (a fork takes milliseconds), bounded."""
        assert self._sock is not None
        sock = self._sock
        sock.setblocking(True)
        sock.settimeout(FORK_TIMEOUT_S)
        try:
            sock.sendall((json.dumps(request) + "\n").encode())
            data = b""
            while b"\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    raise OSError("the server closed the connection")
                data += chunk
        finally:
            sock.setblocking(False)
        try:
            answer = json.loads(data.split(b"\n", 1)[0])
        except ValueError as err:  # garbage: a broken server, given up as one that did not answer
            raise OSError(f"unreadable answer ({err})") from err
        if not isinstance(answer, dict):
            raise OSError(f"unexpected answer {answer!r}")
        return answer
