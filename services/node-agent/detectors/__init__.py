"""The agent's fault detectors: each turns one kind of observation into a typed fault for a rank.

``base.py`` holds what they share (fault kinds, the fault-id scheme, MindCluster's codes, the
interface); ``runner.py`` runs them for the agent. Adding a detector is one module and one entry
in :data:`DETECTORS` (docs/detectors.md walks through the NVML detector as the example).
"""

from __future__ import annotations

from recoverd.agent.detectors.base import Detected, Detector, DetectorHost, FaultKind, fault_id, mindcluster_fault_type
from recoverd.agent.detectors.exits import ExitDetector
from recoverd.agent.detectors.hang import HangDetector
from recoverd.agent.detectors.nvml import NvmlDetector
from recoverd.agent.detectors.reset_json import ResetJsonDetector

__all__ = [
    "DETECTORS",
    "Detected",
    "Detector",
    "DetectorHost",
    "ExitDetector",
    "FaultKind",
    "HangDetector",
    "NvmlDetector",
    "fault_id",
    "mindcluster_fault_type",
]

#: Every detector the agent knows, in the order they are started.
DETECTORS: tuple[type[Detector], ...] = (ExitDetector, ResetJsonDetector, HangDetector, NvmlDetector)
