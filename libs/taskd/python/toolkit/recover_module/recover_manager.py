"""TaskD's ``recover_manager`` module: ``DLRecoverManager`` plus the module-level helpers callers use.

``DLRecoverManager`` and ``RecoverManager`` are recoverd's (``taskd_client.manager``; docs/client.md).
The helpers take no address, so they find recoverd from the environment:

* job id: ``RECOVERD_JOB``, else ``MINDX_TASK_ID`` (as MindCluster sets it) -- the same order as
  ``MSRunPlugin`` and ``recoverd adopt``, so all of a job's parts agree; neither is a ValueError,
  as upstream;
* server: ``RECOVERD_ETCD`` (``etcd://`` endpoints), else ``MINDX_SERVER_IP`` on port 8899, the
  ``Recover`` gRPC gateway (``recoverd gateway``), which serves upstream's gRPC clients; this
  module's Python client talks to etcd, so that address is a ConfigError saying to set RECOVERD_ETCD.

Differences from upstream (docs/compat.md): ``init_grpc_process`` runs without ``mindio_ttp`` too
(with whatever handlers were set; upstream returns at once), and with it registers the report
functions as MindIO's callbacks and defaults the handlers to MindIO's controller, as upstream does.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from recoverd.errors import ConfigError
from taskd.python.toolkit.recover_module import pb
from taskd_client.manager import DLRecoverManager, RecoverManager

__all__ = [
    "DLRecoverManager",
    "RecoverManager",
    "get_recover_manager_instance",
    "init_grpc_client",
    "init_grpc_process",
    "init_grpc_recover_manager",
    "pb",
    "report_process_fault",
    "report_recover_status",
    "report_recover_strategy",
    "report_stop_complete",
]

log = logging.getLogger(__name__)

GATEWAY_PORT = 8899


class _Instance:
    """The process's one manager (upstream's helpers are module-level by contract), built lazily."""

    lock = threading.Lock()
    manager: DLRecoverManager | None = None


def _server_addr() -> str:
    etcd = os.environ.get("RECOVERD_ETCD")
    if etcd:
        return "etcd://" + etcd.removeprefix("etcd://")
    server_ip = os.environ.get("MINDX_SERVER_IP")
    if server_ip:
        return f"{server_ip}:{GATEWAY_PORT}"
    raise ConfigError("no recoverd address: set RECOVERD_ETCD (or MindCluster's MINDX_SERVER_IP)")


def init_grpc_recover_manager() -> DLRecoverManager:
    """A manager for this job from the environment (role "master agent", as upstream)."""
    job = os.environ.get("RECOVERD_JOB") or os.environ.get("MINDX_TASK_ID")
    if not job:
        raise ValueError("neither RECOVERD_JOB nor MINDX_TASK_ID is set")
    return DLRecoverManager(pb.ClientInfo(jobId=job, role="master agent"), _server_addr())


def get_recover_manager_instance() -> DLRecoverManager:
    """The process's manager, built on first use."""
    with _Instance.lock:
        if _Instance.manager is None:
            _Instance.manager = init_grpc_recover_manager()
        return _Instance.manager


def _register_mindio_callbacks() -> None:
    try:
        from mindio_ttp import framework_ttp as ttp  # type: ignore[import-not-found]
    except ImportError:
        return
    ttp.tft_register_mindx_callback("report_fault_ranks", report_process_fault)
    ttp.tft_register_mindx_callback("report_stop_complete", report_stop_complete)
    ttp.tft_register_mindx_callback("report_strategies", report_recover_strategy)
    ttp.tft_register_mindx_callback("report_result", report_recover_status)


def init_grpc_process(frame: str = "pytorch") -> None:
    """Init, register and subscribe (blocks until killMaster or close)."""
    manager = get_recover_manager_instance()
    if not manager.init_clusterd():
        log.warning("process-level recovery is off for job %s (403): not subscribing", manager.info.jobId)
        return
    os.environ["TORCH_AGENT_START"] = "0"
    _register_mindio_callbacks()
    status = manager.register(manager.info)
    if status.code != 0:
        log.error("register failed with %d: %s", status.code, status.info)
        return
    manager.start_subscribe(frame)


def init_grpc_client(frame: str = "pytorch") -> threading.Thread:
    """Run :func:`init_grpc_process` on a daemon thread, as upstream; returns the thread."""
    thread = threading.Thread(target=init_grpc_process, args=(frame,), name="recoverd-grpc-client", daemon=True)
    thread.start()
    return thread


def report_process_fault(fault_ranks: dict[int, int], fault_codes: dict[Any, Any] | None = None) -> int:
    return get_recover_manager_instance().report_process_fault(fault_ranks, fault_codes)


def report_stop_complete(code: int, msg: str, fault_ranks: dict[int, int]) -> int:
    return get_recover_manager_instance().report_stop_complete(code, msg, fault_ranks)


def report_recover_strategy(fault_ranks: dict[int, int], strategy_list: list[str]) -> int:
    return get_recover_manager_instance().report_recover_strategy(fault_ranks, strategy_list)


def report_recover_status(code: int, msg: str, fault_ranks: dict[int, int], strategy: str) -> int:
    return get_recover_manager_instance().report_recover_status(code, msg, fault_ranks, strategy)
