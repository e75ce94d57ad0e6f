"""The warm-start server: a pre-imported interpreter that forks the job's ranks (docs/pytorch.md).

The agent starts this file with the job's own interpreter and interpreter options
(``python -u warmstart_server.py --fd 5 ...``), in the job's environment minus the per-rank
variables. It imports the framework once (``--preload``), then, for each rank the agent asks for,
forks a process that becomes the rank and runs the job's script in it with :mod:`runpy`: a
restarted rank pays neither interpreter start-up nor ``import torch`` (~1.5 s here).

Why it is safe, and where it is not:

* **No thread but the main one at the fork, no CUDA.** Before every fork the server counts its
  native threads (``/proc/self/task``) and refuses with the reason if there is more than one, or if
  ``torch.cuda`` was initialised: a lock held by another thread, or a CUDA context, does not survive
  a fork. Importing modules starts no thread; running any computation would, so the server never
  computes. numpy's OpenBLAS starts a thread pool when it loads: the agent starts the server with
  ``OPENBLAS_NUM_THREADS=1`` unless the job sets it (then, with a pool, forks are refused).
* **A standby runs one thread besides its main one.** A standby unused for
  ``MAKE_AHEAD_AFTER_S`` makes the rendezvous store its rank's trainer will ask for (connected to
  etcd, following the run's rendezvous prefix) when ``taskd_client.pytorch`` is preloaded: a
  replacement then pays for no connection on the recovery's critical path. It also compiles the
  script, which its rank runs if the file is unchanged (``Precompiled``). A standby never forks;
  it waits at the job's priority; becoming a rank it sets every thread's priority to the rank's and
  changes only the environment variables that differ.
* **The rank is not our child.** The server forks an intermediate process that forks the rank and
  exits at once, so the rank is re-parented to the agent (a child subreaper): the agent reaps it
  and reads its real exit status as for a rank it started itself. The rank leads a new session
  (its own process group: the agent's group kill reaches its whole tree).
* **A fresh process in all that a script can see**: ``os.environ`` is the rank's (variables read
  at import time by the preloaded modules keep the server's values, which are the job's), stdout
  and stderr go to the rank's log, stdin is ``/dev/null``, ``sys.argv``, ``sys.path[0]``, the
  working directory and ``__main__`` are as ``python script.py`` would make them, ``random`` and
  numpy's global generator are reseeded, and at the end non-daemon threads are joined and
  ``atexit`` handlers run before the exit status is set as Python sets it. Not reseeded: the
  string hash seed (shared with the server; ``PYTHONHASHSEED`` of the rank is not applied).

Protocol, on the inherited socket ``--fd``: the server sends one JSON line when it is ready
(``{"ready": ..., "preloaded": [...], "failed": {...}}``), then answers each request line
(``{"argv": [...], "env": {...}, "cwd": ..., "log_path": ...}``) with ``{"pid": N}`` or
``{"error": "..."}``. It exits when the agent closes the socket. Only the standard library is used:
the job's interpreter need not have recoverd installed.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import gc
import importlib
import io
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import traceback
from dataclasses import dataclass
from types import CodeType
from typing import Any


def native_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def fork_hazard() -> str | None:
    """Why forking now would be unsafe, or None."""
    threads = native_threads()
    if threads != 1:
        return f"{threads} threads are running in the warm-start server (a fork keeps only one)"
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return "CUDA was initialised in the warm-start server"
    return None


def preload(modules: list[str]) -> tuple[list[str], dict[str, str]]:
    loaded: list[str] = []
    failed: dict[str, str] = {}
    for name in modules:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except BaseException as err:  # a module that cannot load is reported, not fatal
            failed[name] = f"{type(err).__name__}: {err}"[:300]
    return loaded, failed


def warm_up_torch() -> None:
    """Pay PyTorch's first-use costs once, here, not in every forked rank: the first layer built,
    backward pass, optimizer steps and ``torch.save``/``load`` took ~45 ms more in a fork than in
    a warm process. One intra-op thread meanwhile, so no thread pool is started."""
    import io

    import torch
    from torch import nn

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
        for optimizer in (
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
            torch.optim.Adam(model.parameters()),
        ):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.tensor([0, 1, 0, 1])).backward()
            optimizer.step()
        buffer = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=False)
    finally:
        torch.set_num_threads(threads)


def warm_up_is_safe() -> bool:
    """Whether :func:`warm_up_torch` leaves this process fork-safe, tried in a throwaway child
    first: on some builds a backward pass starts the CUDA driver or device threads, and that
    cannot be undone here (the server then forks without the warm-up)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            warm_up_torch()
            verdict = b"1" if fork_hazard() is None else b"0"
        except BaseException:
            verdict = b"0"
        os.write(write_fd, verdict)
        os._exit(0)
    os.close(write_fd)
    verdict = os.read(read_fd, 1)
    os.close(read_fd)
    os.waitpid(pid, 0)
    return verdict == b"1"


