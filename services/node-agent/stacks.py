"""Capture the Python stacks of rank processes before a hung rank is stopped: py-spy, else faulthandler.

For each target, in parallel, under one deadline:

1. **py-spy** when it is installed (on ``PATH`` or beside ``sys.executable``): ``py-spy dump
   --nonblocking --pid PID``, an argv list, no shell. ``--nonblocking`` reads the process's memory
   without suspending it: without it py-spy fails on a SIGSTOPped process ("Failed to suspend
   process"), and it never pauses a rank that might still be working. py-spy can fail right after
   a process starts (the interpreter is not found in memory yet): one retry. It needs ptrace
   rights on the target (root, ``CAP_SYS_PTRACE``, or the same user with
   ``kernel.yama.ptrace_scope=0``); a refusal is recorded as such.
2. Else, or when py-spy failed, **faulthandler**, but only for a process whose client armed it
   (``taskd_client.stackdump.arm`` gave the agent the signal and the dump file): the agent checks
   that the process holds that file open for appending (``/proc/PID/fd``: it is the process that
   armed it, not a stranger that got its pid), truncates the file through that descriptor, sends
   the signal and reads the file once it stops growing. A process that did not arm faulthandler
   is **never** signalled: the default action of SIGUSR2 kills. A stopped process (state ``T``)
   cannot run its handler until it is continued: that is recorded at once instead of waited for.

Nothing here raises for a target: every failure becomes the stack's ``error``. No process is
stopped, continued or killed. Waiting for the dump to stop growing is a short poll of the file's
size (faulthandler writes a dump in microseconds from inside the signal handler; there is no end
marker to wait for).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from recoverd import hangstacks, stackgroups
from recoverd.records import pb

__all__ = ["STOPPED", "StackTarget", "capture_stacks", "find_py_spy"]

#: The error of a stopped process that could only be read through faulthandler.
STOPPED = "process is stopped (SIGSTOP); faulthandler cannot run"
PERMISSION = (
    "py-spy: permission denied: reading another process's memory needs ptrace rights"
    " (run the agent as root or with CAP_SYS_PTRACE; containers: --cap-add SYS_PTRACE)"
)
_RETRY_S = 0.2
_POLL_S = 0.01
_QUIET_S = 0.05


@dataclass(frozen=True, slots=True)
class StackTarget:
    """A process to read: its rank, pid, and what its client armed (``stackdump.arm``), if anything."""

    rank: int
    pid: int
    stack_signal: int | None = None
    dump_path: str | None = None


def find_py_spy() -> str | None:
    """py-spy on ``PATH``, else beside this interpreter (a venv's ``bin``), else None."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


async def capture_stacks(
    targets: Sequence[StackTarget],
    timeout_s: float = 5.0,
    *,
    py_spy: str | bool = True,
    max_text_bytes: int = hangstacks.MAX_TEXT_BYTES,
    max_bytes: int = hangstacks.MAX_STACKS_BYTES,
) -> list[pb.RankStack]:
    """One ``RankStack`` per target, in the targets' order, within ``timeout_s`` in all.

    ``py_spy``: True finds it (:func:`find_py_spy`), False never uses it, a string is its path.
    The result is :func:`hangstacks.bounded` with ``targets[0]`` (the hung rank) kept whole, so a
    fault record carrying it stays far below the 256 KiB a value may take. Never raises, except
    ``CancelledError``.
    """
    tool = find_py_spy() if py_spy is True else (py_spy or None)
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(_capture_one(t, tool, deadline, timeout_s)) for t in targets]
    stacks = [task.result() for task in tasks]
    keep = targets[0].rank if targets else None
    return hangstacks.bounded(stacks, keep_rank=keep, max_text_bytes=max_text_bytes, max_bytes=max_bytes)


async def _capture_one(target: StackTarget, tool: str | None, deadline: float, timeout_s: float) -> pb.RankStack:
    stack = pb.RankStack(rank=target.rank, pid=target.pid)
    try:
        state = _state(target.pid)
        if state is None:
            stack.error = f"process {target.pid} is gone"
            return stack
        if state == "Z":
            stack.error = f"process {target.pid} has exited (a zombie not yet reaped)"
            return stack
        errors = []
        if tool:
            stack.tool = "py-spy"
            text, error = await _py_spy(tool, target.pid, deadline, timeout_s)
            if text:
                return _with_text(stack, text)
            errors.append(error)
        if target.stack_signal is not None and target.dump_path:
            stack.tool = "faulthandler"
            text, error = await _faulthandler(target, deadline, timeout_s)
            if text:
                return _with_text(stack, text)
            errors.append(error)
        elif not tool:
            errors.append(
                "no tool: py-spy is not installed (pip install 'recoverd[stacks]') and the process"
                " did not arm faulthandler (taskd_client.stackdump.arm)"
            )
        else:
            errors.append("faulthandler: not armed by the process (taskd_client.stackdump.arm)")
        stack.error = "; ".join(errors)
    except Exception as err:  # a stack is a diagnosis: it never stops the stop of a hung rank
        stack.error = f"internal error: {err!r}"
    return stack


def _with_text(stack: pb.RankStack, text: str) -> pb.RankStack:
    stack.where = stackgroups.where(text)  # from the whole text, before any cut
    stack.text = text
    stack.error = ""
    return stack


