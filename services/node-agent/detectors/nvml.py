"""NVML: what a GPU says about itself (XID errors, uncorrectable ECC, gone from the bus) becomes a
fault for the ranks on that GPU (``--nvml auto|on|off``; docs/detectors.md walks through it).

Three observations, one NVML worker thread:

* **XID events.** Every GPU is registered for ``nvmlEventTypeXidCriticalError`` (and
  ``nvmlEventTypeGpuUnavailableError`` where the driver has it) in one event set; the worker waits
  on it with a bounded timeout. Each XID is classified by :data:`XIDS`, the one table of what an
  XID means here. The double-bit-ECC and poison event types are not registered: the driver reports
  the same errors as XIDs 48/94/95, and one error must be one fault.
* **Uncorrectable ECC counters** (volatile: since the driver loaded or the GPU was reset) are read
  every :attr:`NvmlDetector.poll_s`; a rise is a UCE for the ranks on that GPU. This catches what a
  GPU reports only in its counters. After an XID that is a UCE the counter is read again at once,
  so the same error does not come back as a rise.
* **A GPU gone.** A query answered ``NVML_ERROR_GPU_IS_LOST`` (the poll queries every GPU), XID 79
  or a GPU-unavailable event is DEVICE_LOST, once per rank incarnation whatever the source.

A rank's GPU is its local rank, looked up in ``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-`` UUIDs)
where the agent's environment sets one: the ranks inherit that environment and pick their device
by ``LOCAL_RANK`` (:func:`visible_gpus`). Only running ranks get faults; an event of a GPU that
holds none of this node's ranks is not this job's business and is dropped.

Why one thread owned by the detector: NVML calls block (a wait, up to its timeout), and the event
set may only be freed once no thread waits on it. Every call goes through one single-worker
executor, so the close queued when the detector is cancelled runs after the wait in flight returns:
never under a waiter, and without holding up the agent's shutdown.

Errors: an NVML that cannot start is "off" with one log line under ``auto`` and an event under
``on``; an error the detector expects (no ECC, events not supported, a timeout) is handled where it
happens; any other NVML error is recorded once per kind and the detector goes on. Nothing here
stops a rank: it reports, and the recovery ladder decides.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, TypeVar, cast

from recoverd.agent.detectors.base import Detected, Detector, DetectorHost, FaultKind
from recoverd.records import pb

if TYPE_CHECKING:
    from recoverd.agent.ranktable import RankSlot
    from recoverd.agent.settings import AgentSettings

__all__ = ["NVML_FUNCTIONS", "XIDS", "Gpu", "NvmlDetector", "Xid", "classify_xid", "visible_gpus"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Event reasons (``recoverctl events``).
NVML_UNAVAILABLE = "nvml_unavailable"
NVML_ERROR = "nvml_error"
DEVICE_EVENT = "device_event"

#: Every NVML function the detector calls: a binding lacking one is treated as no NVML, and the
#: tests' stand-in implements exactly these.
NVML_FUNCTIONS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceRegisterEvents",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlEventSetCreate",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
)


@dataclass(frozen=True, slots=True)
class Xid:
    """What one XID means to recoverd."""

    #: The fault it is for the ranks on the GPU; None: no fault.
    kind: FaultKind | None
    #: NVIDIA's description, shortened, as it appears in the fault's detail.
    meaning: str
    #: Whether an XID that is no fault is still recorded as an event (False: only logged).
    noted: bool = True


_UCE, _LINK, _DEVICE, _LOST = FaultKind.UCE, FaultKind.LINK, FaultKind.DEVICE, FaultKind.DEVICE_LOST

#: The one table of XIDs (NVIDIA's XID catalogue for Ampere and newer, "Resolution Bucket
#: (Immediate Action)"; docs/detectors.md has the reasons). An XID not listed is an event, no fault.
XIDS: Mapping[int, Xid] = {
    # The application's own error, or the aftermath of a process ending: if the rank dies of it,
    # its exit is the fault (the exit detector); NVIDIA's device plugin skips these too.
    13: Xid(None, "graphics engine exception, usually the application's own illegal access or instruction"),
    31: Xid(None, "GPU memory page fault, usually the application's illegal address"),
    43: Xid(None, "GPU stopped processing: a process hit a software-induced fault; the GPU is healthy"),
    # Logged whenever a process using the GPU is killed: recoverd's own stops produce it on every
    # recovery (a fault would start the next recovery), and with 94/95 the other XID is the fault.
    45: Xid(None, "preemptive cleanup after a process was killed or a previous error", noted=False),
    68: Xid(None, "video decoder exception"),
    137: Xid(None, "NVLink privilege error: the application's illegal peer access"),
    # Information: the GPU goes on working, or another XID carries the fault.
    63: Xid(None, "ECC row remapping / page retirement recorded; takes effect at the next GPU reset"),
    92: Xid(None, "high single-bit (corrected) ECC error rate"),
    121: Xid(None, "corrected errors on the C2C link to the CPU"),
    154: Xid(None, "GPU recovery action changed (summarises another XID)"),
    171: Xid(None, "details of an XID 48 (DRAM)"),
    172: Xid(None, "details of an XID 48 (SRAM)"),
    # Uncorrectable device-memory errors the application can compute again past (MindCluster UCE).
    48: Xid(_UCE, "double-bit ECC error: uncorrectable device-memory error"),
    94: Xid(_UCE, "contained memory error: only the application that touched it is hit"),
    # Interconnect (MindCluster's HCCL link type).
    74: Xid(_LINK, "NVLink error"),
    136: Xid(_LINK, "NVLink training failed"),
    144: Xid(_LINK, "NVLink SAW error"),
    145: Xid(_LINK, "NVLink RLW error"),
    146: Xid(_LINK, "NVLink TLW error"),
    147: Xid(_LINK, "NVLink TREX error"),
    148: Xid(_LINK, "NVLink NVLPW control error"),
    149: Xid(_LINK, "NVLink NETIR error"),
    150: Xid(_LINK, "NVLink MSE error"),
    # The process on the GPU must be restarted (NVIDIA: restart the application or reset the GPU).
    8: Xid(_DEVICE, "GPU stopped processing (idle timeout)"),
    32: Xid(_DEVICE, "invalid or corrupted push buffer stream (PCIe)"),
    46: Xid(_DEVICE, "GPU stopped processing (GPU timeout); the GPU needs a reset"),
    62: Xid(_DEVICE, "internal micro-controller halt; the GPU needs a reset"),
    64: Xid(_DEVICE, "ECC row remapping / page retirement failed; the GPU needs a reset"),
    95: Xid(_DEVICE, "uncontained memory error: every application on the GPU is hit; the GPU needs a reset"),
    109: Xid(_DEVICE, "context switch timeout; the GPU needs a reset"),
    110: Xid(_DEVICE, "security fault; the GPU needs a reset"),
    119: Xid(_DEVICE, "GSP RPC timeout; the GPU needs a reset"),
    120: Xid(_DEVICE, "GSP error; the GPU needs a reset"),
    140: Xid(_DEVICE, "unrecovered ECC error; the GPU needs a reset"),
    143: Xid(_DEVICE, "GPU initialization failure; the GPU needs a reset"),
    158: Xid(_DEVICE, "GPU fatal timeout; the GPU needs a reset"),
    # Gone.
    79: Xid(_LOST, "GPU has fallen off the bus"),
}


def classify_xid(xid: int) -> Xid:
    """What ``xid`` means here; an XID not in :data:`XIDS` is an event and no fault (a missed fault
    is still found by the exit and hang detectors; a false one would restart a healthy rank)."""
    return XIDS.get(xid) or Xid(None, "not in recoverd's XID table")


@dataclass(eq=False, slots=True)
class Gpu:
    """One GPU as NVML numbers it (PCI bus order), with what the worker thread knows of it."""

    index: int
    uuid: str
    handle: Any = None
    #: The last volatile uncorrected ECC count read; None: not read yet, or no ECC on this GPU.
    ecc: int | None = None
    ecc_supported: bool = True
    #: NVML said the GPU is lost (it stays so until the detector restarts: NVML cannot get it back).
    lost: bool = False

    def __str__(self) -> str:
        return f"GPU {self.index} ({self.uuid or 'uuid unknown'})"


def visible_gpus(spec: str | None, gpus: Sequence[Gpu]) -> tuple[list[Gpu], str]:
    """The GPUs in CUDA's order for ``CUDA_VISIBLE_DEVICES`` = ``spec``: local rank N uses entry N.

    Unset: every GPU in NVML's order. Entries are indices or ``GPU-`` UUIDs (a unique prefix is
    enough, as for CUDA). As CUDA does, the list ends at the first entry that names no GPU of this
    node (a MIG device, a typo, a repeat); the second value says why, or is empty.
    """
    if spec is None:
        return list(gpus), ""
    out: list[Gpu] = []
    for entry in (e.strip() for e in spec.split(",")):
        if not entry and not out:
            break  # "" hides every GPU: a CPU-only run, nothing to say
        if entry.isdigit():
            found = [g for g in gpus if g.index == int(entry)]
        elif entry.startswith("GPU-"):
            found = [g for g in gpus if g.uuid.startswith(entry)]
        else:
            found = []
        if len(found) != 1 or found[0] in out:
            return out, f"CUDA_VISIBLE_DEVICES entry {entry!r} names no whole GPU of this node (MIG is not watched)"
        out.append(found[0])
    return out, ""


@dataclass(frozen=True, slots=True)
class _Seen:
    """One observation of the worker thread, for the event loop to turn into faults or an event."""

    #: None: about NVML itself, not one GPU (always recorded).
    gpu: Gpu | None
    #: None: an event only.
    kind: FaultKind | None
    detail: str
    instance: str = ""
    data: Mapping[str, str] = field(default_factory=dict)


class _Session:
    """NVML state, touched only by the detector's one worker thread (so never under a waiter)."""

    def __init__(self, nvml: Any, wait_ms: int) -> None:
        self.nvml = nvml
        self.wait_ms = wait_ms
        self.started = False
        self.event_set: Any = None
        self.gpus: list[Gpu] = []
        self._errors: set[tuple[str, int]] = set()
        self._xid_mask = int(nvml.nvmlEventTypeXidCriticalError)
        self._gone_mask = int(getattr(nvml, "nvmlEventTypeGpuUnavailableError", 0))

    def _code(self, err: BaseException) -> int:
        return int(getattr(err, "value", -1))

    def _is_lost(self, err: BaseException) -> bool:
        return self._code(err) == self.nvml.NVML_ERROR_GPU_IS_LOST

    def _error_once(self, where: str, err: BaseException) -> list[_Seen]:
        """An unexpected NVML error is recorded once per place and code (a broken driver would
        otherwise write one event per poll)."""
        key = (where, self._code(err))
        if key in self._errors:
            return []
        self._errors.add(key)
        return [
            _Seen(None, None, f"NVML error {where}: {err} (code {self._code(err)}); shown once, the detector goes on")
        ]

    def start(self) -> None:
        self.nvml.nvmlInit()
        self.started = True

    def open(self) -> list[_Seen]:
        """Find the GPUs, register them for events, read the ECC baselines."""
        n = self.nvml
        seen: list[_Seen] = []
        for index in range(n.nvmlDeviceGetCount()):
            gpu = Gpu(index, "")
            try:
                gpu.handle = n.nvmlDeviceGetHandleByIndex(index)
                gpu.uuid = str(n.nvmlDeviceGetUUID(gpu.handle))
            except n.NVMLError as err:
                seen += [self._lost(gpu, str(err))] if self._is_lost(err) else self._error_once(f"opening {gpu}", err)
            self.gpus.append(gpu)
        try:
            self.event_set = n.nvmlEventSetCreate()
        except n.NVMLError as err:
            seen += self._error_once("creating the event set (only ECC counters are watched)", err)
        registered = 0
        for gpu in self.gpus:
            if self.event_set is None or gpu.handle is None:
                continue
            try:
                mask = (self._xid_mask | self._gone_mask) & int(n.nvmlDeviceGetSupportedEventTypes(gpu.handle))
                if mask:
                    n.nvmlDeviceRegisterEvents(gpu.handle, mask, self.event_set)
                    registered += 1
            except n.NVMLError as err:
                if self._is_lost(err):
                    seen.append(self._lost(gpu, str(err)))
                elif self._code(err) == n.NVML_ERROR_UNKNOWN:
                    # NVML: the set is undefined after this and must be freed; counters still work.
                    seen += self._error_once(f"registering {gpu} for events (only ECC counters are watched)", err)
                    registered = 0
                    break
                elif self._code(err) != n.NVML_ERROR_NOT_SUPPORTED:  # not supported: the set still works
                    seen += self._error_once(f"registering {gpu} for events", err)
        if registered == 0 and self.event_set is not None:
            self._free_set()
        log.info("NVML: %d GPU(s), %d registered for XID events", len(self.gpus), registered)
        for gpu in self.gpus:
            seen += self._read_ecc(gpu)[1]  # the baselines: errors from before this run are not its faults
        return seen

    def wait(self) -> list[_Seen]:
        """One bounded wait for an event (``wait_ms``); [] when none came."""
        n = self.nvml
        if self.event_set is None:
            time.sleep(self.wait_ms / 1000)
            return []
        try:
            data = n.nvmlEventSetWait_v2(self.event_set, self.wait_ms)
        except n.NVMLError as err:
            if self._code(err) == n.NVML_ERROR_TIMEOUT:
                return []
            time.sleep(self.wait_ms / 1000)  # a broken set must not make this loop spin
            return self._error_once("waiting for events", err)
        gpu = self._gpu_of(data.device)
        if gpu is None:
            # The lost-GPU poll still finds a GPU that is gone; anything else cannot be placed.
            log.warning(
                "NVML event 0x%x (data %d) from a GPU that cannot be identified", data.eventType, data.eventData
            )
            return []
        if int(data.eventType) & self._xid_mask:
            return self._xid(gpu, int(data.eventData))
        if int(data.eventType) & self._gone_mask:
            return [self._lost(gpu, "NVML reports the GPU unavailable")]
        return []

    def poll(self) -> list[_Seen]:
        """Read every GPU's uncorrected ECC count: a rise is a UCE, a lost GPU is DEVICE_LOST."""
        seen: list[_Seen] = []
        for gpu in self.gpus:
            if gpu.handle is not None and gpu.ecc_supported:
                before = gpu.ecc
                count, trouble = self._read_ecc(gpu)  # a lost GPU answers GPU_IS_LOST
                seen += trouble
                if count is not None and before is not None and count > before:
                    seen.append(
                        _Seen(
                            gpu,
                            FaultKind.UCE,
                            f"{gpu}: volatile uncorrectable ECC errors rose from {before} to {count}",
                            _ecc_instance(gpu, count),
                            {"gpu": str(gpu.index), "uuid": gpu.uuid, "ecc": str(count)},
                        )
                    )
            elif gpu.lost:
                seen.append(self._lost(gpu, "NVML: GPU is lost"))  # again for a new incarnation
        return seen

    def close(self) -> None:
        """Free the set and shut NVML down (queued behind any wait in flight)."""
        self._free_set()
        if self.started:
            self.started = False
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError as err:
                log.debug("nvmlShutdown: %s", err)

    def _free_set(self) -> None:
        if self.event_set is not None:
            event_set, self.event_set = self.event_set, None
            try:
                self.nvml.nvmlEventSetFree(event_set)
            except self.nvml.NVMLError as err:
                log.debug("nvmlEventSetFree: %s", err)

    def _gpu_of(self, handle: Any) -> Gpu | None:
        """The GPU of an event's handle, by UUID (as NVIDIA's device plugin does)."""
        try:
            uuid = str(self.nvml.nvmlDeviceGetUUID(handle))
        except self.nvml.NVMLError:
            return None
        return next((g for g in self.gpus if g.uuid == uuid), None)

    def _xid(self, gpu: Gpu, xid: int) -> list[_Seen]:
        info = classify_xid(xid)
        detail = f"{gpu}: XID {xid}, {info.meaning}"
        data = {"gpu": str(gpu.index), "uuid": gpu.uuid, "xid": str(xid)}
        if info.kind is None:
            if not info.noted:
                log.debug("%s: not a fault", detail)
                return []
            return [_Seen(gpu, None, f"{detail}; not a fault", data=data)]
        if info.kind is FaultKind.DEVICE_LOST:
            return [self._lost(gpu, f"XID {xid}, {info.meaning}")]
        count = self._read_ecc(gpu)[0] if info.kind is FaultKind.UCE else None
        if count is not None:
            # Named by the counter, as the poll names a rise: the same error seen both ways (the
            # event, the counter) is one fault id whichever is seen first.
            instance = _ecc_instance(gpu, count)
        else:
            instance = f"gpu{gpu.index}.xid{xid}.{time.time_ns() // 1_000_000}"
        return [_Seen(gpu, info.kind, detail, instance, data)]

    def _lost(self, gpu: Gpu, why: str) -> _Seen:
        gpu.lost = True
        # One instance for every source (XID 79, the unavailable event, a lost query): one fault.
        return _Seen(
            gpu,
            FaultKind.DEVICE_LOST,
            f"{gpu}: gone from the bus ({why})",
            f"gpu{gpu.index}.lost",
            {"gpu": str(gpu.index), "uuid": gpu.uuid},
        )

    def _read_ecc(self, gpu: Gpu) -> tuple[int | None, list[_Seen]]:
        """The GPU's volatile uncorrected ECC count, now its baseline (None: not read), and what
        reading it found (the GPU lost, an unexpected error)."""
        n = self.nvml
        if gpu.handle is None or not gpu.ecc_supported:
            return None, []
        try:
            count = int(
                n.nvmlDeviceGetTotalEccErrors(gpu.handle, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)
            )
        except n.NVMLError as err:
            if self._is_lost(err):
                return None, [self._lost(gpu, str(err))]
            if self._code(err) == n.NVML_ERROR_NOT_SUPPORTED:
                # No ECC (or ECC off): XID events still watch this GPU, including XID 79.
                gpu.ecc_supported = False
                log.info("NVML: %s has no ECC counters; its XID events are still watched", gpu)
                return None, []
            return None, self._error_once(f"reading {gpu}'s ECC counters", err)
        gpu.ecc, gpu.lost = count, False  # a drop (the GPU was reset) is a new baseline too
        return count, []


