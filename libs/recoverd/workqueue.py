"""A de-duplicating work queue for level-triggered reconcile loops (Kubernetes' workqueue, small).

Watch handlers only ``add`` a key (a job name); a worker ``get``s it, reads the current state and
reconciles. A key added again while queued is merged; a key added while being processed is queued
again once the worker calls ``done``, so no key is handled by two workers at once and no wake-up is
lost. ``retry`` requeues a failed key after a capped exponential backoff; ``forget`` resets it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["WorkQueue"]

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self, *, base_delay_s: float = 0.02, max_delay_s: float = 2.0) -> None:
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self._queue: deque[K] = deque()
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        self._dirty: set[K] = set()
        self._failures: dict[K, int] = {}
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._ready = asyncio.Event()

    def add(self, key: K) -> None:
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._queue.append(key)
        self._ready.set()

    def add_after(self, key: K, delay_s: float) -> None:
        """Add ``key`` after ``delay_s`` (deadline timers); an earlier pending timer wins."""
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0.0, delay_s)
        timer = self._timers.get(key)
        if timer is not None and not timer.cancelled() and timer.when() <= when:
            return
        if timer is not None:
            timer.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> K:
        while not self._queue:
            self._ready.clear()
            await self._ready.wait()
        key = self._queue.popleft()
        self._queued.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def retry(self, key: K) -> float:
        """Requeue ``key`` after a capped exponential backoff; returns the delay."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = min(self.max_delay_s, self.base_delay_s * (2**failures))
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
