"""--metrics-port on every service: /metrics after a real recovery, /readyz following etcd, and the
gateway's gRPC health service (docs/operations.md).

Real processes against a real etcd; the scrape parses the Prometheus text format with
prometheus-client's own parser.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from recoverd.etcd_server import EmbeddedEtcd
from recoverd.records import pb

from .cluster import Cluster

pytestmark = pytest.mark.etcd

PHASES = ("COLLECTING", "STOPPING", "GLOBAL_FAULT", "DECIDING", "RECOVERING")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, str]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as err:
        return 0, str(err)


def _samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    code, text = _get(port, "/metrics")
    assert code == 200, text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(samples: dict, name: str, **labels: str) -> float | None:  # type: ignore[type-arg]
    return samples.get((name, tuple(sorted(labels.items()))))


def test_every_service_exports_the_recovery_it_took_part_in(cluster: Cluster) -> None:
    ports = {name: _free_port() for name in ("coordinator", "strategy", "agent", "gateway")}
    cluster.coordinator(extra=["--metrics-port", str(ports["coordinator"])])
    cluster.spawn(
        "strategy",
        ["strategy", "--etcd", cluster.endpoint, "--prefix", cluster.prefix, "--metrics-port", str(ports["strategy"])],
    )
    job = "job-metrics"
    cluster.agent(job, nproc=2, strategies="recover-in-place,exit", extra=["--metrics-port", str(ports["agent"])])
    grpc_port = _free_port()
    cluster.spawn("gateway", [
        "gateway", "--etcd", cluster.endpoint, "--prefix", cluster.prefix, "--listen", f"127.0.0.1:{grpc_port}",
        "--metrics-port", str(ports["gateway"]),
    ])  # fmt: skip
    before = cluster.wait_running(job, 2)
    os.kill(before[1].pid, signal.SIGKILL)
    cluster.wait_for(
        "the recovery to finish",
        lambda: (rec := cluster.view(job).recovery) is not None and rec.phase == pb.PHASE_DONE and rec,
    )

    coordinator = cluster.wait_for(
        "the coordinator's recovery metrics",
        lambda: (
            (s := _samples(ports["coordinator"]))
            and _value(s, "recoverd_recoveries_total", strategy="recover-in-place", outcome="succeeded")
            and s
        ),
    )
    for phase in PHASES:  # one recovery: each phase left once
        assert _value(coordinator, "recoverd_recovery_phase_seconds_count", phase=phase) == 1, phase
    assert _value(coordinator, "recoverd_faults_total", type="1", source="agent") == 1
    assert _value(coordinator, "recoverd_fault_detection_seconds_count") == 1
    assert _value(coordinator, "recoverd_recovery_seconds_count", strategy="recover-in-place") == 1
    assert _value(coordinator, "recoverd_coordinator_leader") == 1
    assert _value(coordinator, "recoverd_coordinator_leader_changes_total", change="gained") == 1
    assert (_value(coordinator, "recoverd_etcd_request_seconds_count", op="txn") or 0) > 0

    agent = _samples(ports["agent"])
    assert _value(agent, "recoverd_agent_ranks", job=job, node="node0", state="running") == 2
    assert _value(agent, "recoverd_agent_warm_spares", job=job, node="node0") == 0
    assert (_value(agent, "recoverd_etcd_request_seconds_count", op="txn") or 0) > 0
    assert (_value(_samples(ports["strategy"]), "recoverd_etcd_request_seconds_count", op="status") or 0) > 0

    for name, port in ports.items():
        # A service is alive once it serves (the gateway is started last and may still be importing
        # gRPC on a loaded machine: make test once asked before it listened).
        assert cluster.wait_for(f"{name} alive", lambda p=port: _get(p, "/healthz")[0] == 200), name
        assert cluster.wait_for(f"{name} ready", lambda p=port: _get(p, "/readyz")[0] == 200), name
    assert _get(ports["agent"], "/nope")[0] == 404

    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "Recover"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service


def test_readyz_follows_etcd_down_and_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with EmbeddedEtcd(for_tests=True) as etcd:
        cluster = Cluster(etcd.endpoint, "/m/v1", tmp_path)
        try:
            port = _free_port()
            cluster.spawn("strategy", ["strategy", "--etcd", etcd.endpoint, "--prefix", "/m/v1",
                                       "--metrics-port", str(port)])  # fmt: skip
            cluster.wait_for("ready", lambda: _get(port, "/readyz")[0] == 200)
            etcd.kill9()
            _code, reason = cluster.wait_for("unready", lambda: (r := _get(port, "/readyz"))[0] == 503 and r)
            assert "etcd unreachable" in reason
            assert _get(port, "/healthz")[0] == 200  # alive all along: nothing to restart
            etcd.restart()
            cluster.wait_for("ready again", lambda: _get(port, "/readyz")[0] == 200)
        finally:
            cluster.close()


def test_a_busy_metrics_port_is_a_clear_error(cluster: Cluster) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = cluster.spawn("strategy", ["strategy", "--etcd", cluster.endpoint, "--metrics-port", str(port)])
        assert proc.wait(timeout=30) == 2
    # --metrics-host defaults to loopback (127.0.0.1), which the port taken on every interface covers.
    assert f"cannot serve metrics on 127.0.0.1:{port}" in open(proc.log_path).read()  # type: ignore[attr-defined]


def test_an_agent_logs_json_lines_with_its_job_node_and_rank(cluster: Cluster) -> None:
    cluster.coordinator()
    cluster.strategy()
    proc = cluster.agent(
        "job-json", nproc=2, strategies="exit", worker=("--steps", "2", "--step-time", "0.05", "--fail-rank", "1"),
        extra=["--log-format", "json", "--max-job-restarts", "1"],
    )  # fmt: skip
    proc.wait(timeout=60)
    lines = [json.loads(x) for x in open(proc.log_path).read().splitlines() if x.startswith("{")]  # type: ignore[attr-defined]
    assert lines and all({"time", "level", "logger", "message"} <= set(x) for x in lines)
    assert all(
        (x.get("job"), x.get("node")) == ("job-json", "node0")
        for x in lines
        if x["logger"].startswith("recoverd.agent")
    )
    failed = [x for x in lines if "failed" in x["message"] and x.get("rank") == 1]
    assert failed, lines[-5:]


def test_recoverd_run_serves_every_service_on_one_port(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cluster = Cluster("unused:1", "/run/v1", tmp_path)
    try:
        port = _free_port()
        rank = [sys.executable, "-c", "import time; time.sleep(30)"]
        cluster.spawn("run", ["run", "--prefix", "/run/v1", "--job", "one-port", "--nproc-per-node", "1",
                              "--metrics-port", str(port), "--", *rank])  # fmt: skip
        samples = cluster.wait_for(
            "the agent's and the coordinator's metrics on one port",
            lambda: (
                (s := _samples_or_none(port)) is not None
                and _value(s, "recoverd_agent_ranks", job="one-port", node=_node_name(s), state="running") == 1
                and _value(s, "recoverd_coordinator_leader") == 1
                and s
            ),
            timeout=30,
        )
        assert samples
        assert cluster.wait_for("ready", lambda: _get(port, "/readyz")[0] == 200)
    finally:
        cluster.close()


def _samples_or_none(port: int) -> dict | None:  # type: ignore[type-arg]
    code, _ = _get(port, "/metrics")
    return _samples(port) if code == 200 else None


def _node_name(samples: dict) -> str:  # type: ignore[type-arg]
    return next((dict(labels)["node"] for name, labels in samples if name == "recoverd_agent_ranks"), "")
