"""The detectors' shared facts (fault ids, MindCluster codes) and the runner's rules."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from recoverd.agent.detectors import DETECTORS, Detected, Detector, FaultKind, fault_id, mindcluster_fault_type
from recoverd.agent.detectors.runner import DetectorSet
from recoverd.agent.ranktable import RankSlot
from recoverd.agent.settings import AgentSettings
from recoverd.keys import check_id


def test_mindcluster_codes_uce_retryable_link_hccl_everything_else_other() -> None:
    assert mindcluster_fault_type(FaultKind.UCE) == "0"
    assert mindcluster_fault_type(FaultKind.LINK) == "2"
    others = set(FaultKind) - {FaultKind.UCE, FaultKind.LINK}
    assert {mindcluster_fault_type(k) for k in others} == {"1"}


def test_fault_id_is_deterministic_per_incarnation_and_kind() -> None:
    a = fault_id("node3", 5, 2, 1, FaultKind.HANG)
    assert a == "node3.r5.g2.c1.hang"
    assert a == fault_id("node3", 5, 2, 1, FaultKind.HANG)
    assert a != fault_id("node3", 5, 2, 2, FaultKind.HANG)  # the next incarnation
    assert a != fault_id("node3", 5, 2, 1, FaultKind.EXIT)
    assert fault_id("node3", 5, 2, 1, FaultKind.RESET, "1700000000") == "node3.r5.g2.c1.reset.1700000000"


def test_fault_id_is_a_valid_key_segment_whatever_the_node_and_instance() -> None:
    long_node = "n" + "x" * 252
    for fid in (
        fault_id(long_node, 1023, 10**6, 99, FaultKind.DEVICE_LOST, "xid 79 at/ 2026"),
        fault_id("node0", 0, 0, 0, FaultKind.DEVICE, "a/b c"),
    ):
        assert check_id("fault", fid) == fid
    assert fault_id(long_node, 1, 0, 0, FaultKind.EXIT) != fault_id(long_node[:-1] + "y", 1, 0, 0, FaultKind.EXIT)


class _Host:
    def __init__(self) -> None:
        self.notes: list[tuple[str, str]] = []
        self.reported: list[Detected] = []
        self.got_one = asyncio.Event()

    @property
    def node(self) -> str:
        return "node0"

    def ranks(self) -> Mapping[int, RankSlot]:
        return {0: RankSlot(0, 0)}

    def report(self, found: Detected) -> None:
        self.reported.append(found)
        self.got_one.set()

    def note(
        self, reason: str, message: str, *, rank: int | None = None, data: Mapping[str, str] | None = None
    ) -> None:
        self.notes.append((reason, message))


class _Flaky(Detector):
    name = "flaky"
    runs = 0

    async def run(self) -> None:
        type(self).runs += 1
        if type(self).runs < 3:
            raise RuntimeError("boom")
        self.host.report(Detected(0, FaultKind.HANG, "found after two failures"))
        await asyncio.Event().wait()


SETTINGS = AgentSettings(job="j", node="node0", argv=("true",), etcd="http://127.0.0.1:1")


async def test_a_failing_detector_is_recorded_and_restarted_the_others_go_on() -> None:
    host = _Host()
    detectors = DetectorSet(host, SETTINGS, [_Flaky], backoff_s=0.001, backoff_max_s=0.002)
    task = asyncio.create_task(detectors.run())
    async with asyncio.timeout(10):
        await host.got_one.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [r for r, _ in host.notes] == ["detector_failed", "detector_failed"]
    assert "boom" in host.notes[0][1]


def test_only_wanted_detectors_are_built() -> None:
    names = [d.name for d in DetectorSet(_Host(), SETTINGS, DETECTORS)]
    assert "exit" in names and "reset-json" not in names  # no --reset-json given
    with_file = AgentSettings(job="j", node="node0", argv=("true",), etcd="http://x:1", reset_json="/tmp/r.json")
    assert "reset-json" in [d.name for d in DetectorSet(_Host(), with_file, DETECTORS)]
