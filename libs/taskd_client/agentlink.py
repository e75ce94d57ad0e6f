"""A rank's part in recoverd's protocol through its node agent (docs/adr/0036).

Instead of a ``DLRecoverManager`` per rank (etcd writes per rank) or one client that relays to the
others (ADR 0032), every rank joins through the agent of its node, which answers each phase once
for all of its ranks. :class:`AgentLink` is the rank's end: a daemon thread connected to the
agent's socket (``RECOVERD_RANKS_SOCKET``, set by the agent), which joins with the strategies the
rank offers and hands every signal to ``on_signal(signal, reply)``; ``reply(code, message)`` answers
it, at once or later from any thread (0: done).

When the connection breaks (the agent restarted) the link reconnects and joins again, backing off
up to :data:`RECONNECT_MAX_S`; the restarted agent binds the same name (stable per run and node).
Nothing here ever raises into the training loop: a link that cannot connect leaves the rank out of
the protocol, and the agent answers as for a rank without a client.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

from recoverd.errors import BadRecord
from recoverd.rankwire import (
    ADDRESS_ENV,
    MAX_MESSAGE,
    RankFault,
    Signal,
    encode_answer,
    encode_fault,
    encode_join,
    parse_from_agent,
    sockaddr,
)

__all__ = ["RECONNECT_MAX_S", "AgentLink", "Reply"]

log = logging.getLogger(__name__)

RECONNECT_MIN_S = 0.05
RECONNECT_MAX_S = 1.0
#: ``reply(code, message)``
Reply = Callable[[int, str], None]


class AgentLink:
    """See the module docstring. ``address``: the agent's socket (default: ``$RECOVERD_RANKS_SOCKET``)."""

    def __init__(
        self,
        rank: int,
        offer: tuple[str, ...],
        on_signal: Callable[[Signal, Reply], None],
        address: str | None = None,
    ) -> None:
        self.rank = rank
        self.offer = offer
        self.on_signal = on_signal
        self.address = address if address is not None else os.environ.get(ADDRESS_ENV, "")
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._joined = threading.Event()
        self._thread = threading.Thread(target=self._run, name="recoverd-agent-link", daemon=True)
        #: Messages from the agent that did not parse (dropped).
        self.dropped = 0

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def start(self) -> None:
        if self.enabled:
            self._thread.start()

    def wait_joined(self, timeout_s: float) -> bool:
        """True once the join was sent on a live connection (tests and start-up checks)."""
        return self._joined.wait(timeout_s)

    def close(self) -> None:
        """Leave the protocol; idempotent."""
        self._closed.set()
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        delay = RECONNECT_MIN_S
        while not self._closed.is_set():
            sock = self._connect()
            if sock is None:
                self._closed.wait(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)
                continue
            delay = RECONNECT_MIN_S
            self._read(sock)
            self._joined.clear()
            with self._lock:
                if self._sock is sock:
                    self._sock = None
            sock.close()

    def _connect(self) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.connect(sockaddr(self.address))
            sock.send(encode_join(self.rank, self.offer))
        except OSError:
            sock.close()
            return None
        with self._lock:
            if self._closed.is_set():
                sock.close()
                return None
            self._sock = sock
        self._joined.set()
        return sock

    def _read(self, sock: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                data = sock.recv(MAX_MESSAGE)
            except OSError:
                return
            if not data:
                return  # the agent is gone: reconnect (a restarted agent binds the same name)
            try:
                signal = parse_from_agent(data)
            except BadRecord as err:
                self.dropped += 1
                log.warning("rank %d: a message from the agent was dropped: %s", self.rank, err.detail)
                continue
            try:
                self.on_signal(signal, self._replier(signal.signal_id))
            except Exception as err:  # the handler's failure is this rank's answer
                log.exception("rank %d: handling %s failed", self.rank, signal.kind)
                self._replier(signal.signal_id)(1, f"{type(err).__name__}: {err}")

    def report_fault(self, fault: RankFault) -> bool:
        """Tell the agent this rank hit a retryable fault (it reports it as this rank's fault);
        False when the rank is not connected to its agent now (then nobody hears of it)."""
        with self._lock:
            sock = self._sock
            if sock is None or not self._joined.is_set():
                return False
            try:
                sock.send(encode_fault(fault))
            except OSError as err:
                log.warning("rank %d: fault %s not sent: %s", self.rank, fault.fault_id, err)
                return False
        return True

    def _replier(self, signal_id: str) -> Reply:
        def reply(code: int, message: str) -> None:
            with self._lock:
                sock = self._sock
                if sock is None:
                    return  # reconnecting: the agent sends the signal again once the rank joined
                try:
                    sock.send(encode_answer(signal_id, code, message))
                except OSError as err:
                    log.warning("rank %d: answer to %s not sent: %s", self.rank, signal_id, err)

        return reply
