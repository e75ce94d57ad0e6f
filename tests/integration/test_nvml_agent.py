"""A GPU's XID becomes a fault of exactly the rank on that GPU, recovered by the ladder: a real agent
(in-process, simulated ranks: simnodes.py) with its NVML detector bound to the stand-in library
(tests/nvml_standin.py), against the real etcd, coordinator and strategy selector."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from recoverd.agent.detectors import DETECTORS, NvmlDetector
from recoverd.records import pb
from tests.nvml_standin import FakeGpu, StandInNvml

from .cluster import Cluster
from .simnodes import SimNodes

pytestmark = pytest.mark.etcd

JOB = "job-nvml"


@pytest.fixture
def nvml() -> StandInNvml:
    return StandInNvml([FakeGpu(i, f"GPU-0000000{i}-1111-2222-3333-444444444444") for i in range(2)])


@pytest.fixture
def node(cluster: Cluster, nvml: StandInNvml, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimNodes]:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # local rank N is GPU N
    registry = tuple(d for d in DETECTORS if d is not NvmlDetector)
    detectors = (*registry, NvmlDetector.with_library(nvml, poll_s=0.05, wait_ms=20))
    # "retry" is allowed, but an agent answering for plain ranks cannot offer it (every participant must).
    sim = SimNodes(cluster.endpoint, cluster.prefix, JOB, 1, 2, ("retry", "recover-in-place", "exit"), detectors)
    try:
        yield sim
    finally:
        sim.close()


def test_an_xid_48_restarts_exactly_the_rank_on_that_gpu(cluster: Cluster, nvml: StandInNvml, node: SimNodes) -> None:
    cluster.coordinator()
    cluster.strategy()
    node.start()
    before = cluster.wait_running(JOB, 2)
    assert nvml.waiting.wait(10), "the NVML detector never started waiting for events"

    nvml.xid(1, 48)  # a double-bit ECC error on GPU 1: local rank 1, rank 1
    after = cluster.wait_for(
        "rank 1 restarted for the UCE",
        lambda: (r := cluster.ranks(JOB))[1].restart_count == 1 and r[1].state == pb.RANK_RUNNING and r,
    )
    assert after[0].pid == before[0].pid and after[0].restart_count == 0
    assert after[1].pid != before[1].pid
    recovery = cluster.wait_for(
        "the recovery done", lambda: (v := cluster.view(JOB).recovery) and v.phase == pb.PHASE_DONE and v
    )
    [fault] = recovery.faults
    assert (fault.rank, fault.fault_type) == (1, "0")
    # The kind is in the id (the recovery record's copy of a fault does not carry Fault.kind).
    assert fault.fault_id.endswith(".r1.g0.c0.uce.gpu1.ecc0"), fault.fault_id
    assert "GPU 1 (GPU-00000001-" in fault.detail and "XID 48" in fault.detail
    # A UCE is retryable, but `retry` needs every participant and the agent cannot offer it: the
    # ladder's next rung restarts the rank in place.
    assert recovery.strategy == "recover-in-place"
    assert any("retry" in r and "every participant" in r for r in recovery.decision_reasons), recovery.decision_reasons