def _ecc_instance(gpu: Gpu, count: int) -> str:
    return f"gpu{gpu.index}.ecc{count}"


class NvmlDetector(Detector):
    """Faults from NVML for the ranks on each GPU (module docstring; docs/detectors.md)."""

    name = "nvml"
    #: Seconds between reads of the ECC counters (each GPU queried: also how a lost GPU is found).
    poll_s: ClassVar[float] = 5.0
    #: Longest single wait for an event (ms): bounds how long a cancelled detector's close waits.
    wait_ms: ClassVar[int] = 1000

    def __init__(self, host: DetectorHost, settings: AgentSettings) -> None:
        super().__init__(host, settings)
        self._visible: list[Gpu] = []
        #: (rank, generation, restart count, kind, instance) already reported: one fault each.
        self._reported: set[tuple[int, int, int, FaultKind, str]] = set()

    @staticmethod
    def load_nvml() -> Any:
        """The NVML binding, ``pynvml`` from nvidia-ml-py (the ``gpu`` extra): the seam at the
        library boundary, replaced by :meth:`with_library`. Imported here, not at module level, so
        the agent runs where it is not installed."""
        import pynvml

        return pynvml

    @classmethod
    def with_library(cls, nvml: Any, **attributes: Any) -> type[NvmlDetector]:
        """This detector bound to another NVML binding (a stand-in in tests, a vendored module),
        with class attributes replaced (e.g. ``poll_s``); for a registry such as
        ``(ExitDetector, ResetJsonDetector, NvmlDetector.with_library(fake))``."""
        body: dict[str, Any] = {"load_nvml": staticmethod(lambda: nvml), **attributes}
        return cast("type[NvmlDetector]", type(cls.__name__, (cls,), body))

    @classmethod
    def wanted(cls, settings: AgentSettings) -> bool:
        """``off``: no; ``on``: yes (NVML missing is then an event); ``auto``: if the binding
        imports (whether NVML starts is found out in :meth:`run`, off the event loop)."""
        if settings.nvml == "off":
            return False
        if settings.nvml == "on":
            return True
        try:
            cls.load_nvml()
        except ImportError as err:
            log.info("NVML detector off: nvidia-ml-py is not installed (%s)", err)
            return False
        return True

    async def run(self) -> None:
        try:
            nvml = self.load_nvml()
        except ImportError as err:
            await self._unavailable(f"nvidia-ml-py is not installed ({err})")
        missing = [f for f in NVML_FUNCTIONS if not callable(getattr(nvml, f, None))]
        if missing:
            await self._unavailable(f"this nvidia-ml-py lacks {', '.join(missing)}")
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvml")
        session = _Session(nvml, self.wait_ms)

        async def call(fn: Callable[[], T]) -> T:
            return await loop.run_in_executor(executor, fn)

        try:
            try:
                await call(session.start)
            except nvml.NVMLError as err:
                await self._unavailable(f"NVML did not start: {err}")
            opened = await call(session.open)
            self._map_ranks(session.gpus)
            self._handle(opened)
            next_poll = loop.time() + self.poll_s
            while True:
                self._handle(await call(session.wait))
                if loop.time() >= next_poll:
                    self._handle(await call(session.poll))
                    next_poll = loop.time() + self.poll_s
        finally:
            # Runs after any wait in flight (one worker): the set is never freed under a waiter.
            executor.submit(session.close)
            executor.shutdown(wait=False)

    def rank_ended(self, slot: RankSlot) -> None:
        self._reported = {key for key in self._reported if key[0] != slot.rank}

    async def _unavailable(self, why: str) -> NoReturn:
        """Say why there is nothing to watch (an event under ``on``, one log line under ``auto``),
        then idle until cancelled: :meth:`run` returns only by cancellation, as the runner expects."""
        if self.settings.nvml == "on":
            self.host.note(NVML_UNAVAILABLE, f"--nvml on, but {why}: GPU faults are not detected on this node")
        else:
            log.info("NVML detector off: %s", why)
        await asyncio.Event().wait()
        raise AssertionError("unreachable: the wait ends only by cancellation")

    def _map_ranks(self, gpus: Sequence[Gpu]) -> None:
        env = self.settings.extra_env
        spec = env["CUDA_VISIBLE_DEVICES"] if "CUDA_VISIBLE_DEVICES" in env else os.environ.get("CUDA_VISIBLE_DEVICES")
        self._visible, problem = visible_gpus(spec, gpus)
        nproc = self.settings.nproc_per_node
        if len(self._visible) < nproc and (problem or self._visible):
            self.host.note(
                DEVICE_EVENT,
                f"local ranks {len(self._visible)}..{nproc - 1} have no GPU NVML knows"
                f" ({problem or f'{len(self._visible)} GPU(s) visible'}): their GPU faults are not detected",
            )
        log.info(
            "NVML: local rank -> GPU %s",
            ", ".join(f"{lr}->{g.index}" for lr, g in enumerate(self._visible[:nproc])) or "(none)",
        )

    def _ranks_on(self, gpu: Gpu) -> Iterable[RankSlot]:
        for slot in self.host.ranks().values():
            if (
                slot.state == pb.RANK_RUNNING
                and slot.local_rank < len(self._visible)
                and self._visible[slot.local_rank] is gpu
            ):
                yield slot

    def _handle(self, seen: Iterable[_Seen]) -> None:
        for item in seen:
            if item.gpu is None:
                self.host.note(NVML_ERROR, item.detail)
                continue
            slots = list(self._ranks_on(item.gpu))
            if not slots:
                log.debug("%s: no running local rank on this GPU", item.detail)
                continue
            if item.kind is None:
                self.host.note(
                    DEVICE_EVENT, item.detail, data={**item.data, "ranks": ",".join(str(s.rank) for s in slots)}
                )
                continue
            for slot in slots:
                key = (slot.rank, slot.generation, slot.restart_count, item.kind, item.instance)
                if key in self._reported:
                    continue
                self._reported.add(key)
                self.host.report(Detected(rank=slot.rank, kind=item.kind, detail=item.detail, instance=item.instance))
