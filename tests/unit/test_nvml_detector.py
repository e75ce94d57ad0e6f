"""The NVML detector against a stand-in at the library boundary (tests/nvml_standin.py): XIDs, ECC
counters and lost GPUs become faults for exactly the ranks on that GPU; no GPU is needed."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pynvml
import pytest

from recoverd.agent.detectors import DETECTORS, Detected, FaultKind, NvmlDetector, mindcluster_fault_type
from recoverd.agent.detectors.nvml import NVML_FUNCTIONS, XIDS, Gpu, classify_xid, visible_gpus
from recoverd.agent.detectors.runner import DetectorSet
from recoverd.agent.ranktable import RankSlot
from recoverd.agent.settings import AgentSettings
from recoverd.cli.main import _agent_settings, build_parser
from recoverd.errors import ConfigError
from recoverd.records import pb
from tests.nvml_standin import FakeGpu, StandInNvml, surface


def _uuid(index: int) -> str:
    return f"GPU-{index:08x}-aaaa-bbbb-cccc-{index:012x}"


def _gpus(count: int, **kw: Any) -> list[FakeGpu]:
    return [FakeGpu(i, _uuid(i), **kw) for i in range(count)]


class _Host:
    """The agent as a detector sees it: local ranks 0..n-1 (rank = 10 + local rank), all running."""

    def __init__(self, nproc: int) -> None:
        self.slots = {10 + lr: RankSlot(10 + lr, lr, state=pb.RANK_RUNNING) for lr in range(nproc)}
        self.reported: list[Detected] = []
        self.notes: list[tuple[str, str, dict[str, str]]] = []
        self.changed = asyncio.Event()

    @property
    def node(self) -> str:
        return "node0"

    def ranks(self) -> Mapping[int, RankSlot]:
        return self.slots

    def report(self, found: Detected) -> None:
        self.reported.append(found)
        self.changed.set()

    def note(
        self, reason: str, message: str, *, rank: int | None = None, data: Mapping[str, str] | None = None
    ) -> None:
        self.notes.append((reason, message, dict(data or {})))
        self.changed.set()

    async def until(self, what: str, predicate: Any) -> None:
        """Wait (10 s at most) until ``predicate()`` holds after a report or a note."""
        async with asyncio.timeout(10):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()


def _settings(nproc: int = 2, nvml: str = "auto", **kw: Any) -> AgentSettings:
    return AgentSettings(job="j", node="node0", argv=("true",), etcd="http://127.0.0.1:1", nproc_per_node=nproc,
                         nvml=nvml, **kw)  # fmt: skip


@pytest.fixture(autouse=True)
def _no_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    yield


@asynccontextmanager
async def _running(nvml: StandInNvml, host: _Host, settings: AgentSettings) -> AsyncIterator[NvmlDetector]:
    """The detector's loop over ``nvml``, fast (poll 20 ms, waits of 10 ms); checks NVML is released."""
    cls = NvmlDetector.with_library(nvml, poll_s=0.02, wait_ms=10)
    assert cls.wanted(settings)
    detector = cls(host, settings)
    task = asyncio.create_task(detector.run())
    try:
        assert await asyncio.to_thread(nvml.waiting.wait, 10), "the detector never waited for events"
        yield detector
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert await asyncio.to_thread(nvml.released.wait, 5), "NVML was not shut down"
        assert not nvml.freed_while_waiting
        assert all(s.freed for s in nvml.sets)


# ---------------------------------------------------------------------------- the boundary


def test_the_stand_in_offers_exactly_the_functions_used_with_pynvmls_signatures() -> None:
    standin = StandInNvml([])
    assert surface(standin) == set(NVML_FUNCTIONS)
    for name in NVML_FUNCTIONS:
        real = list(inspect.signature(getattr(pynvml, name)).parameters)
        fake = list(inspect.signature(getattr(standin, name)).parameters)
        assert len(real) == len(fake), name
    assert {"device", "eventType", "eventData"} <= {f for f, _ in pynvml.c_nvmlEventData_t._fields_}
    assert standin.NVMLError is pynvml.NVMLError
    assert pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST).value == pynvml.NVML_ERROR_GPU_IS_LOST


# ---------------------------------------------------------------------------- XIDs


