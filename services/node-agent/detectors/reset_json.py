"""reset.json: a device plugin marks a rank faulty (``--reset-json PATH``; resetfile.py has the rules).

The file is watched with inotify on its directory (a Kubernetes ConfigMap's symlink swap is seen);
each (rank, status, UpdateTime) becomes one fault. A malformed file is an event with the parser's
reason and nothing is applied; the watched file is never written.
"""

from __future__ import annotations

import asyncio
import contextlib

from recoverd import resetjson
from recoverd.agent import resetfile
from recoverd.agent.detectors.base import Detected, Detector, FaultKind
from recoverd.agent.settings import AgentSettings
from recoverd.errors import BadRecord, ConfigError, Reason
from recoverd.filewatch import watch_file

__all__ = ["ResetJsonDetector"]


class ResetJsonDetector(Detector):
    name = "reset-json"
    retry_s = 1.0

    @classmethod
    def wanted(cls, settings: AgentSettings) -> bool:
        return bool(settings.reset_json)

    async def run(self) -> None:
        path = self.settings.reset_json
        assert path is not None
        seen: set[tuple[int, str, int]] = set()
        while True:
            try:
                async with contextlib.aclosing(watch_file(path)) as updates:
                    async for content in updates:
                        if content is None:
                            continue
                        try:
                            state = resetjson.parse(content, source=path)
                        except BadRecord as err:
                            self.host.note(Reason.BAD_RECORD, f"{path}: {err.detail}; nothing applied")
                            continue
                        for rank, status in resetfile.faults_from(state, self.host.ranks()):
                            key = (rank, status, state.update_time)
                            if key in seen:
                                continue
                            seen.add(key)
                            self.host.report(
                                Detected(
                                    rank=rank,
                                    kind=FaultKind.RESET,
                                    detail=f"{path}: rank {rank} is {status} (device fault)",
                                    instance=str(state.update_time),
                                )
                            )
            except (BadRecord, ConfigError) as err:
                self.host.note(Reason.BAD_RECORD, f"{path}: {err.detail}; watching again in {self.retry_s:g}s")
                await asyncio.sleep(self.retry_s)
