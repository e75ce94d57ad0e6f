"""Runs the registered detectors for one agent: builds the wanted ones, keeps their loops alive,
and passes on what they must know (rank incarnations starting and ending, recoveries).

A detector is not allowed to take the agent down with it: one that raises is recorded as an event
(``detector_failed``) and started again after a back-off; the others go on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from typing import TypeVar

from recoverd.agent.detectors.base import Detector, DetectorHost
from recoverd.agent.ranktable import RankSlot
from recoverd.agent.settings import AgentSettings

__all__ = ["DetectorSet"]

log = logging.getLogger(__name__)

D = TypeVar("D", bound=Detector)


class DetectorSet:
    """The detectors of one agent."""

    def __init__(
        self,
        host: DetectorHost,
        settings: AgentSettings,
        registry: Sequence[type[Detector]],
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
    ) -> None:
        self.host = host
        self.detectors = [cls(host, settings) for cls in registry if cls.wanted(settings)]
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s

    def __iter__(self) -> Iterator[Detector]:
        return iter(self.detectors)

    def get(self, cls: type[D]) -> D | None:
        """The running detector of type ``cls``, if this agent runs one."""
        return next((d for d in self.detectors if isinstance(d, cls)), None)

    async def run(self) -> None:
        """Run every detector's loop until cancelled."""
        async with asyncio.TaskGroup() as group:
            for detector in self.detectors:
                group.create_task(self._keep_running(detector), name=f"detector-{detector.name}")

    async def _keep_running(self, detector: Detector) -> None:
        delay = self.backoff_s
        while True:
            try:
                await detector.run()
                return
            except Exception as err:  # a detector's bug must not end the agent
                log.exception("detector %s failed", detector.name)
                self.host.note(
                    "detector_failed", f"detector {detector.name} failed: {err!r}; restarting it in {delay:g}s"
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff_max_s)

    def rank_started(self, slot: RankSlot) -> None:
        for detector in self.detectors:
            detector.rank_started(slot)

    def rank_ended(self, slot: RankSlot) -> None:
        for detector in self.detectors:
            detector.rank_ended(slot)

    def recovery_changed(self, active: bool) -> None:
        for detector in self.detectors:
            detector.recovery_changed(active)
