"""When etcd itself was last in trouble, as one process sees it (docs/adr/0045).

A node's lease that expires while etcd stalls is not evidence that the node died: its agent may
have waited on a hung member, or on an election, longer than its lease's stall margin, and it
registers again a moment later. The coordinator asks this monitor whether etcd was in trouble
around the time a node vanished, and holds such a node as live for a grace instead of restarting
its ranks (``recoverd.coordinator.leasehold``).

Every member is asked for its ``Status`` every :data:`~recoverd.store.PROBE_INTERVAL_S`, each on
its own single-endpoint connection, with the watchdog's deadline. Trouble is **seen** when

* a member does not answer in time (hung: SIGSTOPped, a stuck disk, a frozen VM), at every probe
  while it stays so: agents connected to it are at risk for as long as it hangs;
* a member reports no leader (an election, or a member cut off from the quorum), at every probe
  while it stays so;
* the cluster's leader changes (writes and keep-alives stall across an election);
* a member that answered stops answering in any other way (refused, reset): once, at that moment.
  A member that stays down refuses connections at once, so nobody waits on it; counting it for
  as long as it is down would slow every real node loss for days.

The probes cost one cheap member-local call per member per interval, in one process (the
coordinator); no consensus, no permission.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from recoverd.errors import EtcdUnavailable, RecoverdError
from recoverd.store import PROBE_INTERVAL_S, PROBE_TIMEOUT_S, Store

__all__ = ["EtcdHealth", "Trouble"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Trouble:
    """The last trouble seen: when (wall clock, seconds) and what."""

    at: float
    what: str


class _Member:
    """One member's probe state."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        #: Whether its last probe was answered (None before the first).
        self.answered: bool | None = None


class EtcdHealth:
    """Probes every etcd member and remembers the last trouble seen (``last``).

    ``await health.run()`` until cancelled; ``last`` is read by the owner at any time. ``clock``
    is the wall clock (the coordinator's deadlines are wall-clock times in etcd records).
    """

    def __init__(
        self,
        store: Store,
        *,
        interval_s: float = PROBE_INTERVAL_S,
        timeout_s: float = PROBE_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.last: Trouble | None = None
        #: The last few kinds of trouble seen, each when it began (for logs and tests).
        self.recent: deque[Trouble] = deque(maxlen=16)
        # The scheme as the owner's store connects (https:// with TLS), so each member's own
        # connection is made the same way.
        scheme = "https://" if store.tls else "http://"
        self._members = [_Member(f"{scheme}{host}:{port}") for host, port in store.endpoints]
        self._leader = 0

    def seen(self, what: str) -> None:
        """Record trouble now (also for the owner's own evidence, e.g. its calls failing)."""
        now = self.clock()
        if self.last is None or self.last.what != what:
            self.recent.append(Trouble(now, what))
            if self.last is None or now - self.last.at > 1.0:
                log.warning("etcd trouble: %s", what)
        self.last = Trouble(now, what)

    async def run(self) -> None:
        """Probe every member until cancelled; never raises but cancellation. A bug here ends the
        probing (logged), never its owner: without the view, no node is held (ADR 0045)."""
        try:
            await self._probe_forever()
        except Exception:
            log.exception("etcd health view stopped: nodes lost during etcd trouble are no longer held")

    async def _probe_forever(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            stores = [
                await stack.enter_async_context(
                    Store(
                        [member.endpoint],
                        security=self.store.security,
                        connect_timeout_s=self.timeout_s,
                        op_timeout_s=self.timeout_s,
                        warn_version=False,
                        probe_interval_s=0,
                    )
                )
                for member in self._members
            ]
            while True:
                started = time.monotonic()
                answers = await asyncio.gather(*(self._probe(s) for s in stores))
                for member, answer in zip(self._members, answers, strict=True):
                    self._judge(member, answer)
                await asyncio.sleep(max(0.0, started + self.interval_s - time.monotonic()))

    async def _probe(self, store: Store) -> int | str:
        """The member's leader id (0: none), or why it did not answer: "hung" when the call waited
        out its deadline (a member that is down refuses at once), "refused" when etcd refused it
        (e.g. credentials: not the member's health)."""
        sent = time.monotonic()
        try:
            return int((await store.status()).leader)
        except EtcdUnavailable as err:
            if time.monotonic() - sent >= 0.9 * self.timeout_s:
                return "hung"
            return f"down ({err.detail[:120]})"
        except RecoverdError as err:
            log.debug("etcd health probe of %s refused: %s", store.endpoint, err)
            return "refused"

    def _judge(self, member: _Member, answer: int | str) -> None:
        was = member.answered
        if answer == "refused":
            return
        if isinstance(answer, str):
            member.answered = False
            if answer == "hung":
                self.seen(f"member {member.endpoint} did not answer a status probe within {self.timeout_s:g}s")
            elif was:
                self.seen(f"member {member.endpoint} is {answer}")
            return
        member.answered = True
        if answer == 0:
            self.seen(f"member {member.endpoint} has no leader")
            return
        if self._leader and answer != self._leader:
            self.seen(f"the etcd leader changed ({self._leader:x} -> {answer:x})")
        self._leader = answer
