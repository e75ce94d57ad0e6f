"""Let the node agent read this process's Python stacks when py-spy is not there: faulthandler on a signal.

``arm(rank)`` registers :func:`faulthandler.register` for one signal (``SIGUSR2`` unless
``RECOVERD_STACK_SIGNAL`` names another: ``SIGUSR1``, ``SIGUSR2`` or a real-time signal such as
``SIGRTMIN+2``), writing every thread's stack to a per-process file (``rank<R>-pid<P>.stacks``) in
``RECOVERD_STACK_DIR``, else in ``<tempdir>/recoverd-stacks-<uid>``. It returns ``(signum, path)``,
which the client passes to its agent; the agent sends that signal before it stops a hung rank
(``recoverd.agent.stacks``) and reads the file.

The handler is faulthandler's C handler: it writes the stacks from inside the signal handler, so it
works while the main thread is blocked in C (a collective, ``time.sleep``, a lock) and needs no
GIL, and the process carries on afterwards (``chain=False``: the signal's default action, which
would kill it, never runs).

One dump per signal, read whole: the file is opened with ``O_APPEND``, so each write lands at the
end of the file *as it is now*; the agent truncates the file to 0 before it signals, and the dump
then starts at offset 0. (Without ``O_APPEND`` the writes would continue at the old offset behind a
hole of zero bytes.)

Contract for the training script: :func:`arm` never raises (a failure is logged once and answered
with ``None``: no stacks through faulthandler, training unaffected); it is idempotent within a
process and re-arms with a file of its own in a forked child. A script that later installs its own
Python handler for the same signal (``signal.signal``) replaces faulthandler's; the agent then
finds no dump and says so. Stdlib only.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import stat
import tempfile
from pathlib import Path
from typing import IO

__all__ = ["DIR_ENV", "SIGNAL_ENV", "arm", "parse_signal"]

DIR_ENV = "RECOVERD_STACK_DIR"
SIGNAL_ENV = "RECOVERD_STACK_SIGNAL"

log = logging.getLogger(__name__)

#: pid -> (signum, path, file) of this process's registration. Module state on purpose: faulthandler's
#: registration is itself process-wide, and a forked child (pid differs) must not write into its
#: parent's file.
_armed: dict[int, tuple[int, str, IO[bytes]]] = {}


def parse_signal(value: str) -> int:
    """The signal number ``value`` names (``SIGUSR2``, ``USR2``, ``12``, ``SIGRTMIN+3``).

    Only signals no library relies on are accepted: ``SIGUSR1``, ``SIGUSR2`` and the real-time
    signals. ``SIGTERM``/``SIGINT`` would take over the stop path, ``SIGSEGV`` and its kin are
    faulthandler's own (``enable``). ValueError with the reason otherwise.
    """
    text = value.strip().upper()
    allowed = {int(signal.SIGUSR1), int(signal.SIGUSR2)}
    rtmin, rtmax = int(getattr(signal, "SIGRTMIN", 0)), int(getattr(signal, "SIGRTMAX", -1))
    allowed.update(range(rtmin, rtmax + 1))
    if text.isdigit():
        signum = int(text)
    else:
        name = text if text.startswith("SIG") else f"SIG{text}"
        base, plus, offset = name.partition("+")
        if plus and base in ("SIGRTMIN", "SIGRTMAX") and offset.strip().isdigit():
            signum = int(getattr(signal, base, -1)) + int(offset)
        elif hasattr(signal.Signals, name):
            signum = int(signal.Signals[name])
        else:
            raise ValueError(f"{SIGNAL_ENV}={value!r} names no signal")
    if signum not in allowed:
        raise ValueError(f"{SIGNAL_ENV}={value!r}: only SIGUSR1, SIGUSR2 or SIGRTMIN..SIGRTMAX may carry a stack dump")
    return signum


def _directory() -> Path:
    configured = os.environ.get(DIR_ENV, "").strip()
    if configured:
        path = Path(configured)
        path.mkdir(parents=True, exist_ok=True)
        return path
    path = Path(tempfile.gettempdir()) / f"recoverd-stacks-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    # A shared /tmp: the directory must be ours and not a link someone else planted.
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PermissionError(f"{path} is not a directory owned by uid {os.getuid()}")
    return path


def _arm(rank: int) -> tuple[int, str] | None:
    if not hasattr(faulthandler, "register"):
        raise OSError("faulthandler.register is not available on this platform")
    signum = parse_signal(os.environ.get(SIGNAL_ENV) or "SIGUSR2")
    pid = os.getpid()
    current = _armed.get(pid)
    if current is not None and current[0] == signum:
        return current[0], current[1]
    python_handler = signal.getsignal(signum)
    if callable(python_handler):
        raise RuntimeError(f"signal {signum} already has a Python handler in this process; it is left alone")
    path = _directory() / f"rank{rank}-pid{pid}.stacks"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o600)
    file = os.fdopen(fd, "ab", buffering=0)
    try:
        faulthandler.register(signum, file=file, all_threads=True, chain=False)
    except BaseException:
        file.close()
        raise
    if current is not None and current[0] != signum:
        faulthandler.unregister(current[0])
    for stale in [p for p in _armed if p != pid]:
        del _armed[stale]  # inherited from a parent through fork; the file object stays the parent's
    _armed[pid] = (signum, str(path), file)
    return signum, str(path)


def arm(rank: int) -> tuple[int, str] | None:
    """Arm faulthandler for the agent's stack capture; ``(signum, dump path)`` or None. Never raises."""
    try:
        return _arm(rank)
    except Exception as err:
        log.warning("recoverd: stacks through faulthandler are off for rank %s: %s", rank, err)
        return None
