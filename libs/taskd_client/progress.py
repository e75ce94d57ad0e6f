"""Progress reports from a training script to its node's agent, for hang and straggler detection.

One line in a training loop is enough::

    import taskd_client
    for step in range(steps):
        train_one_step()
        taskd_client.heartbeat(step)

A report is one small datagram on the local agent's socket (``RECOVERD_PROGRESS_SOCKET``, set by
the agent for every rank it starts): it never blocks, never raises, and costs microseconds; at most
one is sent per :data:`MIN_INTERVAL_S` (the step number carries what was skipped). Without an agent
(the variable unset) every call does nothing, so a script runs the same under plain ``python``.

Progress means the step number changed: call it from the training loop, not from a timer thread,
or a hung loop would look alive. The first report also arms ``faulthandler`` on a signal the
agent may send to collect this process's Python stacks before a hung rank is stopped
(``taskd_client.stackdump``), and tells the agent which signal it is, so the agent never sends a
signal nobody handles.
"""

from __future__ import annotations

import json
import operator
import os
import socket
import threading
import time

__all__ = ["MIN_INTERVAL_S", "ProgressReporter", "done", "heartbeat", "waiting"]

#: At most one report per this many seconds (a waiting report is always sent).
MIN_INTERVAL_S = 0.1


class ProgressReporter:
    """The sending end; :func:`heartbeat` uses one per process."""

    def __init__(self, address: str | None = None, rank: int | None = None, min_interval_s: float = MIN_INTERVAL_S):
        self.address = address if address is not None else os.environ.get("RECOVERD_PROGRESS_SOCKET", "")
        if rank is None:
            try:
                rank = int(os.environ.get("RANK", "-1"))
            except ValueError:
                rank = -1
        self.rank = rank
        self.min_interval_s = min_interval_s
        self._sock: socket.socket | None = None
        self._last_sent = float("-inf")
        self._stack: tuple[int, str] | None = None
        self._armed = False
        self._lock = threading.Lock()
        #: Work reported by calls whose report was not sent (rate limit): added to the next one.
        self._busy_unsent: float | None = None
        #: Reports that could not be sent (no agent listening, its buffer full).
        self.failed = 0

    @property
    def enabled(self) -> bool:
        return bool(self.address) and self.rank >= 0

    def heartbeat(self, step: int | None = None, *, busy_s: float | None = None) -> None:
        """The training loop made progress (``step``: its step number, if it has one; ``busy_s``:
        seconds of this rank's own work since the last report, not counting collective waits)."""
        if not self.enabled:
            return
        try:  # never into the training loop: a numpy or tensor step is taken, anything else ignored
            step = operator.index(step) if step is not None else None
            busy = float(busy_s) if busy_s is not None else None
        except Exception:
            return
        if busy is not None and busy >= 0:
            self._busy_unsent = (self._busy_unsent or 0.0) + busy
        now = time.monotonic()
        if now - self._last_sent < self.min_interval_s:
            return
        if self._send({"step": step, "busy": self._busy_unsent}, now):
            self._busy_unsent = None

    def waiting(self, step: int | None = None) -> None:
        """This rank has been waiting in a collective for a while: if it hangs, it is likelier the
        victim of a peer than the culprit. Call it once per long wait, not in a loop."""
        if self.enabled:
            self._send({"step": step, "wait": 1}, time.monotonic())

    def done(self) -> None:
        """The training loop is over: what follows (saving, tearing down the process group) makes
        no progress and is not a hang. A later heartbeat starts the judging again."""
        if self.enabled:
            self._send({"done": 1}, time.monotonic())

    def _send(self, fields: dict[str, object], now: float) -> bool:
        with self._lock:
            self._arm()
            message = {"v": 1, "rank": self.rank, **{k: v for k, v in fields.items() if v is not None}}
            if self._stack is not None:
                message["sig"], message["dump"] = self._stack
            address = "\0" + self.address[1:] if self.address.startswith("@") else self.address
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
                self._sock.sendto(json.dumps(message, separators=(",", ":")).encode(), address)
                self._last_sent = now
                return True
            except Exception:  # OSError: no agent (yet), or its buffer is full; anything else: ours
                self.failed += 1  # the next report tries again
                return False

    def _arm(self) -> None:
        if self._armed:
            return
        self._armed = True
        try:
            from taskd_client import stackdump
        except ImportError:
            return
        try:
            self._stack = stackdump.arm(self.rank)
        except Exception:  # never into the training script
            self._stack = None


_default: ProgressReporter | None = None
_default_lock = threading.Lock()


def _reporter() -> ProgressReporter:
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = ProgressReporter()
    return _default


def heartbeat(step: int | None = None, *, busy_s: float | None = None) -> None:
    """Report progress to this node's agent (see the module's docstring). Never raises."""
    _reporter().heartbeat(step, busy_s=busy_s)


def done() -> None:
    """Say the training loop is over (see :meth:`ProgressReporter.done`). Never raises."""
    _reporter().done()


def waiting(step: int | None = None) -> None:
    """Say this rank has been waiting in a collective for a while. Never raises."""
    _reporter().waiting(step)
