"""The checks of scripts/gpu_check.sh, one per invocation: ``python checks.py CHECK [--rehearse]``.

Each invocation appends one JSON line per result to ``$GPU_CHECK_RESULTS`` (and prints it):
``{"check", "status": PASS|FAIL|SKIP, "reason", "mode", "seconds", "details"}``. ``mode`` is
``gpu`` on a CUDA device, ``rehearsal`` for ``--rehearse`` (the same check with the GPU replaced by
the CPU and NVML by tests/nvml_standin.py: it proves the harness, never the GPU). Exit status: 0
when every result it wrote is PASS or SKIP, 1 when one is FAIL, 3 for ``env``/``deps`` when what the
later checks need is missing (the shell script then skips them with the reason it printed).

Checks (docs/gpu.md says what each proves and what it cannot):

* ``env``: the device as torch and NVML see it (written to ``$OUT/env.json`` too).
* ``deps``: recoverd's own dependencies import (aetcd, grpc, protobuf, ...; the wheelhouse of
  ``make gpu-check-bundle``) and an etcd binary is found.
* ``nvml-raw``: every NVML function the detector calls (``NVML_FUNCTIONS``, read from the
  detector's source, so it needs only nvidia-ml-py), called on GPU 0, with sane answers.
* ``nvml-detector``: the detector's own code on the real driver: its NVML session opens, waits
  and polls GPU 0 and finds nothing wrong; the whole detector runs beside GPU work and reports
  no fault and no event.
* ``job``: a job under ``recoverd run`` with warm starts (``--variant world1``: 1 rank, the
  trainer's default ``cpu:gloo,cuda:nccl``, checkpointed, SIGKILLed and restarted in place;
  ``world1-ref``: the same without the kill, for a bitwise comparison; ``shared2``: 2 ranks sharing
  GPU 0 on ``cuda:gloo``, rank 1 SIGKILLed, rank 0 survives and heals it).
* ``nccl-group``: ``ResilientGroup`` on NCCL (world size 1): form, all-reduce, abort, form the
  next generation, all-reduce again; ``--pending``: abort while a collective waits on the GPU.
* ``nccl-raw``: the same abort and re-init with torch alone (no etcd, no recoverd dependency).
* ``nccl-probe``: whether NCCL lets two ranks of one communicator share GPU 0.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TRAIN = Path(__file__).resolve().with_name("gpu_train.py")
NVML_SOURCE = ROOT / "services" / "node-agent" / "detectors" / "nvml.py"

#: Exit status of ``env``/``deps`` when later checks cannot run (the reason is printed).
MISSING = 3


class Skip(Exception):
    """The check cannot run here; the message says why."""


class Failed(AssertionError):
    """The check ran and found something wrong; the message says what."""


def check(condition: object, message: str) -> None:
    if not condition:
        raise Failed(message)


def mode(rehearse: bool) -> str:
    return "rehearsal" if rehearse else "gpu"


def emit(name: str, status: str, reason: str, mode_: str, seconds: float, details: dict[str, Any]) -> dict[str, Any]:
    line = {
        "check": name,
        "status": status,
        "reason": reason,
        "mode": mode_,
        "seconds": round(seconds, 2),
        "details": details,
    }
    text = json.dumps(line, default=str)
    results = os.environ.get("GPU_CHECK_RESULTS")
    if results:
        with open(results, "a") as out:
            out.write(text + "\n")
    print(text, flush=True)
    return line


def run_check(name: str, mode_: str, body: Callable[[dict[str, Any]], str]) -> str:
    """``body(details)`` returns the PASS reason, raises Skip or anything else (a FAIL); it
    fills ``details`` as it goes, so a failure still shows what was seen. Returns the status."""
    details: dict[str, Any] = {}
    started = time.monotonic()
    try:
        reason = body(details)
    except Skip as why:
        emit(name, "SKIP", str(why), mode_, time.monotonic() - started, details)
        return "SKIP"
    except BaseException as err:  # a FAIL with what happened; never a traceback without a result line
        details["traceback"] = traceback.format_exc(limit=8)[-3000:]
        emit(name, "FAIL", f"{type(err).__name__}: {err}"[:1000], mode_, time.monotonic() - started, details)
        return "FAIL"
    emit(name, "PASS", reason, mode_, time.monotonic() - started, details)
    return "PASS"


def exit_code(status: str) -> int:
    return 1 if status == "FAIL" else 0


def work_dir(name: str) -> Path:
    base = Path(os.environ.get("GPU_CHECK_WORK") or tempfile.mkdtemp(prefix="gpu-check-"))
    path = base / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def wait_for(what: str, predicate: Callable[[], Any], timeout: float, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(every)
    raise Failed(f"timed out after {timeout:g}s waiting for {what}")


def in_thread(what: str, work: Callable[[], Any], timeout: float) -> Any:
    """``work()`` on a daemon thread, bounded: a GPU call that hangs becomes a FAIL, not a hang."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = work()
        except BaseException as err:
            result["error"] = err

    thread = threading.Thread(target=run, name=what, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise Failed(f"{what} did not return within {timeout:g}s")
    if "error" in result:
        raise result["error"]
    return result.get("value")


# ---------------------------------------------------------------------------- env, deps


def cmd_env(args: argparse.Namespace) -> int:
    """What torch and NVML say about the device; exit MISSING when no CUDA device is usable."""
    info: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable}
    try:
        import torch

        info.update(
            torch=torch.__version__,
            torch_cuda=torch.version.cuda,
            cuda_available=torch.cuda.is_available(),
            device_count=torch.cuda.device_count(),
        )
        if info["cuda_available"]:
            info["device"] = torch.cuda.get_device_name(0)
            info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
            with contextlib.suppress(Exception):
                info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as err:
        info["torch_error"] = f"{type(err).__name__}: {err}"
    try:
        import pynvml

        info["nvidia_ml_py"] = getattr(pynvml, "__version__", "?")
        pynvml.nvmlInit()
        try:
            info["driver"] = pynvml.nvmlSystemGetDriverVersion()
            info["nvml_gpus"] = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception as err:
        info["nvml_error"] = f"{type(err).__name__}: {err}"
    if args.write:
        Path(args.write).write_text(json.dumps(info, indent=1, default=str) + "\n")
    print(json.dumps(info, default=str), flush=True)
    if not info.get("cuda_available"):
        why = info.get("torch_error") or f"torch {info.get('torch')} sees no CUDA device"
        print(f"no CUDA device: {why}", file=sys.stderr, flush=True)
        return MISSING
    return 0


