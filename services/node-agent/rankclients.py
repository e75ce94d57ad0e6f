"""The recovery clients of this node's ranks, joined through the agent's socket (docs/adr/0036).

Each rank that takes part in recoverd's protocol this way connects to the agent's
``SOCK_SEQPACKET`` socket in the abstract namespace (``rankwire.address_for(run, node)``, given to
ranks as ``RECOVERD_RANKS_SOCKET``) and joins with the strategies it offers. The agent then answers
each phase for all of them with one report (``aggregate.py`` has the rules; the agent writes the
reports): :meth:`RankClients.answer` opens the phase's round once, sends the signal to every rank
it waits for, and says how the round stands each time the agent asks (it wakes the agent on every
change, and at the round's deadline).

Trust: the kernel gives the connecting process's PID (``SO_PEERCRED``); a join for rank R counts
only from R's process or its process group (the agent starts each rank as its own group), and an
answer counts only on the connection that joined. Malformed or oversized messages, and refused
joins, are counted and recorded as one event each; they never touch a rank. The name is stable per
(run, node): an agent restarted in place binds it again, and the ranks' clients reconnect and join
again (an abstract name is freed by the kernel when its holder dies).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from recoverd.agent.aggregate import Outcome, Round, declaration, open_round
from recoverd.agent.detectors.progress_socket import sender_belongs
from recoverd.agent.ranktable import RankSlot
from recoverd.errors import BadRecord
from recoverd.rankwire import MAX_MESSAGE, Answer, Join, RankFault, Signal, encode_signal, parse_from_rank, sockaddr

__all__ = ["MAX_CONNECTIONS", "ROUND_TIMEOUT_S", "RankClients"]

log = logging.getLogger(__name__)

#: How long a round waits for its ranks' answers before it fails (the coordinator's own phase
#: deadline still applies; this one makes the node's answer a failure rather than a silence).
ROUND_TIMEOUT_S = 120.0
_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_BACKLOG = 256
#: Messages read from one connection before the loop serves others (a flood must not hold it up).
_BATCH = 64
#: Connections served at once; more are closed at once (a node runs tens of ranks, not thousands).
MAX_CONNECTIONS = 1024


@dataclass(eq=False, slots=True)
class _Conn:
    sock: socket.socket
    pid: int
    rank: int | None = None
    #: Messages dropped on this connection (an event is recorded for the first).
    dropped: int = 0


class RankClients:
    """See the module docstring. ``slots()``: this node's ranks now; ``wake()``: ask the agent to
    reconcile (a join, an answer, a departure, a deadline); ``note(reason, message)``: record an
    event of this node; ``on_fault(rank, fault)``: a joined rank reported a retryable fault of its
    own."""

    def __init__(
        self,
        address: str,
        *,
        slots: Callable[[], Mapping[int, RankSlot]],
        wake: Callable[[], None],
        note: Callable[[str, str], None],
        on_fault: Callable[[int, RankFault], None] = lambda rank, fault: None,
        round_timeout_s: float = ROUND_TIMEOUT_S,
    ) -> None:
        self.address = address
        self._slots = slots
        self._wake = wake
        self._note = note
        self._on_fault = on_fault
        self.round_timeout_s = round_timeout_s
        self._sock: socket.socket | None = None
        self._conns: set[_Conn] = set()
        #: rank -> the connection it joined on.
        self.joined: dict[int, _Conn] = {}
        #: rank -> what its client offers, kept while it restarts (it has not withdrawn it).
        self.offers: dict[int, tuple[str, ...]] = {}
        self.round: Round | None = None
        self._signal: Signal | None = None
        #: Messages dropped (malformed, oversized, before a join, refused joins), in all.
        self.dropped = 0

    # ---------------------------------------------------------------- lifecycle
    def open(self) -> None:
        """Bind and listen; raises OSError (e.g. EADDRINUSE while a previous agent still runs)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        try:
            sock.bind(sockaddr(self.address))
            sock.listen(_BACKLOG)
        except OSError:
            sock.close()
            raise
        self._sock = sock

    async def serve(self) -> None:
        """Accept and read until cancelled; every connection is closed on the way out."""
        sock = self._sock
        assert sock is not None, "open() first"
        loop = asyncio.get_running_loop()
        loop.add_reader(sock.fileno(), self._accept)
        try:
            await asyncio.Future()  # the readers do the work
        finally:
            loop.remove_reader(sock.fileno())
            for conn in list(self._conns):
                self._close(conn)
            sock.close()
            self._sock = None

    # ---------------------------------------------------------------- what the agent asks
    def declaration(self, agent_offer: tuple[str, ...], *, rejoins_alone: bool = True) -> tuple[tuple[str, ...], bool]:
        """(strategies, answers_for_ranks) for the node record (``aggregate.declaration``), over
        the ranks this node holds now."""
        return declaration(agent_offer, self.offers, self._slots().keys(), rejoins_alone=rejoins_alone)

    def answer(
        self, key: tuple[int, str, str], phase: str, strategy: str, uuid: str, faulty: Collection[int]
    ) -> tuple[int, str] | None:
        """The node's answer to the phase ``key`` = (epoch, uuid, phase): None while its ranks are
        still answering, else (code, message). The first call opens the round and signals the ranks."""
        now = time.monotonic()
        if self.round is None or self.round.key != key:
            running = {r for r, s in self._slots().items() if s.is_running}
            self.round = open_round(
                key,
                phase,
                strategy,
                joined=self.joined.keys(),
                running=running,
                faulty=faulty,
                deadline=now + self.round_timeout_s,
            )
            kind = "stop" if phase == "STOPPING" else "change"
            self._signal = Signal(f"{key[0]}.{phase}.{key[1]}", kind, strategy, uuid, tuple(sorted(faulty)))
            for rank in sorted(self.round.expected):
                self._send(rank)
            asyncio.get_running_loop().call_later(self.round_timeout_s, self._wake)
        outcome, code, message = self.round.outcome(now)
        return None if outcome is Outcome.PENDING else (code, message)

    # ---------------------------------------------------------------- the socket
    def _accept(self) -> None:
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:  # EMFILE and friends: the others are served; this one retries
                log.warning("rank clients: accept failed: %s", err)
                return
            pid = _CREDS.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size))[0]
            if len(self._conns) >= MAX_CONNECTIONS:
                sock.close()
                self.dropped += 1
                if self.dropped == 1:
                    self._note("bad_rank_message", f"rank client (pid {pid}): over {MAX_CONNECTIONS} connections")
                continue
            sock.setblocking(False)
            conn = _Conn(sock, pid)
            self._conns.add(conn)
            loop.add_reader(sock.fileno(), self._readable, conn)

    def _readable(self, conn: _Conn) -> None:
        """Read what the connection holds, at most _BATCH messages (the reader stays registered:
        the loop calls back for the rest after serving the others)."""
        for _ in range(_BATCH):
            if conn not in self._conns:
                return
            try:
                data = conn.sock.recv(MAX_MESSAGE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._left(conn)
                return
            try:
                message = parse_from_rank(data)
            except BadRecord as err:
                self._drop(conn, err.detail)
                continue
            if isinstance(message, Join):
                self._join(conn, message)
            elif isinstance(message, RankFault):
                self._fault(conn, message)
            else:
                self._answered(conn, message)

    def _join(self, conn: _Conn, join: Join) -> None:
        slot = self._slots().get(join.rank)
        proc = slot.proc if slot is not None else None
        if proc is None or not sender_belongs(conn.pid, proc.pid):
            self._drop(conn, f"join as rank {join.rank} refused: pid {conn.pid} is not that rank's process")
            return
        if conn.rank is not None and conn.rank != join.rank:
            self._drop(conn, f"join as rank {join.rank} refused: this connection joined as rank {conn.rank}")
            return
        previous = self.joined.get(join.rank)
        if previous is not None and previous is not conn:
            self._close(previous)  # the rank's new connection replaces its old one (same process group)
        conn.rank = join.rank
        self.joined[join.rank] = conn
        self.offers[join.rank] = join.offer
        rnd = self.round
        if rnd is not None and join.rank in rnd.expected and join.rank not in rnd.answered and not rnd.failure:
            self._send(join.rank)  # it reconnected while the round waits for it (an agent restart)
        self._wake()

    def _fault(self, conn: _Conn, fault: RankFault) -> None:
        """A joined rank's retryable fault of its own: the agent reports it as that rank's."""
        if conn.rank is None:
            self._drop(conn, "a fault before joining")
            return
        self._on_fault(conn.rank, fault)

    def _answered(self, conn: _Conn, answer: Answer) -> None:
        if conn.rank is None:
            self._drop(conn, "an answer before joining")
            return
        if self.round is None or self._signal is None or answer.signal_id != self._signal.signal_id:
            return  # an answer to an earlier round: it decides nothing now
        self.round = self.round.answer(conn.rank, answer.code, answer.message)
        self._wake()

    def _send(self, rank: int) -> None:
        conn = self.joined.get(rank)
        if conn is None or self._signal is None:
            return
        try:
            conn.sock.send(encode_signal(self._signal))
        except OSError as err:
            log.warning("rank clients: signal to rank %d failed: %s", rank, err)
            self._left(conn)

    def _left(self, conn: _Conn) -> None:
        self._close(conn)
        rank = conn.rank
        if rank is not None and self.joined.get(rank) is conn:
            del self.joined[rank]
            if self.round is not None:
                self.round = self.round.departed(rank)
            self._wake()

    def _close(self, conn: _Conn) -> None:
        if conn not in self._conns:
            return
        self._conns.discard(conn)
        with contextlib.suppress(ValueError, OSError):  # the loop may be closing
            asyncio.get_running_loop().remove_reader(conn.sock.fileno())
        conn.sock.close()

    def _drop(self, conn: _Conn, problem: str) -> None:
        """Count a message not taken; the first on a connection is recorded as an event."""
        self.dropped += 1
        conn.dropped += 1
        if conn.dropped == 1:
            self._note("bad_rank_message", f"rank client (pid {conn.pid}): {problem}; dropped")
