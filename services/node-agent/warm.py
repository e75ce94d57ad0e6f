"""Warm spare processes: the job's command started ahead of time, waiting to become a rank.

Only the process launcher has them (not msrun, not adopted processes), and only scripts that call
``taskd_client.pytorch.wait_for_rank()`` first can be one (docs/pytorch.md). A used spare is
replaced after ``refill_s`` (it would compete for CPU with the recovery it just sped up); a spare
that dies is replaced more slowly each time (a script that cannot be a warm spare dies at once).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from recoverd.agent.launcher import ExitInfo, Launcher, RankLaunch, RankProcess
from recoverd.agent.runtime import RankRuntime
from recoverd.errors import LaunchFailed

__all__ = ["WarmSpares"]

log = logging.getLogger(__name__)


class WarmSpares:
    """Keeps ``count`` warm spares of one node waiting; hands one out per rank start."""

    def __init__(
        self,
        runtime: RankRuntime,
        launch: Callable[[], RankLaunch],
        node: str,
        count: int,
        refill_s: float,
        on_change: Callable[[], None],
    ) -> None:
        self._runtime = runtime
        self._launch = launch
        self._node = node
        self._count = count
        self._refill_s = refill_s
        self._on_change = on_change
        self._waiting: list[RankProcess] = []
        self._refill: asyncio.TimerHandle | None = None
        self._deaths = 0
        #: Set when the agent is ending: no warm spare is started any more.
        self._stopping = False

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._waiting if p.is_running]

    @property
    def _launcher(self) -> Launcher | None:
        runtime = self._runtime
        if isinstance(runtime, Launcher) and type(runtime).starts_any_rank:
            return runtime
        return None

    def fill(self) -> None:
        """Start warm spares until ``count`` are waiting."""
        self._refill = None
        launcher = self._launcher
        if self._stopping or launcher is None:
            return
        self._waiting = [p for p in self._waiting if p.is_spare and p.is_running]
        while len(self._waiting) < self._count:
            try:
                spare = launcher.start(self._launch(), spare=True)
            except LaunchFailed as err:
                log.error("agent %s: cannot start a warm spare: %s", self._node, err)
                return
            log.info("agent %s: warm spare pid %d started", self._node, spare.pid)
            self._waiting.append(spare)
            self._on_change()

    def take(self, launch: RankLaunch) -> RankProcess | None:
        """A warm spare made into this rank, or None (none waiting: start a process as usual)."""
        while self._waiting:
            spare = self._waiting.pop(0)
            launcher = self._launcher
            if not (spare.is_spare and spare.is_running) or launcher is None:
                continue
            try:
                proc = launcher.assign(spare, launch)
            except LaunchFailed as err:
                log.warning("agent %s: %s", self._node, err)
                continue
            log.info("agent %s: rank %d is warm spare pid %d", self._node, launch.rank, proc.pid)
            self._refill_later(self._refill_s)
            return proc
        return None

    def owns(self, proc: RankProcess) -> bool:
        return proc in self._waiting

    def ended(self, proc: RankProcess, info: ExitInfo) -> None:
        """A waiting spare died: replace it, more slowly each time."""
        self._waiting.remove(proc)
        log.warning("agent %s: warm spare pid %d ended: %s", self._node, proc.pid, info.describe())
        self._deaths += 1
        self._refill_later(min(60.0, self._refill_s * 2**self._deaths))
        self._on_change()

    def _refill_later(self, delay_s: float) -> None:
        if self._refill is None and not self._stopping:
            self._refill = asyncio.get_running_loop().call_later(delay_s, self.fill)

    async def stop(self, grace_s: float) -> None:
        """Stop every waiting spare and start no more (idempotent)."""
        self._stopping = True
        if self._refill is not None:
            self._refill.cancel()
            self._refill = None
        spares, self._waiting = [p for p in self._waiting if p.is_running], []
        if spares:
            await asyncio.gather(*(self._runtime.stop(p, grace_s) for p in spares))
