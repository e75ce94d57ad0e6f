"""The Recover gRPC gateway against a real etcd and real services, driven by an upstream client.

The client (tests/gateway_client/upstream_client.py) runs in its own process with stubs compiled
from the proto by grpcio-tools as plain ``recover_pb2`` (TaskD's layout), TaskD's channel options
and the legacy DLRecoverManager's behaviour; it prints what it sees as JSON lines.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from recoverd.records import encode, pb

from .cluster import ROOT, Cluster

pytestmark = pytest.mark.etcd

T = TypeVar("T")

CLIENT = str(ROOT / "tests" / "gateway_client" / "upstream_client.py")
PROTO = ROOT / "proto" / "recoverd" / "mindcluster" / "recover.proto"
KEEPALIVE_S = 0.5


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> str:
    """recover_pb2 / recover_pb2_grpc compiled from the proto, as TaskD's stock stubs are."""
    folder = tmp_path_factory.mktemp("upstream_stubs")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO.parent}", f"--python_out={folder}",
         f"--grpc_python_out={folder}", str(PROTO)],
        check=True,
    )  # fmt: skip
    return str(folder)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_gateway(cluster: Cluster, *extra: str, name: str = "gateway") -> int:
    port = _free_port()
    cluster.spawn(name, [
        "gateway", "--etcd", cluster.endpoint, "--prefix", cluster.prefix, "--listen", f"127.0.0.1:{port}",
        "--keepalive-interval", str(KEEPALIVE_S), "--client-lease-ttl", "1", *extra,
    ])  # fmt: skip

    def listening() -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
        if cluster.procs[name].poll() is not None:
            raise AssertionError(f"the gateway exited with {cluster.procs[name].returncode}\n{cluster.logs()}")
        return False

    cluster.wait_for("the gateway to listen", listening, timeout=10)
    return port


class UpstreamClient:
    """The subprocess client: its JSON lines are collected as they arrive."""

    def __init__(self, stubs: str, port: int, job: str, args: tuple[str, ...], log_path: Path) -> None:
        self.lines: list[dict[str, Any]] = []
        self._stderr = open(log_path, "wb")  # closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, CLIENT, "--stubs", stubs, "--addr", f"127.0.0.1:{port}", "--job", job, *args],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
        )
        self.log_path = log_path
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.lines.append(json.loads(raw))

    def events(self, event: str, **match: Any) -> list[dict[str, Any]]:
        return [x for x in list(self.lines) if x["event"] == event and all(x.get(k) == v for k, v in match.items())]

    def after_last(self, marker: str, event: str) -> list[dict[str, Any]]:
        """The ``event`` lines printed after the last ``marker`` line."""
        lines = list(self.lines)
        starts = [i for i, x in enumerate(lines) if x["event"] == marker]
        return [x for x in lines[starts[-1] + 1 :] if x["event"] == event] if starts else []

    def signals(self) -> list[dict[str, Any]]:
        return [s for s in self.events("signal") if s["signalType"] != "keep-alive"]

    def wait_for(self, what: str, predicate: Callable[[], T], timeout: float = 10.0) -> T:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = predicate()
            if result:
                return result
            time.sleep(0.05)
        raise AssertionError(f"client: timed out waiting for {what}; saw {self.lines[-20:]}\n{self.stderr()}")

    def stderr(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=5)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reader.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()


@pytest.fixture
def upstream(stubs: str, tmp_path: Path) -> Iterator[Callable[..., UpstreamClient]]:
    made: list[UpstreamClient] = []

    def start(port: int, job: str, *args: str) -> UpstreamClient:
        client = UpstreamClient(stubs, port, job, args, tmp_path / f"upstream-client-{len(made)}.log")
        made.append(client)
        return client

    yield start
    for client in made:
        client.close()


def _done(cluster: Cluster, job: str, recovery_id: int) -> Any:
    view = cluster.view(job)
    rec = view.recovery
    return rec is not None and rec.recovery_id == recovery_id and rec.phase == pb.PHASE_DONE and view


def _put_job(cluster: Cluster, job: str, strategies: list[str]) -> None:
    spec = pb.JobSpec(name=job, uid=f"{job}-uid", world_size=2, nnodes=1, nproc_per_node=2,
                      policy=pb.Policy(strategies=strategies))  # fmt: skip
    cluster.put(cluster.keys.job_spec(job), encode(spec))