#: What recoverd itself needs to run a job (pyproject's dependencies), by import name.
PROJECT_MODULES = ("aetcd", "grpc", "google.protobuf", "yaml", "psutil", "prometheus_client", "asyncinotify")


def cmd_deps(args: argparse.Namespace) -> int:
    def body(details: dict[str, Any]) -> str:
        missing: dict[str, str] = {}
        for name in (*PROJECT_MODULES, "recoverd.cli.main", "recoverd.agent.detectors.nvml", "taskd_client.pytorch"):
            try:
                module = __import__(name, fromlist=["_"])
                details[name] = str(getattr(module, "__version__", "") or getattr(module, "__file__", ""))
            except Exception as err:
                missing[name] = f"{type(err).__name__}: {err}"[:200]
        if missing:
            details["missing"] = missing
            if all("torch" in why for why in missing.values()):
                raise Skip(f"torch is not installed for {sys.executable}: the job and group checks cannot run")
            raise Skip(
                f"recoverd's dependencies are missing here ({', '.join(missing)}): the job and group checks"
                " cannot run; on the device, carry the wheelhouse of `make gpu-check-bundle` (.gpu-bundle)"
            )
        from recoverd.etcd_server import choose_etcd_binary

        try:
            etcd = choose_etcd_binary(None)
        except Exception as err:
            details["etcd_error"] = str(err)
            raise Skip(f"no etcd binary ({err}): the job and group checks cannot run") from None
        details["etcd"] = etcd.describe()
        return f"recoverd's dependencies import; {etcd.describe()}"

    status = run_check("deps", mode(args.rehearse), body)
    return MISSING if status == "SKIP" else exit_code(status)


# ---------------------------------------------------------------------------- NVML


def detector_functions() -> tuple[str, ...]:
    """``NVML_FUNCTIONS`` as the detector's source defines it (read, not imported: this needs only
    nvidia-ml-py, not recoverd's dependencies)."""
    tree = ast.parse(NVML_SOURCE.read_text())
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == "NVML_FUNCTIONS" for t in targets):
            assert node.value is not None
            return tuple(ast.literal_eval(node.value))
    raise Failed(f"NVML_FUNCTIONS not found in {NVML_SOURCE}")


def standin_nvml() -> Any:
    """The tests' stand-in (tests/nvml_standin.py) with one healthy GPU: the rehearsal's NVML."""
    sys.path.insert(0, str(ROOT))
    from tests.nvml_standin import FakeGpu, StandInNvml

    return StandInNvml([FakeGpu(0, "GPU-00000000-aaaa-bbbb-cccc-000000000000")])


def load_nvml(rehearse: bool) -> Any:
    if rehearse:
        return standin_nvml()
    try:
        import pynvml
    except ImportError as err:
        raise Skip(f"nvidia-ml-py is not installed ({err})") from None
    return pynvml