async def test_xid_48_is_a_uce_for_the_rank_on_that_gpu_only() -> None:
    nvml, host = StandInNvml(_gpus(2)), _Host(2)
    async with _running(nvml, host, _settings()):
        nvml.xid(1, 48)
        await host.until("the UCE", lambda: host.reported)
    [found] = host.reported
    assert (found.rank, found.kind, mindcluster_fault_type(found.kind)) == (11, FaultKind.UCE, "0")
    assert found.detail == f"GPU 1 ({_uuid(1)}): XID 48, double-bit ECC error: uncorrectable device-memory error"
    assert found.instance == "gpu1.ecc0"  # named by the GPU's uncorrectable ECC count


async def test_one_error_seen_as_an_xid_and_as_a_counter_rise_is_one_fault_whichever_comes_first() -> None:
    nvml, host = StandInNvml(_gpus(2)), _Host(2)
    async with _running(nvml, host, _settings()):
        nvml.xid(0, 48, ecc_rise=1)  # the event and the rise at once
        await host.until("the UCE", lambda: host.reported)
        nvml.gpus[1].ecc = 1  # the rise first, then the event
        await host.until("the second UCE", lambda: len(host.reported) == 2)
        nvml.xid(1, 48)
        nvml.xid(0, 74)  # a marker: everything before it has been handled
        await host.until("the marker", lambda: len(host.reported) == 3)
        await asyncio.sleep(0.1)  # and several polls
    assert [(f.rank, f.kind, f.instance) for f in host.reported] == [
        (10, FaultKind.UCE, "gpu0.ecc1"),
        (11, FaultKind.UCE, "gpu1.ecc1"),
        (10, FaultKind.LINK, host.reported[2].instance),
    ]


async def test_xid_79_is_device_lost_once_per_incarnation_and_again_for_the_next() -> None:
    nvml, host = StandInNvml(_gpus(2)), _Host(2)
    async with _running(nvml, host, _settings()) as detector:
        nvml.gone(0)
        nvml.xid(0, 79)
        await host.until("the loss", lambda: host.reported)
        await asyncio.sleep(0.15)  # the polls find GPU_IS_LOST too: the same fault
        assert [(f.rank, f.kind, f.instance) for f in host.reported] == [(10, FaultKind.DEVICE_LOST, "gpu0.lost")]
        assert "fallen off the bus" in host.reported[0].detail and mindcluster_fault_type(FaultKind.DEVICE_LOST) == "1"
        # The rank is restarted on the same (still lost) GPU: its new incarnation gets the fault too.
        slot = host.slots[10]
        detector.rank_ended(slot)
        slot.generation += 1
        await host.until("the next incarnation's", lambda: len(host.reported) == 2)
    assert [f.rank for f in host.reported] == [10, 10]


async def test_xid_45_after_a_kill_is_nothing_13_is_an_event_unknown_ones_are_events() -> None:
    nvml, host = StandInNvml(_gpus(2)), _Host(2)
    async with _running(nvml, host, _settings()):
        nvml.xid(0, 45)  # preemptive cleanup: every kill of a rank (ours included) logs it
        nvml.xid(0, 13)  # the application's own illegal access
        nvml.xid(0, 999)  # not in the table
        nvml.xid(1, 94)  # a marker: everything before it has been handled
        await host.until("the marker", lambda: host.reported)
    assert [(f.rank, f.kind) for f in host.reported] == [(11, FaultKind.UCE)]
    assert [(r, d["xid"], d["ranks"]) for r, _, d in host.notes] == [("device_event", "13", "10"),
                                                                     ("device_event", "999", "10")]  # fmt: skip
    assert "not a fault" in host.notes[0][1]


async def test_an_event_of_a_gpu_without_a_local_rank_is_nothing() -> None:
    nvml, host = StandInNvml(_gpus(4)), _Host(2)  # local ranks on GPUs 0 and 1
    async with _running(nvml, host, _settings()):
        nvml.xid(3, 48, ecc_rise=1)
        nvml.xid(2, 13)
        nvml.xid(0, 74)  # the marker
        await host.until("the marker", lambda: host.reported)
        await asyncio.sleep(0.1)
    assert [(f.rank, f.kind) for f in host.reported] == [(10, FaultKind.LINK)]
    assert host.notes == []