def _reseed() -> None:
    """A forked rank would otherwise share the server's random state with every other rank."""
    rand = sys.modules.get("random")
    if rand is not None:
        rand.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            numpy.random.seed()
        except Exception:  # an odd numpy build: leave its generator alone
            pass


#: Identity first: if the rank's environment does not fit the room, these still show.
_FIRST = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "RECOVERD_")


def _initial_areas() -> tuple[tuple[int, int], tuple[int, int]] | None:
    """Where the kernel put this process's argv and environment strings (``/proc/self/stat``
    fields 48-51): what ``/proc/<pid>/cmdline`` and ``/proc/<pid>/environ`` show, forever."""
    try:
        with open("/proc/self/stat") as stat:
            text = stat.read()
        fields = text[text.rindex(")") + 2 :].split()
        arg_start, arg_end, env_start, env_end = (int(fields[i - 3]) for i in (48, 49, 50, 51))
    except (OSError, ValueError, IndexError):
        return None
    return (arg_start, arg_end), (env_start, env_end)


def _rewrite(area: tuple[int, int], entries: list[bytes]) -> None:
    """Write NUL-terminated ``entries`` over one of those areas, as many as fit, NUL-padded."""
    start, end = area
    size = end - start
    if size <= 1:
        return
    data = b""
    for entry in entries:
        piece = entry.replace(b"\0", b"") + b"\0"
        if len(data) + len(piece) > size - 1:
            break
        data += piece
    ctypes.memmove(start, data.ljust(size, b"\0"), size)


def show_as_rank(argv: list[str], env: dict[str, str]) -> None:
    """Make ``ps`` and ``/proc/<pid>/environ`` show the rank's command line and environment, not
    the server's (as setproctitle does): tools and operators find a rank by them. The server was
    started with room to spare in both areas. Called once ``os.environ`` has been replaced, so no
    C-level environment entry points into the old strings any more."""
    areas = _initial_areas()
    if areas is None:
        return
    ordered = sorted(env.items(), key=lambda kv: not kv[0].startswith(_FIRST))
    _rewrite(areas[0], [a.encode(errors="surrogateescape") for a in argv])
    _rewrite(areas[1], [f"{k}={v}".encode(errors="surrogateescape") for k, v in ordered])


def _exit_status(err: SystemExit) -> int:
    """What Python's own exit would make of ``sys.exit(code)``."""
    code = err.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def make_ahead() -> None:
    """In a standby that has waited a while: make the rendezvous store the rank's recoverd trainer
    asks for first (``taskd_client.pytorch.store.make_ahead``: connected, following the run's
    rendezvous prefix), when the server preloaded that client. The replacement's first etcd
    requests, on the recovery's critical path, then pay for no connection and its join of the next
    generation is one request. Never fails the standby: without it the rank connects as usual."""
    store = sys.modules.get("taskd_client.pytorch.store")
    endpoints, job, run = (os.environ.get(k) for k in ("RECOVERD_ETCD", "RECOVERD_JOB", "RECOVERD_RUN"))
    if store is None or not (endpoints and job and run):
        return
    try:
        from recoverd.keys import Keyspace, RunRef

        keys = Keyspace(os.environ.get("RECOVERD_PREFIX") or Keyspace().prefix)
        prefix = keys.rendezvous_prefix(RunRef(job, run))
        store.make_ahead(endpoints, prefix)
        print(f"warm-start standby {os.getpid()}: etcd store made ahead ({prefix})", flush=True)
    except Exception as err:  # a bad variable, say: the rank will report it itself
        print(f"warm-start standby {os.getpid()}: no store made ahead: {err!r}", file=sys.stderr, flush=True)


def _set_priority(nice: int) -> None:
    """Every thread of this process at ``nice``: Linux sets it per thread, and threads the standby
    started (its store's) may run at another priority."""
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.setpriority(os.PRIO_PROCESS, tid, nice)


@dataclass(frozen=True, slots=True)
class Precompiled:
    """The job's script compiled by a standby while it waited: ``runpy`` compiles it on every run
    (no ``.pyc`` for a script), ~5 ms of a replacement's critical path for a 300-line one."""

    #: The script as the job's command names it (``sys.argv[0]``, ``__file__``), relative to the cwd.
    name: str
    #: (mtime in ns, size) when it was read: an edited script is compiled afresh, as runpy would.
    stamp: tuple[int, int]
    code: CodeType

    @classmethod
    def of(cls, name: str) -> Precompiled | None:
        """``name`` compiled as ``runpy.run_path`` compiles it, or None (no such file, not a
        plain script, a syntax error: the rank's own run then reports it)."""
        try:
            stat = os.stat(name)
            with io.open_code(name) as source:
                # dont_inherit: not this module's ``from __future__`` imports, which the script has not.
                code = compile(source.read(), name, "exec", dont_inherit=True)
        except (OSError, SyntaxError, ValueError):
            return None
        return cls(name, (stat.st_mtime_ns, stat.st_size), code)

    def code_for(self, name: str) -> CodeType | None:
        """The code if ``name`` is this script, unchanged since it was compiled."""
        try:
            stat = os.stat(name)
        except OSError:
            return None
        return self.code if name == self.name and (stat.st_mtime_ns, stat.st_size) == self.stamp else None