def test_an_upstream_client_drives_a_whole_recovery(cluster: Cluster, upstream) -> None:  # type: ignore[no-untyped-def]
    job = "job-gw"
    cluster.coordinator()
    cluster.strategy()
    cluster.agent(job, nproc=2, strategies="recover-in-place,exit")
    port = start_gateway(cluster)
    before = cluster.wait_running(job, 2)
    client = upstream(port, job, "--early-report", "--health-check")
    client.wait_for("two keep-alives", lambda: len(client.events("signal", signalType="keep-alive")) >= 2)

    # Before any signal a report has nothing to answer (401); upstream re-Registers (0, already
    # registered) and resends once, which the gateway answers the same way without side effects.
    early = client.events("report", method="ReportStopComplete")
    assert [(r["attempt"], r["code"]) for r in early] == [(1, 401), (2, 401)]
    assert [(r["code"], r["info"]) for r in client.events("register")] == [(0, "register success")] * 2
    view = cluster.view(job)
    assert [c.role for c in view.clients.values()] == ["master agent"]
    participant = f"client.{next(iter(view.clients))}"

    os.kill(before[1].pid, signal.SIGKILL)
    view = cluster.wait_for("the recovery to finish", lambda: _done(cluster, job, 1))
    rec = view.recovery
    assert list(rec.participants) == [participant]  # the agent stayed silent: the upstream client answered
    assert rec.strategy == "recover-in-place"
    assert [pb.Phase.Name(e.phase) for e in rec.phase_log] == [
        "PHASE_COLLECTING", "PHASE_STOPPING", "PHASE_GLOBAL_FAULT", "PHASE_DECIDING", "PHASE_RECOVERING", "PHASE_DONE",
    ]  # fmt: skip
    after = cluster.ranks(job)
    assert after[1].restart_count == 1 and after[0].pid == before[0].pid

    # Every signal in MindCluster's wire form, once each, in order, one uuid for the episode.
    seen = client.signals()
    assert [(s["signalType"], s["actions"]) for s in seen] == [
        ("stopTrain", ["stop_train"]),
        ("globalFault", ["on_global_rank"]),
        ("changeStrategy", ["change_strategy", "fault_nodes_restart"]),
    ]
    assert {s["uuid"] for s in seen} == {rec.uuid} and all(s["jobId"] == job for s in seen)
    assert all(s["faultRanks"] == [["1", "1"]] for s in seen)
    assert (seen[2]["changeStrategy"], seen[2]["extraParams"]) == ("recover", "recover-in-place")
    answers = [(r["method"], r["code"]) for r in client.events("report", attempt=1)[1:]]
    assert answers == [("ReportStopComplete", 0), ("ReportRecoverStrategy", 0), ("ReportRecoverStatus", 0)]

    # Keep-alives every 0.5 s, carrying the uuid of the last signal.
    client.wait_for("keep-alives after the recovery",
                    lambda: len(client.events("signal", uuid=rec.uuid, signalType="keep-alive")) >= 3)  # fmt: skip
    times = [s["t"] for s in client.events("signal", signalType="keep-alive")]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(gaps) >= 4 and 0.4 <= statistics.median(gaps) <= 0.65 and max(gaps) < 1.5, gaps
    assert not client.events("health_error") and not client.events("stream_error")

    # SIGTERM: the gateway exits 0 and has revoked the session's lease (no TTL wait).
    assert cluster.stop("gateway") == 0
    assert cluster.view(job).clients == {}
    client.wait_for("the stream to break", lambda: client.events("stream_error"))


def test_a_reconnecting_client_gets_the_pending_signal_again(cluster: Cluster, upstream) -> None:  # type: ignore[no-untyped-def]
    job = "job-gw-reconnect"
    cluster.coordinator()
    cluster.strategy()
    cluster.agent(job, nproc=2, strategies="recover-in-place,exit")
    port = start_gateway(cluster)
    before = cluster.wait_running(job, 2)
    # Drops stream and channel on its first signal, then Init, Register, Subscribe again.
    client = upstream(port, job, "--reconnect-on-first-signal")
    client.wait_for("a keep-alive", lambda: client.events("signal", signalType="keep-alive"))

    os.kill(before[0].pid, signal.SIGKILL)
    view = cluster.wait_for("the recovery to finish", lambda: _done(cluster, job, 1))
    rec = view.recovery
    assert client.events("reconnected") and len(client.events("register")) == 2
    seen = [(s["signalType"], s["uuid"]) for s in client.signals()]
    # Not reset (upstream resets the controller on a new subscription): the same episode's
    # stopTrain is sent again on the new stream, then the recovery goes on.
    assert seen == [("stopTrain", rec.uuid), ("stopTrain", rec.uuid), ("globalFault", rec.uuid),
                    ("changeStrategy", rec.uuid)]  # fmt: skip
    assert len(rec.participants) == 1 and rec.participants[0].startswith("client.")
    assert rec.strategy == "recover-in-place" and rec.recovery_id == 1

    # Reconnecting after the recovery replays nothing: only keep-alives, with the episode's uuid.
    client.proc.send_signal(signal.SIGUSR1)
    client.wait_for("a third Register", lambda: len(client.events("register")) == 3)
    client.wait_for("keep-alives on the third stream", lambda: len(client.after_last("reconnected", "signal")) >= 2)
    assert len(client.signals()) == 4
    assert client.events("signal")[-1]["uuid"] == rec.uuid
    reasons = [e.reason for e in cluster.events(job)]
    assert reasons.count("client_registered") == 1  # the same session throughout