async def test_stopped_ranks_get_no_device_fault() -> None:
    nvml, host = StandInNvml(_gpus(2)), _Host(2)
    host.slots[11].state = pb.RANK_STOPPED
    async with _running(nvml, host, _settings()):
        nvml.xid(1, 48)
        nvml.xid(0, 48)
        await host.until("rank 10's", lambda: host.reported)
    assert [f.rank for f in host.reported] == [10]


# ---------------------------------------------------------------------------- polls


async def test_a_rise_of_the_uncorrectable_ecc_counter_is_a_uce() -> None:
    gpus = _gpus(2)
    gpus[0].ecc = 3  # errors from before the detector started are not this run's
    nvml, host = StandInNvml(gpus), _Host(2)
    async with _running(nvml, host, _settings()):
        gpus[0].ecc = 5
        await host.until("the UCE", lambda: host.reported)
        await asyncio.sleep(0.1)
    [found] = host.reported
    assert (found.rank, found.kind, found.instance) == (10, FaultKind.UCE, "gpu0.ecc5")
    assert "rose from 3 to 5" in found.detail


async def test_a_gpu_lost_on_a_query_is_device_lost_and_a_gpu_without_ecc_is_still_watched() -> None:
    gpus = _gpus(2)
    gpus[0].ecc = None  # no ECC: its XIDs are still watched
    nvml, host = StandInNvml(gpus), _Host(2)
    async with _running(nvml, host, _settings()):
        nvml.gone(1)
        await host.until("the loss", lambda: host.reported)
        nvml.xid(0, 48)
        await host.until("the UCE", lambda: len(host.reported) == 2)
        await asyncio.sleep(0.1)
    assert [(f.rank, f.kind) for f in host.reported] == [(11, FaultKind.DEVICE_LOST), (10, FaultKind.UCE)]
    assert "GPU is lost" in host.reported[0].detail


async def test_a_gpu_lost_before_the_detector_started_is_device_lost() -> None:
    gpus = _gpus(2)
    gpus[1].lost_at_open = True
    nvml, host = StandInNvml(gpus), _Host(2)
    async with _running(nvml, host, _settings()):
        await host.until("the loss", lambda: host.reported)
    assert [(f.rank, f.kind, f.instance) for f in host.reported] == [(11, FaultKind.DEVICE_LOST, "gpu1.lost")]


async def test_a_broken_event_registration_leaves_the_counters_watched() -> None:
    gpus = _gpus(2)
    gpus[1].register_error = pynvml.NVML_ERROR_UNKNOWN  # NVML: the set is undefined, free it
    nvml, host = StandInNvml(gpus), _Host(2)
    detector = NvmlDetector.with_library(nvml, poll_s=0.02, wait_ms=10)(host, _settings())
    task = asyncio.create_task(detector.run())
    await host.until("the registration error", lambda: host.notes)  # the baselines are read by then
    gpus[0].ecc = 1
    await host.until("the UCE", lambda: host.reported)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert await asyncio.to_thread(nvml.released.wait, 5)
    assert [(f.rank, f.kind) for f in host.reported] == [(10, FaultKind.UCE)]
    [(reason, message, _)] = host.notes
    assert reason == "nvml_error" and "only ECC counters are watched" in message
    assert [s.freed for s in nvml.sets] == [True] and not nvml.freed_while_waiting


# ---------------------------------------------------------------------------- NVML unavailable


class _Missing:
    @staticmethod
    def load() -> Any:
        raise ImportError("No module named 'pynvml'")


def test_without_nvidia_ml_py_auto_is_off_and_off_is_off() -> None:
    missing = NvmlDetector.with_library(None, load_nvml=staticmethod(_Missing.load))
    assert not missing.wanted(_settings(nvml="auto"))
    assert missing.wanted(_settings(nvml="on"))  # then an event says why nothing is watched
    assert not NvmlDetector.with_library(StandInNvml([])).wanted(_settings(nvml="off"))
    registry = (*DETECTORS[:-1], missing)
    assert "nvml" not in [d.name for d in DetectorSet(_Host(1), _settings(), registry)]