def _run_script(script: str, precompiled: Precompiled | None) -> None:
    """``runpy.run_path(script, run_name="__main__")``, with the standby's compiled code when it is
    still the script's (runpy's own steps, minus reading and compiling the file)."""
    code = precompiled.code_for(script) if precompiled is not None else None
    run_module_code = getattr(runpy, "_run_module_code", None)
    if code is None or run_module_code is None:
        runpy.run_path(script, run_name="__main__")
        return
    run_module_code(code, None, "__main__", pkg_name="", script_name=script)


def _take_environment(env: dict[str, str]) -> None:
    """``os.environ`` becomes ``env``, changing only what differs: a standby's store thread may be
    running (make_ahead), and each setenv or unsetenv is a moment in which C code reading the
    environment on another thread could see it half-written; the rank's variables are a few."""
    for key in [key for key in os.environ if key not in env]:
        del os.environ[key]
    for key, value in env.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def become_rank(request: dict[str, Any], server_fd: int, precompiled: Precompiled | None = None) -> None:
    """In the forked rank: take the rank's identity, run the script, exit as Python would. Never returns."""
    code = 1
    try:
        if "nice" in request:  # the server may run ahead of the job for the CPU; the rank must not
            _set_priority(int(request["nice"]))
        if server_fd >= 0:
            os.close(server_fd)
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        log_path = request.get("log_path")
        if log_path:
            target = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(target, 1)
            os.dup2(target, 2)
            os.close(target)
        _take_environment(request["env"])
        show_as_rank(request.get("cmdline") or [], request["env"])
        if request.get("cwd"):
            os.chdir(request["cwd"])
        _reseed()
        argv: list[str] = request["argv"]
        module = request.get("module")
        if module:
            sys.argv = [module, *argv]
            sys.path[0] = os.getcwd()
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            script = argv[0]
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            _run_script(script, precompiled)
        code = 0
    except SystemExit as err:
        code = _exit_status(err)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 128 + signal.SIGINT
    except BaseException:  # the script's uncaught exception: printed as Python prints it
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # join non-daemon threads, as Python does
        atexit._run_exitfuncs()
    except BaseException:  # an exit handler's error must not lose the status
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _double_fork(child: Any) -> int | None:
    """Fork twice so that the grandchild is re-parented to the agent (a child subreaper), run
    ``child()`` in it (never returns), and return its pid (None: a fork failed)."""
    read_fd, write_fd = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(read_fd)
        try:
            pid = os.fork()
        except OSError:
            os._exit(1)
        if pid == 0:
            os.close(write_fd)
            child()
            os._exit(1)  # child() never returns; if it did, this is no rank
        os.write(write_fd, str(pid).encode())
        os._exit(0)
    os.close(write_fd)
    text = _read_all(read_fd).decode()
    os.close(read_fd)
    os.waitpid(middle, 0)  # the grandchild is the agent's child once this has returned
    return int(text) if text.isdigit() else None


#: A standby makes its rank's etcd store (make_ahead) once it has waited this long unused: not in a
#: burst of replacements, where it would take the CPU from the one just started.
MAKE_AHEAD_AFTER_S = 0.5
#: In a standby's command line (``ps``), before the server's pid.
STANDBY_FLAG = "--standby-of"


