"""The local channel ranks report progress on: a Unix datagram socket in the abstract namespace.

Why a datagram socket on the node, not etcd: a report per rank per step must cost the training
loop microseconds and never block it (a full buffer drops the report; the client never waits), and
etcd must see only what changes (a hang, a straggler), not every step of every rank.

* **Address**: ``@recoverd-progress-<digest of run uid and node>``, given to ranks as
  ``RECOVERD_PROGRESS_SOCKET``. It is the same for every agent of that run and node, so after an
  agent restart the ranks it adopts keep reporting to the new agent; the kernel frees an abstract
  name when its holder dies (nothing to clean up after a SIGKILL).
* **Who may report**: the kernel attaches the sender's PID (``SO_PASSCRED``); a report counts only
  from the rank's own process or one of its process group (the agent starts each rank as its own
  group). Anything else — another user's process, a malformed or oversized datagram — is dropped
  and counted, never trusted.
* **Format**: one JSON object per datagram (at most :data:`MAX_REPORT` bytes), see
  :func:`parse_report` and ``taskd_client.progress``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass

from recoverd.errors import BadRecord
from recoverd.rankwire import node_socket_address, sockaddr, versioned_object

__all__ = ["MAX_REPORT", "ProgressReport", "ProgressSocket", "address_for", "parse_report", "sender_belongs"]

#: Largest datagram read; longer ones are cut by the kernel and then fail to parse (dropped).
MAX_REPORT = 4096
_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid
#: Datagrams read before the receive loop lets the agent's other tasks run.
_BATCH = 64


def address_for(run_uid: str, node: str) -> str:
    """The progress socket's address (``rankwire.node_socket_address``)."""
    return node_socket_address("progress", run_uid, node)


@dataclass(frozen=True, slots=True)
class ProgressReport:
    """One report, with the sender the kernel vouches for."""

    sender_pid: int
    rank: int
    step: int | None
    #: The rank waits in a collective (sent by clients that know, e.g. the PyTorch trainer).
    waiting: bool = False
    #: Seconds of the rank's own work since its previous report (excluding collective waits).
    busy_s: float | None = None
    #: The training loop is over: no more progress is expected (saving, tearing down).
    done: bool = False
    #: The signal the client armed ``faulthandler`` on, and the file it dumps to.
    stack_signal: int | None = None
    stack_path: str | None = None


def parse_report(data: bytes, sender_pid: int) -> ProgressReport:
    """Decode one datagram; raise BadRecord with the reason for anything else."""
    fields = versioned_object(data, MAX_REPORT, "progress report")

    def integer(name: str, low: int = 0, high: int = 2**62) -> int | None:
        value = fields.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise BadRecord(f"progress report field {name!r} is not an integer in {low}..{high}: {value!r}")
        return value

    rank = integer("rank")
    if rank is None:
        raise BadRecord("progress report has no rank")
    busy = fields.get("busy")
    if busy is not None and (isinstance(busy, bool) or not isinstance(busy, int | float) or not 0 <= busy < 1e9):
        raise BadRecord(f"progress report field 'busy' is not a duration: {busy!r}")
    path = fields.get("dump")
    if path is not None and (not isinstance(path, str) or not path.startswith("/") or "\0" in path):
        raise BadRecord("progress report field 'dump' is not an absolute path")
    return ProgressReport(
        sender_pid=sender_pid,
        rank=rank,
        step=integer("step"),
        waiting=bool(fields.get("wait", False)),
        done=bool(fields.get("done", False)),
        busy_s=float(busy) if busy is not None else None,
        stack_signal=integer("sig", 1, 64),
        stack_path=path,
    )


class ProgressSocket:
    """The agent's end: bound once, read with the event loop (no thread)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._sock: socket.socket | None = None
        #: Datagrams dropped since the last :meth:`take_dropped` (undecodable or no credentials).
        self.dropped = 0
        self.last_problem = ""
        self._last_batch = 0

    def open(self) -> None:
        """Bind; raises OSError (e.g. EADDRINUSE while a previous agent of this node still runs)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            sock.bind(sockaddr(self.address))
        except OSError:
            sock.close()
            raise
        self._sock = sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def take_dropped(self) -> tuple[int, str]:
        dropped, problem = self.dropped, self.last_problem
        self.dropped, self.last_problem = 0, ""
        return dropped, problem

    async def reports(self) -> AsyncIterator[ProgressReport]:
        """Every well-formed report, as it arrives."""
        sock = self._sock
        assert sock is not None, "open() first"
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        loop.add_reader(sock.fileno(), ready.set)
        try:
            while True:
                await ready.wait()
                ready.clear()
                while True:
                    batch = self.pending(limit=_BATCH)
                    for report in batch:
                        yield report
                    if self._last_batch < _BATCH:
                        break
                    await asyncio.sleep(0)  # a flood of datagrams must not hold up the agent's loop
        finally:
            loop.remove_reader(sock.fileno())

    def pending(self, limit: int = 100_000) -> list[ProgressReport]:
        """The reports queued now (at most ``limit`` datagrams read), without waiting."""
        sock = self._sock
        reports: list[ProgressReport] = []
        self._last_batch = 0
        if sock is None:
            return reports
        while self._last_batch < limit:
            try:
                data, ancdata, _flags, _addr = sock.recvmsg(MAX_REPORT, socket.CMSG_SPACE(_CREDS.size))
            except (BlockingIOError, InterruptedError):
                break
            self._last_batch += 1
            report = self._decode(data, ancdata)
            if report is not None:
                reports.append(report)
        return reports

    def _decode(self, data: bytes, ancdata: list[tuple[int, int, bytes]]) -> ProgressReport | None:
        pid = next(
            (
                _CREDS.unpack(cdata[: _CREDS.size])[0]
                for level, kind, cdata in ancdata
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(cdata) >= _CREDS.size
            ),
            None,
        )
        if pid is None or pid <= 0:
            self.drop("a report without the sender's credentials")
            return None
        try:
            return parse_report(data, pid)
        except BadRecord as err:
            self.drop(f"from pid {pid}: {err.detail}")
            return None

    def drop(self, problem: str) -> None:
        """Count a report that is not taken, keeping the last reason (reported as an event)."""
        self.dropped += 1
        self.last_problem = problem


def sender_belongs(sender_pid: int, rank_pid: int) -> bool:
    """Whether ``sender_pid`` is the rank's process or in its process group (its children, e.g. a
    shell wrapper's python)."""
    if sender_pid == rank_pid:
        return True
    try:
        return os.getpgid(sender_pid) == rank_pid
    except OSError:
        return False