def test_rpc_error_paths_and_keepalive_pings(cluster: Cluster, upstream) -> None:  # type: ignore[no-untyped-def]
    job, exit_only = "job-gw-probe", "job-gw-exit-only"
    _put_job(cluster, job, ["recover-in-place", "exit"])
    _put_job(cluster, exit_only, ["exit"])
    port = start_gateway(cluster)
    client = upstream(port, job, "--probe", "--exit-only-job", exit_only)
    client.wait_for("the probe", lambda: client.events("probe_done"), timeout=15)
    assert client.proc.wait(timeout=5) == 0
    probe = {p["name"]: p for p in client.events("probe")}

    def code(name: str) -> int:
        return int(probe[name]["code"])

    # Subscribing before Register fails with upstream's error text (a plain Go error: UNKNOWN).
    assert (probe["subscribe_unregistered"]["grpc_code"], probe["subscribe_unregistered"]["details"]) == (
        "UNKNOWN",
        f"jobId={job} not registed",
    )
    assert code("health") == 0
    assert code("register_before_init") == 408
    assert code("init_unknown_job") == 402
    assert code("init_bad_job_id") == 409
    assert code("init_exit_only") == 403 and code("register_exit_only") == 408
    assert code("report_unregistered") == 400 and code("fault_unregistered") == 400
    assert code("init") == 0
    assert (code("register"), probe["register"]["info"]) == (0, "register success")
    assert (code("register_again"), probe["register_again"]["info"]) == (0, "register success")
    assert code("report_bad_rank") == 409 and code("fault_bad_rank") == 409
    assert code("strategy_other_job") == 400
    assert code("report_before_signal") == 401
    for name in ("stress_test", "switch_nic_track", "reply_switch_nic", "reply_stress_result"):
        assert code(name) != 0 and "not supported by recoverd" in probe[name]["info"], probe[name]
    for name in ("subscribe_notify_switch", "subscribe_stress"):
        assert probe[name]["grpc_code"] == "UNIMPLEMENTED" and "not supported by recoverd" in probe[name]["details"]
    # Pings every 0.2 s (clamped to 1 s by the client) with no call open, for 4 s: gRPC's default
    # server policy sends GOAWAY too_many_pings after ~3 s, which drops the channel out of READY.
    # A newer subscription of the job takes over; the older stream ends normally.
    assert probe["superseded"]["grpc_code"] == "OK" and probe["superseded"]["first"] == "keep-alive"
    assert probe["ping_flood"]["states"] == ["READY"] and code("ping_flood") == 0
    assert len(cluster.view(job).clients) == 1  # the probe registered; nothing else changed


def test_a_client_gone_longer_than_the_grace_stops_being_a_participant(cluster: Cluster, upstream) -> None:  # type: ignore[no-untyped-def]
    job = "job-gw-grace"
    cluster.coordinator()
    cluster.strategy()
    cluster.agent(job, nproc=2, strategies="recover-in-place,exit")
    port = start_gateway(cluster, "--client-grace", "1")
    before = cluster.wait_running(job, 2)
    client = upstream(port, job)
    client.wait_for("a keep-alive", lambda: client.events("signal", signalType="keep-alive"))
    assert len(cluster.view(job).clients) == 1

    client.kill()  # the client process dies: its stream breaks, nothing re-registers
    killed = time.monotonic()
    cluster.wait_for("the gateway to deregister the client", lambda: not cluster.view(job).clients, timeout=5)
    assert 0.9 <= time.monotonic() - killed < 3.0
    os.kill(before[1].pid, signal.SIGKILL)
    view = cluster.wait_for("the agents to finish the recovery", lambda: _done(cluster, job, 1))
    assert sorted(view.recovery.participants) == ["agent.node0", "agents"]

    # A client that comes back reports a fault before registering (400); upstream re-Registers and
    # resends, and the resent report starts a recovery that the new client answers.
    back = upstream(port, job, "--fault-before-register", "0:1")
    view = cluster.wait_for("the second recovery to finish", lambda: _done(cluster, job, 2))
    faults = back.events("report", method="ReportProcessFault")
    assert [(r["attempt"], r["code"]) for r in faults] == [(1, 400), (2, 0)]
    assert len(view.recovery.participants) == 1 and view.recovery.participants[0].startswith("client.")
    assert [s["signalType"] for s in back.signals()] == ["stopTrain", "globalFault", "changeStrategy"]
    assert [(f.rank, f.source) for f in view.recovery.faults] == [(0, pb.SOURCE_CLIENT)]