class Standby:
    """One process forked ahead, waiting on a pipe for the request that makes it a rank: a
    replacement then starts without waiting for a fork (~30-50 ms of page-table copying for a
    process with torch imported, on the recovery's critical path). It is forked again after each
    use, once the answer has been sent. It exits when the server does (the pipe's end closes)."""

    def __init__(self, server_fd: int, job_nice: int | None = None, script: str | None = None) -> None:
        self.server_fd = server_fd
        self.job_nice = job_nice
        #: The job's script as its command names it (None: ``-m module``): compiled while waiting.
        self.script = script
        self.pid: int | None = None
        self._write_fd: int | None = None

    def replenish(self) -> None:
        if self.pid is not None or fork_hazard():
            return
        read_fd, write_fd = os.pipe()
        server = os.getpid()

        def wait_for_request() -> None:
            os.close(write_fd)
            os.close(self.server_fd)  # the agent must see the server's end when the server dies
            areas = _initial_areas()
            if areas is not None:  # ps tells it from the server: "... warmstart_server.py --standby-of N"
                shown = (sys.executable, os.path.abspath(__file__), STANDBY_FLAG, str(server))
                _rewrite(areas[0], [part.encode(errors="surrogateescape") for part in shown])
            if self.job_nice is not None:  # waiting, it is the job's; the server runs ahead of it
                _set_priority(self.job_nice)
            # A request in the first moments (a burst of replacements) is served at once; a standby
            # still waiting afterwards makes its rank's store and compiles the script, off any
            # recovery's critical path.
            precompiled = None
            if not select.select([read_fd], [], [], MAKE_AHEAD_AFTER_S)[0]:
                make_ahead()
                precompiled = Precompiled.of(self.script) if self.script else None
                if precompiled is not None:
                    print(f"warm-start standby {os.getpid()}: script compiled ahead ({self.script})", flush=True)
            try:
                raw = _read_all(read_fd)
                request = json.loads(raw) if raw else None
            except BaseException:
                request = None
            if not isinstance(request, dict):
                os._exit(0)  # the server is gone (or sent nothing): never became a rank
            os.close(read_fd)
            become_rank(request, -1, precompiled)

        pid = _double_fork(wait_for_request)
        os.close(read_fd)
        if pid is None:
            os.close(write_fd)
            return
        self.pid, self._write_fd = pid, write_fd

    def take(self, request: dict[str, Any]) -> int | None:
        """Hand ``request`` to the standby: its pid, or None if it is gone (then fork afresh)."""
        if self.pid is None or self._write_fd is None:
            return None
        pid, write_fd = self.pid, self._write_fd
        self.pid = self._write_fd = None
        try:
            data = memoryview(json.dumps(request).encode())
            while data:  # the standby reads as we write: a request over the pipe's buffer is fine
                data = data[os.write(write_fd, data) :]
        except OSError:
            return None  # it died (BrokenPipe): nothing was handed over
        finally:
            os.close(write_fd)
        return pid


def fork_rank(request: dict[str, Any], server_fd: int, standby: Standby | None = None) -> dict[str, Any]:
    """The rank, from the standby or forked now (twice, so that it is re-parented to the agent):
    ``{"pid": rank}``."""
    hazard = fork_hazard()
    if hazard:
        return {"error": hazard}
    pid = standby.take(request) if standby is not None else None
    if pid is None:
        pid = _double_fork(lambda: become_rank(request, server_fd))
    if pid is None:
        return {"error": "the fork failed"}
    return {"pid": pid}


def serve(sock: socket.socket, modules: list[str], job_nice: int | None = None, script: str | None = None) -> int:
    loaded, failed = preload(modules)
    warmed_up = "torch" in loaded and fork_hazard() is None and warm_up_is_safe()
    if warmed_up:
        warm_up_torch()
    gc.collect()
    gc.freeze()  # the preloaded objects stay out of every collection: fewer pages copied per rank
    reader = sock.makefile("rb")
    hello = {
        "ready": True,
        "pid": os.getpid(),
        "preloaded": loaded,
        "failed": failed,
        "warmed_up": warmed_up,
        "hazard": fork_hazard(),
    }
    sock.sendall((json.dumps(hello) + "\n").encode())
    standby = Standby(sock.fileno(), job_nice, script)
    standby.replenish()
    for line in reader:
        try:
            request = json.loads(line)
            answer = fork_rank(request, sock.fileno(), standby)
        except Exception as err:  # a bad request is answered, never fatal
            answer = {"error": f"{type(err).__name__}: {err}"[:300]}
        sock.sendall((json.dumps(answer) + "\n").encode())
        standby.replenish()  # after the answer: off the critical path of this rank
    return 0  # the agent closed the socket: it is gone or stopping


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="the socket inherited from the agent")
    parser.add_argument("--path0", default="", help="sys.path[0] as the job's command would have it")
    parser.add_argument("--preload", default="", help="modules to import, comma-separated")
    parser.add_argument(
        "--job-nice", type=int, default=None, help="the job's nice value: a standby waits at it (not at the server's)"
    )
    parser.add_argument("--script", default=None, help="the job's script as its command names it: standbys compile it")
    parser.add_argument("--room", default="", help="padding: room for a rank's command line (show_as_rank)")
    args = parser.parse_args(argv)
    # This file's directory must not shadow the job's modules (agent.py, settings.py, ...).
    sys.path[0] = args.path0 or os.getcwd()
    sock = socket.socket(fileno=args.fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C at the terminal is the agent's to handle
    return serve(sock, [m for m in args.preload.split(",") if m], args.job_nice, args.script)


if __name__ == "__main__":
    sys.exit(main())