def _state(pid: int) -> str | None:
    """The process's state letter from /proc/PID/stat (``R``, ``S``, ``D``, ``T``, ``Z``...); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    rest = raw[raw.rfind(b")") + 1 :].split()
    return rest[0].decode() if rest else None


def _py_spy_error(stderr: bytes, returncode: int | None) -> str:
    """py-spy's message without its Rust backtrace, on one line."""
    lines = []
    for line in stderr.decode(errors="replace").splitlines():
        if line.strip().startswith("Stack backtrace"):
            break
        if line.strip():
            lines.append(line.strip())
    message = " ".join(lines) or f"exited {returncode} with no output"
    return message.removeprefix("Error: ")[:300]


async def _py_spy(tool: str, pid: int, deadline: float, timeout_s: float) -> tuple[str, str]:
    """(text, "") or ("", why not)."""
    loop = asyncio.get_running_loop()
    error = ""
    for attempt in (1, 2):
        left = deadline - loop.time()
        if left <= 0:
            break
        try:
            proc = await asyncio.create_subprocess_exec(
                tool,
                "dump",
                "--nonblocking",
                "--pid",
                str(pid),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as spawn_error:
            return "", f"py-spy: cannot run {tool}: {spawn_error.strerror or spawn_error}"
        try:
            async with asyncio.timeout(left):
                out, stderr = await proc.communicate()
        except TimeoutError:
            return "", f"py-spy: no answer within {timeout_s:g}s"
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        text = out.decode(errors="replace")
        if proc.returncode == 0 and stackgroups.parse(text).threads:
            return text, ""
        message = _py_spy_error(stderr, proc.returncode)
        if "permission denied" in message.lower() or "operation not permitted" in message.lower():
            return "", PERMISSION
        error = f"py-spy: {message}"
        if _state(pid) is None:
            return "", f"process {pid} is gone"
        if attempt == 1:
            await asyncio.sleep(min(_RETRY_S, max(0.0, deadline - loop.time())))
    return "", error or f"py-spy: no answer within {timeout_s:g}s"


def _dump_fd(pid: int, path: str) -> str:
    """``/proc/PID/fd/N`` of the descriptor through which process ``pid`` writes ``path`` (opened
    for appending, as ``stackdump.arm`` does), or ``""`` when it holds no such descriptor."""
    wanted = os.path.realpath(path)
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            if os.readlink(f"{fd_dir}/{fd}") != wanted:
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                flags = next((int(line.split()[1], 8) for line in info if line.startswith("flags:")), 0)
        except (OSError, ValueError, IndexError):
            continue
        if flags & os.O_APPEND and flags & (os.O_WRONLY | os.O_RDWR):
            return f"{fd_dir}/{fd}"
    return ""


async def _faulthandler(target: StackTarget, deadline: float, timeout_s: float) -> tuple[str, str]:
    """(text, "") or ("", why not). Signals only a running process that holds its dump file open.

    The path comes from the rank's client, so it is not trusted: the file is reached through the
    process's own descriptor (``/proc/PID/fd/N``, whatever the path names now), and must be a
    regular file of the process's user. The agent then truncates and reads only what that process
    could truncate and read itself.
    """
    assert target.stack_signal is not None and target.dump_path
    pid, path = target.pid, target.dump_path
    if _state(pid) in ("T", "t"):
        return "", STOPPED
    try:
        link = _dump_fd(pid, path)
        if not link:
            return "", (
                f"faulthandler: process {pid} does not hold {path} open for appending: it did not arm"
                " faulthandler (or the pid is another process now); not signalled"
            )
        info, owner = os.stat(link), os.stat(f"/proc/{pid}").st_uid
        if not stat.S_ISREG(info.st_mode) or info.st_uid != owner:
            return "", f"faulthandler: {path} is not a regular file of the process's user; not signalled"
        fd = os.open(link, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        return "", f"faulthandler: cannot check that process {pid} armed it ({err.strerror}); not signalled"
    try:
        try:
            os.ftruncate(fd, 0)  # the writer's descriptor is O_APPEND: the dump starts at offset 0
            os.kill(pid, target.stack_signal)
        except ProcessLookupError:
            return "", f"process {pid} is gone"
        except OSError as err:
            return "", f"faulthandler: cannot truncate {path} or signal process {pid}: {err.strerror}"
        text = await _read_dump(fd, deadline)
    finally:
        os.close(fd)
    if text:
        return text, ""
    state = _state(pid)
    hint = " (state D: uninterruptible sleep runs no signal handler until it wakes)" if state == "D" else ""
    return "", f"faulthandler: no dump within {timeout_s:g}s, process state {state or 'gone'}{hint}"


async def _read_dump(fd: int, deadline: float, limit: int = 1 << 20) -> str:
    """The file's text once it is non-empty and has not grown for a short quiet period (at most
    ``limit`` bytes: faulthandler's dump is a few KiB, ~100 KiB for 100 deep threads)."""
    loop = asyncio.get_running_loop()
    size, since = -1, loop.time()
    while True:
        now = loop.time()
        current = os.fstat(fd).st_size
        if current != size:
            size, since = current, now
        elif size > 0 and now - since >= _QUIET_S:
            break
        if now >= deadline:
            if size <= 0:
                return ""
            break
        await asyncio.sleep(_POLL_S)
    return os.pread(fd, min(size, limit), 0).decode(errors="replace")
