"""Exits: a rank's process ended on its own with a failure.

The launcher learns of the exit through a pidfd (no polling) and the agent hands it here; exits
the agent caused itself (commands, its own shutdown) never arrive. This detector has no loop of
its own: it only turns the exit into the fault every other detector's faults look like.
"""

from __future__ import annotations

from recoverd.agent.detectors.base import Detected, Detector, FaultKind
from recoverd.agent.launcher import ExitInfo, read_tail
from recoverd.agent.ranktable import RankSlot

__all__ = ["ExitDetector"]


class ExitDetector(Detector):
    name = "exit"

    def exited(self, slot: RankSlot, info: ExitInfo, detail: str = "") -> None:
        """``slot``'s process ended with ``info`` (``detail`` replaces the usual description, e.g.
        for a rank that died while no agent watched it, or that could not be started)."""
        proc = slot.proc
        self.host.report(
            Detected(
                rank=slot.rank,
                kind=FaultKind.EXIT,
                detail=detail or f"pid {info.pid} {info.describe()}",
                exit_code=info.exit_code or 0,
                signal=info.signal or 0,
                stderr_tail=read_tail(proc.log_path if proc else None),
            )
        )
