"""The lease keep-alive policy (docs/adr/0025), against a fake store: no etcd.

A keep-alive goes out half a TTL after the last confirmed one was sent; inside the remaining half
nothing waits for a timer: a failed one is sent again at once, a late one gets another beside it,
and the lease is lost only when nothing was confirmed for a whole TTL (or etcd answers TTL 0).
Assertions are on what was sent and in which order, never on how long something took; the few time
bounds are lower bounds (a loaded machine only makes waits longer).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from recoverd import store as store_module
from recoverd.errors import EtcdUnavailable
from recoverd.store import KEEPALIVE_FRACTION, KEEPALIVE_IN_FLIGHT, LeaseKeeper, Store

WAIT_S = 30.0  # generous: only a broken keeper waits this long


class FakeStore:
    """What LeaseKeeper uses of a Store; ``answer`` decides each keep-alive (by its number)."""

    endpoint = "fake:2379"

    def __init__(self, answer: Callable[[int], object], granted: int | None = None) -> None:
        self.answer = answer
        self.granted = granted
        self._warned_ttl: tuple[int, int] | None = None
        self.sent: list[float] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.cancelled = 0
        self.revoked: list[int] = []
        self.changed = asyncio.Event()
        self._abandoned: set[int] = set()

    async def _revoke_abandoned(self) -> None:
        self._abandoned.clear()

    async def _grant_ttl(self, ttl: int) -> tuple[int, int]:
        return 0x5EED, self.granted or ttl

    async def _refresh(self, lease_id: int) -> int:
        n = len(self.sent)
        self.sent.append(time.monotonic())
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.changed.set()
        try:
            result = self.answer(n)
            if isinstance(result, asyncio.Event):
                await result.wait()
                return 5
            if isinstance(result, BaseException):
                raise result
            assert isinstance(result, int)
            return result
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1

    async def _revoke(self, lease_id: int) -> None:
        self.revoked.append(lease_id)

    async def wait_sends(self, count: int) -> None:
        """Until ``count`` keep-alives were sent. A keep-alive after a confirmed one shows that the
        keeper has taken the confirmation in (it sends the next only then)."""
        async with asyncio.timeout(WAIT_S):
            while len(self.sent) < count:
                self.changed.clear()
                await self.changed.wait()


def keeper(fake: FakeStore, ttl: int = 2) -> LeaseKeeper:
    return LeaseKeeper(fake, ttl)  # type: ignore[arg-type]


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep-alives every 0.1 s of a 2 s lease: the policy's shape, quickly, with a wide margin."""
    monkeypatch.setattr(store_module, "KEEPALIVE_FRACTION", 0.05)


def test_the_interval_is_half_the_ttl() -> None:
    assert KEEPALIVE_FRACTION == 0.5
    assert keeper(FakeStore(lambda n: 2), ttl=2).interval_s == 1.0
    assert keeper(FakeStore(lambda n: 5), ttl=5).interval_s == 2.5


async def test_keepalives_go_out_an_interval_after_the_last_confirmed_one() -> None:
    fake = FakeStore(lambda n: 1)
    async with keeper(fake, ttl=1) as lease:
        await fake.wait_sends(3)
        assert not lease.lost.is_set()
    gaps = [b - a for a, b in zip(fake.sent, fake.sent[1:], strict=False)]
    assert all(gap >= 0.5 - 0.01 for gap in gaps), gaps  # never sooner than half the TTL
    assert fake.revoked == [0x5EED]  # revoked on exit


async def test_a_failed_keepalive_is_sent_again_without_waiting_an_interval() -> None:
    # TTL 2: the first keep-alive goes out after 1 s; waiting another interval after a failure would
    # reach the lease's end, so only an immediate resend keeps it.
    fake = FakeStore(lambda n: EtcdUnavailable("down") if n in (0, 1) else 2)
    async with keeper(fake, ttl=2) as lease:
        await fake.wait_sends(4)  # failed, failed, confirmed, the next one
        assert not lease.lost.is_set()
        assert (lease.renewals, lease.resends) == (1, 2)


async def test_a_late_keepalive_gets_another_beside_it(fast: None) -> None:
    stuck = asyncio.Event()
    fake = FakeStore(lambda n: stuck if n == 0 else 2)
    async with keeper(fake) as lease:
        await fake.wait_sends(4)  # late, then others beside it, then the next one after a confirmation
        assert not lease.lost.is_set() and lease.renewals >= 1 and lease.resends >= 1
        assert fake.most_in_flight >= 2
    assert fake.cancelled >= 1 and fake.in_flight == 0  # the late one is abandoned, not leaked


async def test_the_lease_is_lost_when_nothing_is_confirmed_for_a_whole_ttl(fast: None) -> None:
    fake = FakeStore(lambda n: EtcdUnavailable("down"))
    lease = keeper(fake)
    async with lease:
        granted_at = time.monotonic()
        async with asyncio.timeout(WAIT_S):
            await lease.lost.wait()
        assert time.monotonic() - granted_at >= 2.0 - 0.01  # never declared before the TTL ran out
        assert len(fake.sent) > 3  # retried all along
    assert fake.revoked == []  # a lost lease is not revoked


async def test_keepalives_in_flight_are_bounded_and_cancelled_when_the_lease_is_lost(fast: None) -> None:
    fake = FakeStore(lambda n: asyncio.Event())  # nothing ever answers
    async with keeper(fake) as lease:
        async with asyncio.timeout(WAIT_S):
            await lease.lost.wait()
    assert fake.most_in_flight == KEEPALIVE_IN_FLIGHT
    assert fake.in_flight == 0 and fake.cancelled == KEEPALIVE_IN_FLIGHT


async def test_ttl_zero_means_the_lease_expired(fast: None) -> None:
    fake = FakeStore(lambda n: 0)
    async with keeper(fake) as lease:
        async with asyncio.timeout(WAIT_S):
            await lease.lost.wait()
    assert len(fake.sent) == 1


async def test_a_raised_ttl_is_kept_and_said(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeStore(lambda n: 2, granted=2)
    async with keeper(fake, ttl=1) as lease:
        assert (lease.ttl, lease.interval_s) == (2, 1.0)
    assert "granted a 2 s lease for the 1 s asked" in caplog.text


async def test_an_unexpected_error_loses_the_lease_rather_than_the_keeper(fast: None) -> None:
    fake = FakeStore(lambda n: RuntimeError("a bug"))
    async with keeper(fake) as lease:
        async with asyncio.timeout(WAIT_S):
            await lease.lost.wait()


def test_the_fake_has_what_the_keeper_uses() -> None:
    for name in ("_grant_ttl", "_refresh", "_revoke", "endpoint", "_warned_ttl"):
        assert hasattr(Store, name) or name in Store("localhost:2379").__dict__, name