def test_the_gateway_with_mutual_tls_completes_a_recovery(cluster: Cluster, upstream, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    trustme = pytest.importorskip("trustme", reason="trustme is a dev dependency")
    ca = trustme.CA()
    files = {name: str(tmp_path / f"{name}.pem") for name in ("ca", "server", "server-key", "client", "client-key")}
    ca.cert_pem.write_to_path(files["ca"])
    server = ca.issue_cert("127.0.0.1")
    server.cert_chain_pems[0].write_to_path(files["server"])
    server.private_key_pem.write_to_path(files["server-key"])
    client_cert = ca.issue_cert("taskd.example", common_name="taskd")
    client_cert.cert_chain_pems[0].write_to_path(files["client"])
    client_cert.private_key_pem.write_to_path(files["client-key"])
    # Two more certificates of the same CA: one the auth file gives another job, one it does not list.
    for name in ("intruder", "stranger"):
        leaf = ca.issue_cert(f"{name}.example", common_name=name)
        leaf.cert_chain_pems[0].write_to_path(str(tmp_path / f"{name}.pem"))
        leaf.private_key_pem.write_to_path(str(tmp_path / f"{name}-key.pem"))
    job = "job-gw-tls"
    auth = _auth_file(
        tmp_path, [{"certificate": "taskd", "jobs": [job]}, {"certificate": "intruder", "jobs": ["job-x"]}]
    )
    cluster.coordinator()
    cluster.strategy()
    cluster.agent(job, nproc=2, strategies="recover-in-place,exit")
    tls = ("--tls-cert", files["server"], "--tls-key", files["server-key"], "--tls-client-ca", files["ca"])
    port = start_gateway(cluster, *tls, "--auth-file", auth)
    before = cluster.wait_running(job, 2)

    # Without a client certificate (or over plaintext) the handshake is refused; with one it succeeds.
    def ready(credentials: grpc.ChannelCredentials | None) -> bool:
        addr = f"127.0.0.1:{port}"
        chan = grpc.secure_channel(addr, credentials) if credentials else grpc.insecure_channel(addr)
        try:
            grpc.channel_ready_future(chan).result(timeout=3)
            return True
        except grpc.FutureTimeoutError:
            return False
        finally:
            chan.close()

    ca_pem = Path(files["ca"]).read_bytes()
    assert not ready(grpc.ssl_channel_credentials(ca_pem))
    assert not ready(None)
    mine = (Path(files["client-key"]).read_bytes(), Path(files["client"]).read_bytes())
    assert ready(grpc.ssl_channel_credentials(ca_pem, *mine))
    assert cluster.view(job).clients == {}

    # Any certificate of the CA gets through the handshake; only the one the auth file ties to the
    # job may act on it.
    for name, code in (("intruder", "PERMISSION_DENIED"), ("stranger", "UNAUTHENTICATED")):
        cert = ("--tls-ca", files["ca"], "--tls-cert", str(tmp_path / f"{name}.pem"),
                "--tls-key", str(tmp_path / f"{name}-key.pem"))  # fmt: skip
        answers = _calls(upstream(port, job, "--calls", *cert))
        assert set(answers.values()) == {code}, (name, answers)
    assert cluster.view(job).clients == {} and cluster.view(job).faults == {}

    client = upstream(
        port, job, "--tls-ca", files["ca"], "--tls-cert", files["client"], "--tls-key", files["client-key"]
    )
    client.wait_for("a keep-alive over TLS", lambda: client.events("signal", signalType="keep-alive"))
    assert [r["code"] for r in client.events("register")] == [0]
    os.kill(before[1].pid, signal.SIGKILL)
    view = cluster.wait_for("the recovery to finish", lambda: _done(cluster, job, 1))
    assert view.recovery.strategy == "recover-in-place"
    assert [s["signalType"] for s in client.signals()] == ["stopTrain", "globalFault", "changeStrategy"]
    assert [r["code"] for r in client.events("report", attempt=1)] == [0, 0, 0]
    assert cluster.ranks(job)[1].restart_count == 1


def _auth_file(folder: Path, callers: list[dict[str, Any]]) -> str:
    path = folder / "gateway-callers.yaml"
    path.write_text(json.dumps({"callers": callers}))  # JSON is YAML
    path.chmod(0o600)
    return str(path)


def _calls(client: UpstreamClient) -> dict[str, str]:
    """The upstream client's ``--calls``: each call's gRPC code (OK:<Status code> when answered)."""
    client.wait_for("the calls", lambda: client.events("calls_done"), timeout=30)
    return {
        c["name"]: c["grpc_code"] if c["grpc_code"] != "OK" else f"OK:{c.get('code', c.get('first'))}"
        for c in client.events("call")
    }


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def test_a_caller_acts_only_on_the_jobs_its_token_is_given(cluster: Cluster, upstream, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """issue 25: with --tls-client-ca any certificate of the CA, and without it any caller, could
    inject a fault into any job. With --auth-file a caller's identity is tied to its jobs: every
    call on another job is refused (PERMISSION_DENIED), an unknown or missing identity too
    (UNAUTHENTICATED); the refused job is untouched and its event log says so, once per caller."""
    mine, theirs = "job-gw-mine", "job-gw-theirs"
    _put_job(cluster, mine, ["recover-in-place", "exit"])
    _put_job(cluster, theirs, ["recover-in-place", "exit"])
    auth = _auth_file(tmp_path, [{"name": "team-mine", "token_sha256": _sha256("token-mine"), "jobs": [mine]}])
    port = start_gateway(cluster, "--auth-file", auth)
    calls = ("Init", "Register", "ReportProcessFault", "ReportStopComplete", "ReportRecoverStrategy",
             "ReportRecoverStatus", "SubscribeProcessManageSignal")  # fmt: skip

    refused = _calls(upstream(port, theirs, "--calls", "--token", "token-mine"))
    assert refused == dict.fromkeys(calls, "PERMISSION_DENIED")
    for token in ((), ("--token", "a-guess")):
        anonymous = _calls(upstream(port, theirs, "--calls", *token))
        assert anonymous == dict.fromkeys(calls, "UNAUTHENTICATED"), token
    view = cluster.view(theirs)
    assert view.clients == {} and view.faults == {}
    assert not cluster._run(lambda store: store.get_prefix(cluster.keys.inbox_prefix(theirs))).kvs
    denied = [e for e in cluster.events(theirs) if e.reason == "caller_denied"]
    assert sorted(e.data["caller"] for e in denied) == [
        "a bearer token the auth file does not list",
        "no identity (neither a bearer token nor a client certificate)",
        "team-mine",
    ], denied  # one per caller, not one per call
    assert all(e.source == "gateway" for e in denied)

    allowed = _calls(upstream(port, mine, "--calls", "--token", "token-mine"))
    assert allowed["Init"] == "OK:0" and allowed["Register"] == "OK:0" and allowed["ReportProcessFault"] == "OK:0"
    assert allowed["SubscribeProcessManageSignal"] == "OK:keep-alive"
    assert len(cluster.view(mine).clients) == 1 and len(cluster.view(mine).faults) == 1


def test_the_gateway_listens_on_loopback_unless_told_and_refuses_local_trust_elsewhere(cluster: Cluster) -> None:
    from recoverd.cli.parser import build_parser, subcommands

    listen = [a.default for a in subcommands(build_parser())["gateway"]._actions if "--listen" in a.option_strings]
    assert listen == ["127.0.0.1:8899"]
    proc = cluster.spawn("gateway", ["gateway", "--etcd", cluster.endpoint, "--listen", f"0.0.0.0:{_free_port()}"])
    assert proc.wait(timeout=30) == 2
    text = Path(proc.log_path).read_text()  # type: ignore[attr-defined]
    assert "with no --auth-file: any caller that reaches it could act on every job" in text, text


def test_the_gateway_refuses_half_a_tls_setup(cluster: Cluster, tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n")
    proc = cluster.spawn(
        "gateway", ["gateway", "--etcd", cluster.endpoint, "--listen", "127.0.0.1:0", "--tls-key", str(key)]
    )
    assert proc.wait(timeout=30) == 2
    assert "needs both --tls-cert and --tls-key" in Path(proc.log_path).read_text()  # type: ignore[attr-defined]
