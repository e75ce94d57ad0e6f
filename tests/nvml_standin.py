"""A stand-in for the NVML binding (``pynvml`` from nvidia-ml-py) at the library boundary.

It implements exactly the functions the NVML detector calls (``NVML_FUNCTIONS``), with pynvml's own
``NVMLError`` and constants (nvidia-ml-py imports without a GPU; only ``nvmlInit`` needs the driver),
over GPUs held in memory that a test drives: an XID, a rise of the uncorrectable ECC counter, a GPU
that falls off the bus. It behaves as NVML does where the detector depends on it: a wait times out
with ``NVML_ERROR_TIMEOUT``, a set delivers only the events registered for, a lost GPU answers
``NVML_ERROR_GPU_IS_LOST``, a GPU without ECC ``NVML_ERROR_NOT_SUPPORTED``. It also checks the
detector's promises: the event set is never freed while a thread waits on it, and every
``nvmlInit`` is matched by one ``nvmlShutdown``.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import pynvml
from pynvml import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NVML_ERROR_UNINITIALIZED,
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
    NVML_VOLATILE_ECC,
    NVMLError,
    nvmlEventTypeGpuUnavailableError,
    nvmlEventTypeXidCriticalError,
)

__all__ = ["FakeGpu", "StandInNvml"]


@dataclass(eq=False)
class FakeGpu:
    index: int
    uuid: str
    ecc: int | None = 0  # None: no ECC on this GPU
    lost: bool = False
    #: Lost already when the detector asks for its handle.
    lost_at_open: bool = False
    supported_events: int = nvmlEventTypeXidCriticalError | nvmlEventTypeGpuUnavailableError
    #: What nvmlDeviceRegisterEvents answers for this GPU (None: success).
    register_error: int | None = None


@dataclass(frozen=True)
class _Handle:
    gpu: FakeGpu


@dataclass(frozen=True)
class _EventData:
    """pynvml's ``c_nvmlEventData_t``'s fields (pynvml's names)."""

    device: _Handle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass(eq=False)
class _EventSet:
    registered: dict[int, int] = field(default_factory=dict)  # gpu index -> mask
    freed: bool = False


class StandInNvml:
    """``StandInNvml(gpus)`` is used where ``pynvml`` would be (``NvmlDetector.with_library``)."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.inits = 0
        self.sets: list[_EventSet] = []
        self.freed_while_waiting = False
        #: Set at the first wait for an event (the detector has opened every GPU) and when the last
        #: nvmlInit is matched by its nvmlShutdown.
        self.waiting = threading.Event()
        self.released = threading.Event()
        self._events: queue.Queue[_EventData] = queue.Queue()
        self._waiting = 0
        self._lock = threading.Lock()
        # pynvml's constants, as the detector reads them from the module.
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlEventType")):
                setattr(self, name, getattr(pynvml, name))

    # ------------------------------------------------------------ what a test does
    def xid(self, index: int, xid: int, *, ecc_rise: int = 0) -> None:
        """GPU ``index`` reports ``xid`` (a DBE also raises the counter: ``ecc_rise``)."""
        gpu = self.gpus[index]
        if ecc_rise and gpu.ecc is not None:
            gpu.ecc += ecc_rise
        self._events.put(_EventData(_Handle(gpu), nvmlEventTypeXidCriticalError, xid))

    def gone(self, index: int) -> None:
        """GPU ``index`` falls off the bus: every query of it now answers GPU_IS_LOST."""
        self.gpus[index].lost = True

    # ------------------------------------------------------------ the NVML functions used
    def _check(self) -> None:
        if self.inits <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: _Handle) -> FakeGpu:
        self._check()
        if handle.gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return handle.gpu

    # pynvml's names, hence not snake_case.
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self._check()
        self.inits -= 1
        if self.inits == 0:
            self.released.set()

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._check()
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost_at_open:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return _Handle(self.gpus[index])

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self._check()
        return handle.gpu.uuid  # known to the driver even for a lost GPU

    def nvmlDeviceGetSupportedEventTypes(self, handle: _Handle) -> int:
        return self._gpu(handle).supported_events

    def nvmlDeviceRegisterEvents(self, handle: _Handle, event_types: int, event_set: _EventSet) -> None:
        gpu = self._gpu(handle)
        if gpu.register_error is not None:
            raise NVMLError(gpu.register_error)
        if event_types & ~gpu.supported_events:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        event_set.registered[gpu.index] = event_set.registered.get(gpu.index, 0) | event_types

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter_type: int) -> int:
        gpu = self._gpu(handle)
        assert (error_type, counter_type) == (NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC)
        if gpu.ecc is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.ecc

    def nvmlEventSetCreate(self) -> _EventSet:
        self._check()
        event_set = _EventSet()
        self.sets.append(event_set)
        return event_set

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeoutms: int) -> _EventData:
        self._check()
        assert not event_set.freed
        with self._lock:
            self._waiting += 1
        self.waiting.set()
        try:
            while True:
                try:
                    data = self._events.get(timeout=timeoutms / 1000)
                except queue.Empty:
                    raise NVMLError(NVML_ERROR_TIMEOUT) from None
                if data.eventType & event_set.registered.get(data.device.gpu.index, 0):
                    return data
        finally:
            with self._lock:
                self._waiting -= 1

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self._check()
        with self._lock:
            self.freed_while_waiting |= self._waiting > 0
        event_set.freed = True


def surface(module: Any) -> set[str]:
    """The NVML function names a module offers (to compare the stand-in with pynvml)."""
    return {name for name in dir(module) if name.startswith("nvml") and callable(getattr(module, name))}
