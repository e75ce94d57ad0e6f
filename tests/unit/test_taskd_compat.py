"""MindCluster TaskD's import paths, served by the recoverd distribution."""

from __future__ import annotations

import importlib

import pytest

from recoverd.errors import ConfigError
from recoverd.mindcluster import recover_pb2


def test_the_upstream_import_paths_resolve_to_one_compiled_proto() -> None:
    from taskd.python.toolkit.recover_module import pb, recover_manager
    from taskd.python.toolkit.recover_module.pb import recover_pb2 as upstream_pb2
    from taskd.python.toolkit.recover_module.pb import recover_pb2_grpc

    assert recover_manager.pb is pb
    for name in ("ClientInfo", "Status", "FaultRank", "ProcessManageSignal", "StopCompleteRequest",
                 "RecoverStrategyRequest", "RecoverStatusRequest", "ProcessFaultRequest"):  # fmt: skip
        assert getattr(pb, name) is getattr(recover_pb2, name)
    assert upstream_pb2 is recover_pb2  # one compiled copy: no "duplicate symbol"
    assert recover_pb2_grpc.RecoverStub.__module__ == "recoverd.mindcluster.recover_pb2_grpc"
    for helper in ("DLRecoverManager", "RecoverManager", "init_grpc_client", "get_recover_manager_instance",
                   "report_process_fault", "report_stop_complete", "report_recover_strategy",
                   "report_recover_status"):  # fmt: skip
        assert callable(getattr(recover_manager, helper))


def test_taskd_api_is_not_shipped_so_msrun_falls_back_to_the_plugin() -> None:
    with pytest.raises(ImportError):
        importlib.import_module("taskd.api.taskd_agent_api")
    from taskd.python.framework.agent.ms_mgr.msrun_plugin import MSRunPlugin

    plugin = MSRunPlugin()
    for name in ("KILL_WORKER", "START_ALL_WORKER", "START_WORKER_LIST", "MONITOR"):
        plugin.register_callbacks(name, lambda *a: 0)
    with pytest.raises(ValueError, match="unknown msrun callback"):
        plugin.register_callbacks("RESTART", lambda: 0)
    with pytest.raises(TypeError):
        plugin.register_callbacks("MONITOR", 42)  # type: ignore[arg-type]


def test_helpers_find_recoverd_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from taskd.python.toolkit.recover_module import recover_manager

    for name in ("MINDX_TASK_ID", "RECOVERD_JOB", "RECOVERD_ETCD", "MINDX_SERVER_IP"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="RECOVERD_JOB nor MINDX_TASK_ID"):
        recover_manager.init_grpc_recover_manager()
    monkeypatch.setenv("MINDX_TASK_ID", "job-x")
    with pytest.raises(ConfigError, match="RECOVERD_ETCD"):
        recover_manager.init_grpc_recover_manager()
    monkeypatch.setenv("MINDX_SERVER_IP", "10.0.0.1")
    with pytest.raises(ConfigError, match="gateway"):
        recover_manager.init_grpc_recover_manager()
    monkeypatch.setenv("RECOVERD_ETCD", "127.0.0.1:1")
    manager = recover_manager.init_grpc_recover_manager()
    try:
        assert (manager.info.jobId, manager.info.role) == ("job-x", "master agent")
        assert manager.server_addr == "etcd://127.0.0.1:1"
    finally:
        manager.close()