async def test_nvml_that_does_not_start_is_one_log_line_under_auto_and_an_event_under_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="recoverd.agent.detectors.nvml")
    for mode, notes in (("auto", []), ("on", ["nvml_unavailable"])):
        nvml, host = StandInNvml(_gpus(1), init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED), _Host(1)
        detector = NvmlDetector.with_library(nvml)(host, _settings(1, nvml=mode))
        with pytest.raises(TimeoutError):  # nothing to watch: it idles until cancelled
            await asyncio.wait_for(detector.run(), 0.5)
        assert [r for r, _, _ in host.notes] == notes and not host.reported and not nvml.sets
    assert "Driver Not Loaded" in host.notes[0][1]
    [line] = [r.message for r in caplog.records if "NVML detector off" in r.message]
    assert "Driver Not Loaded" in line
    missing = NvmlDetector.with_library(None, load_nvml=staticmethod(_Missing.load))
    host = _Host(1)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(missing(host, _settings(1, nvml="on")).run(), 0.5)
    assert "nvidia-ml-py is not installed" in host.notes[0][1]


def test_the_setting_takes_only_auto_on_off() -> None:
    with pytest.raises(ConfigError, match="auto, on, off"):
        _settings(nvml="yes")


# ---------------------------------------------------------------------------- CUDA_VISIBLE_DEVICES


def test_visible_gpus_follow_cuda_visible_devices_by_index_or_uuid() -> None:
    gpus = [Gpu(i, _uuid(i)) for i in range(4)]
    assert visible_gpus(None, gpus) == (gpus, "")
    assert visible_gpus("2,0", gpus) == ([gpus[2], gpus[0]], "")
    assert visible_gpus(f"{_uuid(3)}, {_uuid(1)[:12]}", gpus) == ([gpus[3], gpus[1]], "")
    assert visible_gpus("", gpus) == ([], "")
    # As CUDA: the list ends at the first entry that names no GPU.
    for spec in ("1,7,2", "1,MIG-abcd/1/0,2", "1,1,2", "1,GPU-0000,2"):
        shown, problem = visible_gpus(spec, gpus)
        assert shown == [gpus[1]] and "names no whole GPU" in problem, spec


async def test_cuda_visible_devices_maps_local_ranks_to_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # the agent's extra env wins over its own
    nvml, host = StandInNvml(_gpus(3)), _Host(2)
    async with _running(nvml, host, _settings(extra_env={"CUDA_VISIBLE_DEVICES": f"2,{_uuid(0)}"})):
        nvml.xid(1, 48)  # visible to no rank
        nvml.xid(0, 48)  # local rank 1's
        nvml.xid(2, 48)  # local rank 0's
        await host.until("two faults", lambda: len(host.reported) == 2)
        await asyncio.sleep(0.05)
    assert [(f.rank, f.detail.split(":")[0]) for f in host.reported] == [(11, f"GPU 0 ({_uuid(0)})"),
                                                                         (10, f"GPU 2 ({_uuid(2)})")]  # fmt: skip


async def test_local_ranks_without_a_gpu_are_said_once() -> None:
    nvml, host = StandInNvml(_gpus(2)), _Host(3)
    async with _running(nvml, host, _settings(3, extra_env={"CUDA_VISIBLE_DEVICES": "1,MIG-x"})):
        pass
    [(reason, message, _)] = host.notes
    assert reason == "device_event" and "local ranks 1..2 have no GPU" in message and "'MIG-x'" in message


# ---------------------------------------------------------------------------- the table


def test_the_xid_table() -> None:
    assert classify_xid(48).kind is FaultKind.UCE and classify_xid(94).kind is FaultKind.UCE
    assert classify_xid(79).kind is FaultKind.DEVICE_LOST
    assert classify_xid(74).kind is FaultKind.LINK and classify_xid(95).kind is FaultKind.DEVICE
    assert classify_xid(45) == XIDS[45] and XIDS[45].kind is None and not XIDS[45].noted
    assert all(classify_xid(x).kind is None for x in (13, 31, 43, 63, 92, 154, 171, 172))
    assert classify_xid(12345).kind is None and classify_xid(12345).noted
    assert all(x.noted for n, x in XIDS.items() if n != 45)  # only 45 leaves no trace


def test_the_cli_flag_sets_the_mode() -> None:
    argv = ["agent", "--etcd", "http://127.0.0.1:1", "--job", "j", "--nproc-per-node", "1"]
    for extra, mode in (([], "auto"), (["--nvml", "off"], "off"), (["--nvml", "on"], "on")):
        args = build_parser().parse_args([*argv, *extra, "--", "true"])
        assert _agent_settings(args, args.etcd, "j", 1, 0).nvml == mode
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--nvml", "yes", "--", "true"])