def cmd_nvml_raw(args: argparse.Namespace) -> int:
    def body(details: dict[str, Any]) -> str:
        functions = detector_functions()
        nvml = load_nvml(args.rehearse)
        details["functions"] = list(functions)
        missing = [f for f in functions if not callable(getattr(nvml, f, None))]
        check(not missing, f"this nvidia-ml-py lacks {missing} (the detector would treat it as no NVML)")
        calls: dict[str, Any] = {}
        details["calls"] = calls
        nvml.nvmlInit()
        calls["nvmlInit"] = "ok"
        try:
            count = nvml.nvmlDeviceGetCount()
            calls["nvmlDeviceGetCount"] = count
            check(isinstance(count, int) and count >= 1, f"nvmlDeviceGetCount = {count!r}")
            handle = nvml.nvmlDeviceGetHandleByIndex(0)
            calls["nvmlDeviceGetHandleByIndex"] = "a handle"
            uuid = nvml.nvmlDeviceGetUUID(handle)
            calls["nvmlDeviceGetUUID"] = uuid
            # The detector maps CUDA_VISIBLE_DEVICES' GPU-... entries by str(uuid): bytes would not match.
            check(isinstance(uuid, str) and uuid.startswith("GPU-"), f"nvmlDeviceGetUUID = {uuid!r}: not a 'GPU-' str")
            for extra in ("nvmlDeviceGetName", "nvmlSystemGetDriverVersion"):  # information only
                with contextlib.suppress(Exception):
                    fn = getattr(nvml, extra)
                    details[extra] = fn(handle) if extra.startswith("nvmlDevice") else fn()
            supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
            calls["nvmlDeviceGetSupportedEventTypes"] = hex(supported)
            check(isinstance(supported, int), f"nvmlDeviceGetSupportedEventTypes = {supported!r}")
            wanted = int(nvml.nvmlEventTypeXidCriticalError) | int(getattr(nvml, "nvmlEventTypeGpuUnavailableError", 0))
            mask = wanted & supported
            details["xid_events_supported"] = bool(mask & int(nvml.nvmlEventTypeXidCriticalError))
            try:
                ecc = nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                )
                calls["nvmlDeviceGetTotalEccErrors"] = ecc
                check(isinstance(ecc, int) and ecc >= 0, f"volatile uncorrected ECC count = {ecc!r}")
            except nvml.NVMLError as err:
                check(getattr(err, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED, f"ECC counters: {err}")
                calls["nvmlDeviceGetTotalEccErrors"] = "not supported (no ECC, or ECC off)"
            event_set = nvml.nvmlEventSetCreate()
            calls["nvmlEventSetCreate"] = "a set"
            try:
                if mask:
                    try:
                        nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
                        calls["nvmlDeviceRegisterEvents"] = hex(mask)
                    except nvml.NVMLError as err:
                        calls["nvmlDeviceRegisterEvents"] = f"refused: {err}"
                        check(getattr(err, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED, f"registering: {err}")
                try:
                    data = nvml.nvmlEventSetWait_v2(event_set, 200)
                    calls["nvmlEventSetWait_v2"] = f"an event: type {data.eventType:#x}, data {data.eventData}"
                    details["event_while_idle"] = calls["nvmlEventSetWait_v2"]
                except nvml.NVMLError as err:
                    check(getattr(err, "value", None) == nvml.NVML_ERROR_TIMEOUT, f"waiting for events: {err}")
                    calls["nvmlEventSetWait_v2"] = "timeout (no event), as expected"
            finally:
                nvml.nvmlEventSetFree(event_set)
                calls["nvmlEventSetFree"] = "ok"
        finally:
            nvml.nvmlShutdown()
            calls["nvmlShutdown"] = "ok"
        xid = "XID events registered" if details["xid_events_supported"] else "XID events NOT supported here"
        return f"all {len(functions)} NVML functions the detector calls answered sanely on GPU 0 ({uuid}); {xid}"

    return exit_code(run_check("nvml_raw", mode(args.rehearse), body))


class _Host:
    """The agent as the detector sees it: local rank 0 (rank 0) running."""

    def __init__(self) -> None:
        from recoverd.agent.ranktable import RankSlot
        from recoverd.records import pb

        self.slots = {0: RankSlot(0, 0, state=pb.RANK_RUNNING)}
        self.reported: list[Any] = []
        self.notes: list[tuple[str, str]] = []

    @property
    def node(self) -> str:
        return "node0"

    def ranks(self) -> Any:
        return self.slots

    def report(self, found: Any) -> None:
        self.reported.append(found)

    def note(self, reason: str, message: str, *, rank: int | None = None, data: Any = None) -> None:
        self.notes.append((reason, message))


@contextlib.contextmanager
def captured_logs(name: str) -> Iterator[list[str]]:
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger(name)
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def gpu_work(stop: threading.Event, details: dict[str, Any]) -> None:
    """Matrix products on GPU 0 until ``stop``: the detector must find nothing while the GPU works."""
    import torch

    a = torch.randn(4096, 4096, device="cuda")
    n = 0
    while not stop.is_set():
        a = torch.tanh(a @ a)
        n += 1
        if n % 20 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    details["gpu_products"] = n


def cmd_nvml_detector(args: argparse.Namespace) -> int:
    def body(details: dict[str, Any]) -> str:
        nvml = load_nvml(args.rehearse)
        from recoverd.agent.detectors.nvml import NvmlDetector, _Session, visible_gpus
        from recoverd.agent.settings import AgentSettings

        # 1. The detector's NVML session, step by step: open (handles, UUIDs, event registration,
        # ECC baselines), one bounded wait, one poll; each finds nothing on a healthy GPU.
        session = _Session(nvml, wait_ms=200)
        with captured_logs("recoverd.agent.detectors.nvml") as logged:
            session.start()
            try:
                seen = session.open()
                gpus = session.gpus
                details["gpus"] = [{"index": g.index, "uuid": g.uuid, "ecc": g.ecc, "ecc_supported": g.ecc_supported}
                                   for g in gpus]  # fmt: skip
                details["xid_events_registered"] = session.event_set is not None
                check(not seen, f"opening NVML found trouble on a healthy node: {[s.detail for s in seen]}")
                check(gpus and gpus[0].handle is not None and gpus[0].uuid.startswith("GPU-"), f"GPU 0: {gpus[:1]}")
                check(not gpus[0].lost, "GPU 0 is marked lost")
                check(gpus[0].ecc is not None or not gpus[0].ecc_supported, "GPU 0's ECC baseline was not read")
                waited = session.wait()
                check(not waited, f"an idle wait saw {[s.detail for s in waited]}")
                polled = session.poll()
                check(not polled, f"the ECC poll saw {[s.detail for s in polled]}")
                by_index, why = visible_gpus("0", gpus)
                by_uuid, why2 = visible_gpus(gpus[0].uuid[:12], gpus)
                check(by_index[:1] == gpus[:1] and not why, f"CUDA_VISIBLE_DEVICES=0 -> {by_index} ({why})")
                check(by_uuid[:1] == gpus[:1] and not why2, f"CUDA_VISIBLE_DEVICES={gpus[0].uuid[:12]} -> {by_uuid}")
            finally:
                session.close()
        details["session_log"] = logged

        # 2. The whole detector as the agent runs it (its thread, its poll), beside GPU work.
        host = _Host()
        settings = AgentSettings(job="gpu-check", node="node0", argv=("true",), etcd="http://127.0.0.1:1",
                                 nproc_per_node=1, nvml="on")  # fmt: skip
        detector_cls = NvmlDetector.with_library(nvml, poll_s=0.5, wait_ms=200)
        check(detector_cls.wanted(settings), "the detector does not want to run under --nvml on")
        stop = threading.Event()
        worker = None
        if not args.rehearse:
            worker = threading.Thread(target=gpu_work, args=(stop, details), daemon=True)
            worker.start()

        async def watch() -> None:
            task = asyncio.create_task(detector_cls(host, settings).run())
            await asyncio.sleep(args.seconds)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        with captured_logs("recoverd.agent.detectors.nvml") as logged:
            asyncio.run(watch())
            stop.set()
            if worker is not None:
                worker.join(30)
            time.sleep(0.5)  # the close queued behind the last wait
        details["detector_log"] = logged
        details["notes"] = host.notes
        details["reported"] = [str(r) for r in host.reported]
        check(not host.reported, f"the detector reported faults on a healthy GPU: {details['reported']}")
        check(not host.notes, f"the detector recorded events: {host.notes}")
        check(any("GPU(s)" in line for line in logged), f"the detector never opened NVML: {logged}")
        xid = "XID events registered" if details["xid_events_registered"] else "no XID events (ECC counters only)"
        load = f" beside {details.get('gpu_products', 0)} GPU matrix products" if worker else ""
        return f"the detector's session and loop ran {args.seconds:g}s{load}: GPU 0 healthy, no fault, no event; {xid}"

    return exit_code(run_check("nvml_detector", mode(args.rehearse), body))


# ---------------------------------------------------------------------------- jobs


def ctl(endpoint: str, *argv: str) -> Any:
    out = subprocess.run(
        [sys.executable, "-m", "recoverd.cli.ctl", "--etcd", endpoint, *argv],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    return json.loads(out)


def read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def done_steps(text: str, rank: int) -> list[tuple[int, int]]:
    """(step, pid) of each ``rank R step S done T pid P`` line."""
    return [(int(s), int(p)) for s, p in re.findall(rf"^rank {rank} step (\d+) done \S+ pid (\d+)", text, flags=re.M)]


class Sampler:
    """Pids collected every ``every`` seconds on a thread while a job runs: ``GpuProcesses``, those
    NVML shows with a context on GPU 0; ``Standbys``, the warm-start server's standbys."""

    every = 0.2

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        try:
            state = self.open()
        except Exception as err:
            self.error = f"{type(err).__name__}: {err}"
            return
        try:
            while not self._stop.wait(self.every):
                try:
                    self.seen |= self.sample(state)
                except Exception as err:
                    self.error = f"{type(err).__name__}: {err}"
        finally:
            self.close()

    def open(self) -> Any:
        return None

    def sample(self, state: Any) -> set[int]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class GpuProcesses(Sampler):
    every = 0.1

    def open(self) -> Any:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByIndex(0)

    def sample(self, state: Any) -> set[int]:
        import pynvml

        return {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(state)}

    def close(self) -> None:
        import pynvml

        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


class Standbys(Sampler):
    """``ps`` shows a standby as ``... warmstart_server.py --standby-of N``."""

    every = 0.5

    def sample(self, state: Any) -> set[int]:
        import psutil

        found = set()
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if "--standby-of" in (proc.info.get("cmdline") or []):
                found.add(proc.info["pid"])
        return found


#: The jobs: ranks, backend (None: the trainer's default), whom to kill, extra script arguments.
VARIANTS: dict[str, dict[str, Any]] = {
    "world1": {"nproc": 1, "backend": None, "victim": 0, "ckpt": True},
    "world1-ref": {"nproc": 1, "backend": None, "victim": None, "ckpt": True},
    "shared2": {"nproc": 2, "backend": "cuda:gloo", "victim": 1, "ckpt": False},
}
STEPS, KILL_AT, CKPT_EVERY = 60, 20, 5


def cmd_job(args: argparse.Namespace) -> int:
    variant = VARIANTS[args.variant]
    name = {"world1": "job_world1_kill", "world1-ref": "job_world1_bitwise", "shared2": "job_shared_gpu_2ranks"}[
        args.variant
    ]
    gpu = not args.rehearse

    def body(details: dict[str, Any]) -> str:
        from recoverd.etcd_server import EmbeddedEtcd

        work = work_dir(f"job-{args.variant}")
        logs, ckpt = work / "logs", work / "ckpt"
        out_path = work / "recoverd-run.log"
        nproc, victim = variant["nproc"], variant["victim"]
        job = f"gpucheck-{args.variant}"
        backend = variant["backend"] if gpu else "gloo"
        etcd = EmbeddedEtcd(for_tests=True, data_dir=str(work / "etcd"))
        etcd.start()
        proc: subprocess.Popen[bytes] | None = None
        try:
            argv = [
                sys.executable, "-m", "recoverd.cli.main", "run", "--etcd", etcd.endpoint, "--job", job,
                "--nproc-per-node", str(nproc), "--strategies", "recover-in-place,exit", "--log-dir", str(logs),
                "--fault-window", "0.05", "--nvml", "on" if gpu else "off",
                "--", sys.executable, str(TRAIN), "--device", "cuda" if gpu else "cpu", "--steps", str(STEPS),
                *(("--ckpt-dir", str(ckpt), "--ckpt-every", str(CKPT_EVERY)) if variant["ckpt"] else ()),
                *(("--share-gpu",) if nproc > 1 and gpu else ()),
            ]  # fmt: skip
            env = {**os.environ, "GRPC_VERBOSITY": "ERROR", "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN")}
            env.pop("RECOVERD_TORCH_BACKEND", None)
            if backend:
                env["RECOVERD_TORCH_BACKEND"] = backend
            details["command"] = " ".join(argv)
            details["backend"] = backend or "the trainer's default (cpu:gloo,cuda:nccl with CUDA)"
            started = time.monotonic()
            on_gpu = GpuProcesses() if gpu else None
            with open(out_path, "wb") as out, on_gpu or contextlib.nullcontext(), Standbys() as standbys:
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
                if victim is not None:
                    rank_log = logs / f"rank{victim}.log"
                    wait_for("the warm-start server", lambda: " ready in " in read(out_path), 120)

                    def at_target() -> int | None:
                        if proc is not None and proc.poll() is not None:
                            raise Failed(f"recoverd run ended (exit {proc.returncode}) before the kill")
                        steps = done_steps(read(rank_log), victim)
                        ready = not variant["ckpt"] or (ckpt / "checkpoint.pt").exists()
                        return steps[-1][1] if steps and steps[-1][0] >= KILL_AT and ready else None

                    pid = wait_for(f"rank {victim} to pass step {KILL_AT}", at_target, 120, every=0.02)
                    killed_step = done_steps(read(rank_log), victim)[-1][0]
                    os.kill(pid, signal.SIGKILL)
                    details["killed"] = {"rank": victim, "pid": pid, "after_step": killed_step}
                while proc.poll() is None and time.monotonic() - started < args.timeout:
                    time.sleep(0.2)
                if proc.poll() is None:
                    raise Failed(f"recoverd run did not end within {args.timeout:g}s")
            details["seconds_run"] = round(time.monotonic() - started, 1)
            run_out = read(out_path)
            details["recoverd_run_exit"] = proc.returncode
            server_pids = {int(p) for p in re.findall(r"warm-start server pid (\d+) importing", run_out)}
            details["warm_start_server_pids"] = sorted(server_pids)
            details["standby_pids_seen"] = sorted(standbys.seen)
            status = ctl(etcd.endpoint, "status", job, "--json")
            decisions = ctl(etcd.endpoint, "decisions", job, "--json")
            events = ctl(etcd.endpoint, "events", job, "--json")
            details["ranks"] = [{k: r.get(k) for k in ("rank", "state", "restarts", "pid")} for r in status["ranks"]]
            details["decisions"] = [d.get("strategy") for d in decisions]
            details["events"] = sorted({e.get("reason", "") for e in events})
            texts = {r: read(logs / f"rank{r}.log") for r in range(nproc)}
            details["rank_log_tails"] = {r: "\n".join(t.splitlines()[-6:]) for r, t in texts.items()}
            problems = [line for line in run_out.splitlines() if "warm starts off" in line or "refused to fork" in line
                        or "plain starts until" in line or "CUDA was initialised" in line]  # fmt: skip
            details["warm_start_problems"] = problems

            check(proc.returncode == 0, f"recoverd run exited {proc.returncode} (tail: {run_out[-800:]})")
            check(status["state"] == "SUCCEEDED", f"job state {status['state']} ({status.get('reason')})")
            check(server_pids, "no warm-start server was started (see recoverd-run.log)")
            check(" ready in " in run_out, "the warm-start server never said it was ready")
            check(not problems, f"warm starts fell back: {problems}")
            for rank, text in texts.items():
                headers = re.findall(r"^==== .*$", text, flags=re.M)
                starts = re.findall(r"^gpu-check rank \d+ pid (\d+) start: (.*)$", text, flags=re.M)
                incarnations = 2 if rank == victim else 1
                check(len(headers) == incarnations, f"rank {rank}: {len(headers)} start headers, not {incarnations}")
                check(all("(warm start)" in h for h in headers), f"rank {rank}: not every start forked: {headers}")
                check(len(starts) == incarnations, f"rank {rank}: {len(starts)} start lines: {starts}")
                for _, state in starts:
                    # Forked from the server, which had imported torch and never initialised CUDA.
                    check(state.startswith("torch preloaded True, cuda initialised False, bad fork False"),
                          f"rank {rank} at its start: {state}")  # fmt: skip
                if gpu:
                    used = re.findall(r"^gpu-check rank \d+ on cuda:\d+: .*; now (.*)$", text, flags=re.M)
                    good = all(u.startswith("cuda initialised True, bad fork False") for u in used)
                    check(len(used) == incarnations and good, f"rank {rank} on the GPU: {used}")
                steps = {s for s, _ in done_steps(text, rank)}
                expected = set(range(STEPS))
                if rank == victim:  # it may die after a step's all-reduce, before saying it was done
                    resumed_at = max(int(s) for s in re.findall(r"resuming at step (\d+)", text) or ["0"])
                    expected -= set(range(details["killed"]["after_step"] + 1, resumed_at))
                check(expected <= steps, f"rank {rank}: steps missing {sorted(expected - steps)}")
                check(
                    re.search(rf"^rank {rank} final sha256 [0-9a-f]+", text, flags=re.M), f"rank {rank}: no final hash"
                )
            finals = {r: re.findall(r"final sha256 ([0-9a-f]+)", t) for r, t in texts.items()}
            details["final_sha256"] = {r: f[-1] for r, f in finals.items() if f}
            check(len(set(details["final_sha256"].values())) == 1, f"ranks ended with different models: {finals}")
            (work / "final_sha256").write_text(details["final_sha256"][0] + "\n")
            ranks = {r["rank"]: r for r in status["ranks"]}
            story = ""
            if victim is not None:
                check(ranks[victim]["restarts"] == 1, f"rank {victim} restarts: {ranks[victim]['restarts']}")
                check(details["decisions"] == ["recover-in-place"], f"decisions: {details['decisions']}")
                resumed = [int(s) for s in re.findall(r"resuming at step (\d+)", texts[victim])]
                details["victim_resumed_at"] = resumed
                check(len(resumed) == 2 and resumed[0] == 0, f"rank {victim} resumed at {resumed}")
                killed_after = details["killed"]["after_step"]
                check(
                    resumed[1] <= killed_after + 2,
                    f"rank {victim} resumed at {resumed[1]}, killed after {killed_after}",
                )
                if nproc == 1:  # alone: from its own checkpoint
                    check(
                        0 < resumed[1] <= killed_after + 1,
                        f"restarted at step {resumed[1]}, killed after {killed_after}",
                    )
                    check("loaded checkpoint of step" in texts[victim], "the replacement did not load the checkpoint")
                    story = f"restarted in place from its checkpoint (step {resumed[1]})"
                else:
                    survivors = [r for r in range(nproc) if r != victim]
                    for r in survivors:
                        check(ranks[r]["restarts"] == 0, f"survivor rank {r} restarted")
                        pids = {p for _, p in done_steps(texts[r], r)}
                        check(len(pids) == 1, f"survivor rank {r} ran under pids {pids}")
                        back = [int(s) for s in re.findall(r"resuming at step (\d+)", texts[r])]
                        check(len(back) == 2 and back[1] >= killed_after - 1, f"survivor rank {r} resumed at {back}")
                    story = f"rank {victim} restarted in place, healed by rank {survivors[0]} at step {resumed[1]}"
            else:
                check(all(r["restarts"] == 0 for r in ranks.values()), "a rank restarted in a fault-free run")
            pids_note = ""
            if on_gpu is not None:
                details["pids_on_gpu"] = sorted(on_gpu.seen)
                details["nvml_pid_error"] = on_gpu.error
                ours = (server_pids | standbys.seen) & on_gpu.seen
                check(not ours, f"a warm-start server or standby held a CUDA context: {ours}")
                nvml_trouble = [e for e in details["events"] if e.startswith("nvml")]
                check(not nvml_trouble, f"the agent's NVML detector recorded {nvml_trouble}")
                check(re.search(r"NVML: \d+ GPU\(s\)", run_out), "the agent's NVML detector never opened NVML")
                rank_pids = {p for r, t in texts.items() for _, p in done_steps(t, r)}
                shown = len(rank_pids & on_gpu.seen)
                pids_note = (
                    f"; NVML saw {shown} rank pid(s) on the GPU, never the server's or a standby's"
                    if shown
                    else "; NVML listed no rank pid on the GPU (pid namespace?): the server's absence proves nothing"
                )
            return (
                f"{nproc} rank(s), backend {backend or 'default'}, every start forked from the warm-start server with"
                f" CUDA uninitialised; {story or 'fault-free'}; all {STEPS} steps, final sha256"
                f" {details['final_sha256'][0][:12]}{pids_note}"
            )

        finally:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(20)
                if proc.poll() is None:
                    proc.kill()
            etcd.stop()

    status = run_check(name, mode(args.rehearse), body)
    if status == "PASS" and args.variant == "world1-ref":
        status = compare_world1(args)
    return exit_code(status)


def compare_world1(args: argparse.Namespace) -> str:
    def body(details: dict[str, Any]) -> str:
        killed = work_dir("job-world1") / "final_sha256"
        reference = work_dir("job-world1-ref") / "final_sha256"
        if not killed.exists():
            raise Skip("no final model of the killed world-1 job (step job1): nothing to compare")
        details["killed"], details["fault_free"] = killed.read_text().strip(), reference.read_text().strip()
        differs = "the recovered run's model differs from the fault-free run's (deterministic algorithms were on)"
        check(details["killed"] == details["fault_free"], differs)
        return "the job killed and restarted from its checkpoint ends bitwise as the fault-free run"

    return run_check("job_world1_bitwise_equal", mode(args.rehearse), body)


# ---------------------------------------------------------------------------- NCCL


@contextlib.contextmanager
def counted_nccl_aborts() -> Iterator[list[str] | None]:
    """Count the calls of ``ProcessGroupNCCL.abort`` (the class's method wrapped meanwhile): the
    list of calls, or None where this torch does not let it be wrapped (then only its presence is
    checked)."""
    import torch.distributed as dist

    cls = getattr(dist, "ProcessGroupNCCL", None)
    original = getattr(cls, "abort", None)
    if cls is None or original is None:
        yield None
        return
    calls: list[str] = []

    def abort(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(f"abort of {type(self).__name__} at {time.monotonic():.3f}")
        return original(self, *args, **kwargs)

    try:
        cls.abort = abort
    except (TypeError, AttributeError):
        yield None
        return
    try:
        yield calls
    finally:
        cls.abort = original


def cmd_nccl_group(args: argparse.Namespace) -> int:
    gpu = not args.rehearse
    name = "nccl_group_abort_pending" if args.pending else "nccl_group_abort_reinit"

    def body(details: dict[str, Any]) -> str:
        if args.pending and not gpu:
            raise Skip("no GPU: a collective held back behind a CUDA kernel needs a CUDA stream")
        import torch

        from recoverd.etcd_server import EmbeddedEtcd
        from taskd_client.pytorch.group import GroupFailed, ResilientGroup
        from taskd_client.pytorch.store import open_store

        os.environ["LOCAL_RANK"] = "0"
        backends = ("nccl", "cpu:gloo,cuda:nccl") if gpu else ("gloo",)
        if args.pending:
            backends = ("nccl",)
        etcd = EmbeddedEtcd(for_tests=True, data_dir=str(work_dir(name) / "etcd"))
        etcd.start()
        stores = []
        aborts = contextlib.ExitStack()
        try:
            counted = aborts.enter_context(counted_nccl_aborts()) if gpu else None
            details["abort_counted"] = counted is not None
            for spec in backends:
                seen: dict[str, Any] = {}
                details[spec] = seen
                store = open_store(etcd.endpoint, f"/gpu-check/{name}/{spec}/", timeout=timedelta(seconds=60))
                stores.append(store)
                group = ResilientGroup(store, 0, 1, backend=spec, timeout=timedelta(seconds=30))
                released: list[tuple[str, ...]] = []
                release = group._release

                def spy(generation: Any, release: Any = release, released: Any = released) -> None:
                    released.append(tuple(type(b).__name__ for b in generation.backends))
                    release(generation)

                group._release = spy  # type: ignore[method-assign]
                t0 = time.monotonic()
                first = in_thread("form", lambda group=group: group.form(deadline=time.monotonic() + 60), 90)
                seen["form_s"] = round(time.monotonic() - t0, 2)
                assert group._current is not None
                names = [type(b).__name__ for b in group._current.backends]
                seen["generation"], seen["backends"] = first, names
                if gpu:
                    check("ProcessGroupNCCL" in names, f"{spec}: no NCCL backend in generation {first}: {names}")
                    nccl = next(b for b in group._current.backends if type(b).__name__ == "ProcessGroupNCCL")
                    check(callable(getattr(nccl, "abort", None)), "this torch's ProcessGroupNCCL has no abort()")
                devices = ["cuda"] if gpu else ["cpu"]
                if gpu and "cpu" in group.backends:
                    devices.append("cpu")

                def allreduce_all(label: str, group: Any = group, devices: list[str] = devices) -> None:
                    for device in devices:
                        t = torch.arange(4, dtype=torch.float32, device=device) + 1
                        in_thread(f"allreduce on {device}", lambda t=t: group.allreduce_(t), 60)
                        check(t.cpu().tolist() == [1.0, 2.0, 3.0, 4.0], f"{label} allreduce on {device}: {t}")
                        f = torch.full((3,), 2.0, device=device)
                        fut = group.allreduce_future(f)
                        in_thread(f"DDP-hook allreduce on {device}", lambda fut=fut: fut.wait(), 60)
                        check(f.cpu().tolist() == [2.0, 2.0, 2.0], f"{label} hook allreduce on {device}: {f}")
                    if group.device.type == "cuda":  # the state transfer of an NCCL-only job: a broadcast
                        blob = torch.arange(200, dtype=torch.uint8, device=group.device)
                        got = in_thread("share", lambda: group.share(blob, 0, [0]), 60)
                        check(got is not None and torch.equal(got.cpu(), blob.cpu()), f"{label} share: {got}")

                if not args.pending:
                    allreduce_all(f"generation {first}")
                    t0 = time.monotonic()
                    in_thread("abort", lambda group=group: group.abort("gpu check: abort and re-form"), 60)
                    seen["abort_s"] = round(time.monotonic() - t0, 2)
                else:
                    # A collective held back on the GPU (queued behind a ~1 s kernel), aborted while pending.
                    torch.cuda.synchronize()
                    torch.cuda._sleep(int(1e9))  # ~0.5 s at the H200's boost clock, ~3 s idle-clocked
                    pending = torch.ones(4, device="cuda")
                    fut = group.allreduce_future(pending)
                    time.sleep(0.05)
                    seen["pending_before_abort"] = not fut.done()
                    t0 = time.monotonic()
                    in_thread("abort", lambda group=group: group.abort("gpu check: abort a pending collective"), 60)
                    seen["abort_s"] = round(time.monotonic() - t0, 2)
                    try:
                        in_thread("the aborted future", fut.wait, 30)
                        seen["aborted_future"] = "completed"
                    except GroupFailed as err:
                        seen["aborted_future"] = f"GroupFailed: {err}"
                    except Exception as err:
                        seen["aborted_future"] = f"{type(err).__name__}: {err}"[:300]
                    check(seen["aborted_future"].startswith("GroupFailed"),
                          f"the pending collective's future after abort: {seen['aborted_future']}")  # fmt: skip
                    t0 = time.monotonic()
                    in_thread("synchronize after abort", torch.cuda.synchronize, 60)
                    seen["synchronize_after_abort_s"] = round(time.monotonic() - t0, 2)
                check(released and (not gpu or "ProcessGroupNCCL" in released[-1]),
                      f"abort released {released}: the NCCL backend was not aborted")  # fmt: skip
                if counted is not None:
                    seen["nccl_abort_calls"] = list(counted)
                    check(counted, "the generation's abort never called ProcessGroupNCCL.abort()")
                    counted.clear()
                check(store.check([f"g{first}/abort"]), f"generation {first}'s abort key is not set")
                t0 = time.monotonic()
                second = in_thread("re-form", lambda group=group: group.form(deadline=time.monotonic() + 60), 90)
                seen["reform_s"] = round(time.monotonic() - t0, 2)
                seen["next_generation"] = second
                check(second == first + 1, f"re-formed generation {second} after {first}")
                allreduce_all(f"generation {second}")
                group.close()
            flavour = "with a collective pending on the GPU" if args.pending else "after all-reduces"
            what = " and ".join(backends)
            return (
                f"ResilientGroup ({what}, world size 1): formed, aborted {flavour} (the NCCL backend's abort()"
                f" called), the next generation formed and all-reduced; a peer hung in NCCL cannot be"
                f" simulated with one GPU"
                if gpu
                else f"ResilientGroup ({what}, world size 1): formed, all-reduced, aborted, re-formed, all-reduced"
            )
        finally:
            aborts.close()
            for store in stores:
                with contextlib.suppress(Exception):
                    store.close()
            etcd.stop()

    return exit_code(run_check(name, mode(args.rehearse), body))


def cmd_nccl_raw(args: argparse.Namespace) -> int:
    """ResilientGroup's way of making a generation (group.py ``_connect``/``_backend``), with torch
    alone: a ProcessGroup with the backend registered, on a fresh prefix of one store each time."""
    gpu = not args.rehearse

    def body(details: dict[str, Any]) -> str:
        import torch
        import torch.distributed as dist

        device = "cuda" if gpu else "cpu"
        kind = "NCCL" if gpu else "GLOO"
        store = dist.HashStore()
        previous = None
        for generation in range(3):
            prefixed = dist.PrefixStore(f"g{generation}/pg", store)
            pg = dist.ProcessGroup(prefixed, 0, 1)
            if gpu:
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = timedelta(seconds=30)
                backend = dist.ProcessGroupNCCL(prefixed, 0, 1, options)
            else:
                backend = dist.ProcessGroupGloo(prefixed, 0, 1, timedelta(seconds=30))
            pg._register_backend(torch.device(device), getattr(dist.ProcessGroup.BackendType, kind), backend)
            pg._set_default_backend(getattr(dist.ProcessGroup.BackendType, kind))
            t = torch.full((8,), float(generation + 1), device=device)
            work = pg.allreduce([t])
            wait_for(f"generation {generation}'s allreduce", work.is_completed, 60, every=0.001)
            work.wait()
            check(t.cpu().tolist() == [float(generation + 1)] * 8, f"generation {generation}: {t}")
            if gpu:
                check(callable(getattr(backend, "abort", None)), "ProcessGroupNCCL has no abort()")
                t0 = time.monotonic()
                in_thread("abort", backend.abort, 60)
                details[f"g{generation}_abort_s"] = round(time.monotonic() - t0, 3)
            previous = pg  # parked, as ResilientGroup does: never destroyed under a blocked thread
        del previous
        if gpu:
            in_thread("synchronize", torch.cuda.synchronize, 30)
            return "3 generations of ProcessGroupNCCL (world size 1): all-reduce, abort(), the next on a fresh prefix"
        return "3 generations of ProcessGroupGloo (world size 1) on fresh prefixes of one store"

    return exit_code(run_check("nccl_raw_abort_reinit", mode(args.rehearse), body))


PROBE_RANK = r"""
import os, sys, torch, torch.distributed as dist
from datetime import timedelta
rank = int(sys.argv[1])
torch.cuda.set_device(0)
store = dist.FileStore(sys.argv[2], 2)
options = dist.ProcessGroupNCCL.Options()
options._timeout = timedelta(seconds=20)
pg = dist.ProcessGroupNCCL(store, rank, 2, options)
t = torch.ones(4, device="cuda")
try:
    pg.allreduce([t]).wait()
    torch.cuda.synchronize()
    print(f"PROBE rank {rank}: allreduce ok {t.tolist()}", flush=True)
except Exception as err:
    print(f"PROBE rank {rank}: refused: {type(err).__name__}: {str(err)[:400]}", flush=True)
os._exit(0)
"""


def cmd_nccl_probe(args: argparse.Namespace) -> int:
    def body(details: dict[str, Any]) -> str:
        if args.rehearse:
            raise Skip("no GPU: NCCL needs one")
        work = work_dir("nccl-probe")
        store = work / "store"
        with contextlib.suppress(FileNotFoundError):
            store.unlink()
        env = {**os.environ, "NCCL_DEBUG": "WARN"}
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", PROBE_RANK, str(r), str(store)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
            for r in range(2)
        ]
        outputs = []
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                proc.kill()
                out = (proc.communicate()[0] or "") + "\n(killed after 90 s)"
            outputs.append(out)
        details["outputs"] = [o[-1500:] for o in outputs]
        verdicts = [re.findall(r"^PROBE rank \d: (.*)$", o, flags=re.M) for o in outputs]
        details["verdicts"] = verdicts
        check(all(verdicts), "a probe rank gave no answer (hung or crashed): see details")
        if all(v[0].startswith("allreduce ok") for v in verdicts):
            return "NCCL ran a 2-rank all-reduce with both ranks on GPU 0 (this NCCL allows it)"
        return f"NCCL refuses two ranks of one communicator on GPU 0, as expected: {verdicts[0][0][:200]}"

    return exit_code(run_check("nccl_two_ranks_one_gpu", mode(args.rehearse), body))


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rehearse", action="store_true", help="the CPU rehearsal: no GPU, NVML's stand-in")
    sub = parser.add_subparsers(dest="cmd", required=True)
    env = sub.add_parser("env")
    env.add_argument("--write", default=None, help="also write the JSON here")
    sub.add_parser("deps")
    sub.add_parser("nvml-raw")
    detector = sub.add_parser("nvml-detector")
    detector.add_argument("--seconds", type=float, default=3.0)
    job = sub.add_parser("job")
    job.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    job.add_argument("--timeout", type=float, default=150.0, help="for recoverd run to end")
    group = sub.add_parser("nccl-group")
    group.add_argument("--pending", action="store_true", help="abort while a collective is pending on the GPU")
    sub.add_parser("nccl-raw")
    sub.add_parser("nccl-probe")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "env": cmd_env,
        "deps": cmd_deps,
        "nvml-raw": cmd_nvml_raw,
        "nvml-detector": cmd_nvml_detector,
        "job": cmd_job,
        "nccl-group": cmd_nccl_group,
        "nccl-raw": cmd_nccl_raw,
        "nccl-probe": cmd_nccl_probe,
    }
    code = commands[args.cmd](args)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
