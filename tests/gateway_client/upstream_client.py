"""An upstream MindCluster client for the gateway tests, run as its own process.

It imports plain ``recover_pb2`` / ``recover_pb2_grpc`` compiled from the proto with grpcio-tools
(``--stubs DIR``), as TaskD ships them, and never imports recoverd, so the two compiled copies of
the messages never meet in one process. It dials with TaskD's channel options and behaves like the
legacy ``DLRecoverManager`` (reference/mindcluster-contract.md section 9): Init until 0 (403 stops),
Register, subscribe, answer stopTrain / globalFault / changeStrategy with a report after each, and
re-Register and resend once when a report returns non-zero. Everything it sees is printed to stdout
as one JSON object per line (``event``: init, register, report, signal, stream_error, probe, ...).

``--probe`` instead runs one-shot checks of the RPCs' error paths and prints their results;
``--calls`` makes each of the calls that act on a job once and prints how each was answered.
``--token T`` sends ``authorization: Bearer T`` with every call (a gateway with ``--auth-file``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import sys
import threading
import time
from typing import Any

import grpc

UPSTREAM_OPTIONS = [
    ("grpc.keepalive_time_ms", 3000),
    ("grpc.keepalive_timeout_ms", 1000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 1),
]

pb: Any = None
rpc: Any = None
_print_lock = threading.Lock()


class _Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """Adds ``authorization: Bearer TOKEN`` to every call's metadata."""

    def __init__(self, token: str) -> None:
        self.token = token

    def _with_token(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), ("authorization", f"Bearer {self.token}")]
        return details._replace(metadata=metadata) if hasattr(details, "_replace") else _Details(details, metadata)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)


class _Details(grpc.ClientCallDetails):  # type: ignore[misc]
    def __init__(self, base: Any, metadata: list[tuple[str, str]]) -> None:
        self.method, self.timeout, self.credentials = base.method, base.timeout, base.credentials
        self.wait_for_ready, self.compression = base.wait_for_ready, base.compression
        self.metadata = metadata


def channel(args: argparse.Namespace, options: list[tuple[str, int]]) -> grpc.Channel:
    """TaskD's channel: plaintext, or TLS (with a client certificate for mutual TLS) when given."""
    chan = _channel(args, options)
    return grpc.intercept_channel(chan, _Bearer(args.token)) if args.token else chan


def _channel(args: argparse.Namespace, options: list[tuple[str, int]]) -> grpc.Channel:
    if not args.tls_ca:
        return grpc.insecure_channel(args.addr, options=options)

    def read(path: str | None) -> bytes | None:
        if not path:
            return None
        with open(path, "rb") as f:
            return f.read()

    credentials = grpc.ssl_channel_credentials(read(args.tls_ca), read(args.tls_key), read(args.tls_cert))
    return grpc.secure_channel(args.addr, credentials, options=options)


def out(event: str, **fields: Any) -> None:
    with _print_lock:
        print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


def load_stubs(folder: str) -> None:
    global pb, rpc
    sys.path.insert(0, folder)
    pb = importlib.import_module("recover_pb2")
    rpc = importlib.import_module("recover_pb2_grpc")
    assert not any(name.startswith("recoverd") for name in sys.modules), "the client must not import recoverd"


def ranks_to_wire(fault_ranks: dict[int, int]) -> list[Any]:
    return [pb.FaultRank(rankId=str(k), faultType=str(v)) for k, v in fault_ranks.items()]


class Reconnect(Exception):
    """Drop the stream and the channel, then Init, Register and subscribe again."""


class Controller:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.info = pb.ClientInfo(jobId=args.job, role="master agent")
        self.strategies = [s for s in args.strategies.split(",") if s]
        self.kill_flag = False
        self.reconnects_left = 1 if args.reconnect_on_first_signal else 0
        self.reconnect_requested = threading.Event()
        signal.signal(signal.SIGUSR1, lambda *_: self.reconnect_requested.set())
        self._connect()

    def _connect(self) -> None:
        self.channel = channel(self.args, UPSTREAM_OPTIONS)
        self.stub = rpc.RecoverStub(self.channel)

    # ---------------------------------------------------------------- upstream's calls
    def init(self) -> bool:
        while True:
            try:
                status = self.stub.Init(self.info, timeout=5)
            except grpc.RpcError as err:
                out("init_error", code=str(err.code()))
                time.sleep(0.1)
                self.channel.close()
                self._connect()
                continue
            out("init", code=status.code, info=status.info)
            if status.code == 0:
                return True
            if status.code == 403:
                return False
            time.sleep(0.1)

    def register(self) -> int:
        status = self.stub.Register(self.info, timeout=5)
        out("register", code=status.code, info=status.info)
        return int(status.code)

    def report(self, method: str, request: Any) -> int:
        """Upstream's report functions: on a non-zero code, Register again and resend once."""
        status = getattr(self.stub, method)(request, timeout=10)
        out("report", method=method, attempt=1, code=status.code, info=status.info)
        if status.code != 0:
            self.register()
            status = getattr(self.stub, method)(request, timeout=10)
            out("report", method=method, attempt=2, code=status.code, info=status.info)
        return int(status.code)

    def health_checks(self) -> None:
        """Upstream's _connection_check: HealthCheck every second."""
        while not self.kill_flag:
            try:
                status = self.stub.HealthCheck(self.info, timeout=2)
                if status.code != 0:
                    out("health", code=status.code)
            except (grpc.RpcError, ValueError) as err:
                out("health_error", error=repr(err)[:200])
            time.sleep(1.0)

    # ---------------------------------------------------------------- the loop
    def run(self) -> None:
        if self.args.health_check:
            threading.Thread(target=self.health_checks, daemon=True).start()
        if not self.init():
            return
        if self.args.fault_before_register:
            rank, fault_type = (int(x) for x in self.args.fault_before_register.split(":"))
            request = pb.ProcessFaultRequest(jobId=self.args.job, faultRanks=ranks_to_wire({rank: fault_type}))
            self.report("ReportProcessFault", request)
        self.register()
        if self.args.early_report:
            request = pb.StopCompleteRequest(
                jobId=self.args.job, status=pb.Status(code=0, info="early"), faultRanks=ranks_to_wire({0: 1})
            )
            self.report("ReportStopComplete", request)
        attempt = 0
        while not self.kill_flag:
            attempt += 1
            try:
                if attempt > 1:
                    if not self.init():
                        return
                    self.register()
                stream = self.stub.SubscribeProcessManageSignal(self.info)
                out("subscribing", attempt=attempt)
                try:
                    for message in stream:
                        self.handle(message)
                        if self.kill_flag:
                            break
                except Reconnect:
                    stream.cancel()
                    self.channel.close()
                    self._connect()
                    out("reconnected")
                    continue
                out("stream_ended")
            except grpc.RpcError as err:
                out("stream_error", code=str(err.code()), details=err.details())
                if self.args.exit_on_stream_error:
                    return
                time.sleep(min(1.0, 0.1 * attempt))

    def handle(self, message: Any) -> None:
        out(
            "signal",
            uuid=message.uuid,
            jobId=message.jobId,
            signalType=message.signalType,
            actions=list(message.actions),
            faultRanks=[[r.rankId, r.faultType] for r in message.faultRanks],
            changeStrategy=message.changeStrategy,
            extraParams=message.extraParams,
            timeout=message.timeout,
            nodeRankIds=list(message.nodeRankIds),
        )
        if message.signalType == "killMaster":
            self.kill_flag = True
            return
        if self.reconnect_requested.is_set():  # SIGUSR1: acted on at the next message, like upstream's flags
            self.reconnect_requested.clear()
            raise Reconnect()
        if message.signalType == "keep-alive" or not message.actions or message.jobId != self.args.job:
            return
        if self.reconnects_left:
            self.reconnects_left -= 1
            raise Reconnect()
        fault_ranks = {int(r.rankId): int(r.faultType) for r in message.faultRanks}
        for action in dict.fromkeys(message.actions):
            if action == "stop_train":
                self.report(
                    "ReportStopComplete",
                    pb.StopCompleteRequest(
                        jobId=self.args.job, status=pb.Status(code=0, info=""), faultRanks=ranks_to_wire(fault_ranks)
                    ),
                )
            elif action == "on_global_rank":
                self.report(
                    "ReportRecoverStrategy",
                    pb.RecoverStrategyRequest(
                        jobId=self.args.job, faultRanks=ranks_to_wire(fault_ranks), strategies=self.strategies
                    ),
                )
            elif action == "change_strategy":
                self.report(
                    "ReportRecoverStatus",
                    pb.RecoverStatusRequest(
                        jobId=self.args.job, status=pb.Status(code=0, info=""), strategy=message.changeStrategy
                    ),
                )
            else:
                out("ignored_action", action=action)


# -------------------------------------------------------------------- probe mode
def probe(args: argparse.Namespace) -> None:
    chan = channel(args, UPSTREAM_OPTIONS)
    stub = rpc.RecoverStub(chan)
    job, exit_only = args.job, args.exit_only_job

    def status(name: str, call: Any) -> None:
        result = call()
        out("probe", name=name, code=result.code, info=result.info)

    def stream_error(name: str, call: Any) -> None:
        try:
            for _ in call():
                pass
            out("probe", name=name, grpc_code="OK", details="")
        except grpc.RpcError as err:
            out("probe", name=name, grpc_code=err.code().name, details=err.details())

    flood = threading.Thread(target=ping_flood, args=(args,))
    flood.start()  # runs alongside the checks below
    info = pb.ClientInfo(jobId=job, role="master agent")
    stream_error("subscribe_unregistered", lambda: stub.SubscribeProcessManageSignal(info, timeout=5))
    status("health", lambda: stub.HealthCheck(info, timeout=5))
    status("register_before_init", lambda: stub.Register(info, timeout=5))
    status("init_unknown_job", lambda: stub.Init(pb.ClientInfo(jobId="no-such-job"), timeout=5))
    status("init_bad_job_id", lambda: stub.Init(pb.ClientInfo(jobId="a/b"), timeout=5))
    status("init_exit_only", lambda: stub.Init(pb.ClientInfo(jobId=exit_only), timeout=5))
    status("register_exit_only", lambda: stub.Register(pb.ClientInfo(jobId=exit_only), timeout=5))
    status("report_unregistered", lambda: stub.ReportStopComplete(pb.StopCompleteRequest(jobId=job), timeout=5))
    status("fault_unregistered", lambda: stub.ReportProcessFault(pb.ProcessFaultRequest(jobId=job), timeout=5))
    status("init", lambda: stub.Init(info, timeout=5))
    status("register", lambda: stub.Register(info, timeout=5))
    status("register_again", lambda: stub.Register(info, timeout=5))
    bad_rank = [pb.FaultRank(rankId="x", faultType="1")]
    status("report_bad_rank", lambda: stub.ReportStopComplete(
        pb.StopCompleteRequest(jobId=job, faultRanks=bad_rank), timeout=5))  # fmt: skip
    status("fault_bad_rank", lambda: stub.ReportProcessFault(
        pb.ProcessFaultRequest(jobId=job, faultRanks=bad_rank), timeout=5))  # fmt: skip
    status("strategy_other_job", lambda: stub.ReportRecoverStrategy(
        pb.RecoverStrategyRequest(jobId="other-job", strategies=["exit"]), timeout=5))  # fmt: skip
    rank0 = [pb.FaultRank(rankId="0", faultType="1")]
    status("report_before_signal", lambda: stub.ReportStopComplete(
        pb.StopCompleteRequest(jobId=job, faultRanks=rank0), timeout=5))  # fmt: skip
    status("stress_test", lambda: stub.StressTest(pb.StressTestParam(jobID=job), timeout=5))
    status("switch_nic_track", lambda: stub.SwitchNicTrack(pb.SwitchNics(jobID=job), timeout=5))
    status("reply_switch_nic", lambda: stub.ReplySwitchNicResult(pb.SwitchResult(jobId=job), timeout=5))
    status("reply_stress_result", lambda: stub.ReplyStressTestResult(pb.StressTestResult(jobId=job), timeout=5))
    # Two subscriptions of one job: the newer takes over, the older ends normally.
    older = stub.SubscribeProcessManageSignal(info, timeout=10)
    first = next(older)
    newer = stub.SubscribeProcessManageSignal(info, timeout=10)
    next(newer)
    try:
        rest = [m.signalType for m in older]
        out("probe", name="superseded", first=first.signalType, rest=rest, grpc_code="OK")
    except grpc.RpcError as err:
        out("probe", name="superseded", first=first.signalType, grpc_code=err.code().name, details=err.details())
    newer.cancel()
    stream_error("subscribe_notify_switch", lambda: stub.SubscribeNotifySwitch(info, timeout=5))
    stream_error("subscribe_stress", lambda: stub.SubscribeStressTestResponse(
        pb.StressTestRequest(jobID=job), timeout=5))  # fmt: skip
    chan.close()
    flood.join()
    out("probe_done")


def calls(args: argparse.Namespace) -> None:
    """Each call that acts on ``--job`` once: how it was answered (a gRPC code, or OK and the
    Status code). Init first, so that Register would pass a gateway's order checks."""
    chan = channel(args, UPSTREAM_OPTIONS)
    stub = rpc.RecoverStub(chan)
    job = args.job
    info = pb.ClientInfo(jobId=job, role="master agent")
    rank0 = [pb.FaultRank(rankId="0", faultType="1")]
    unary = {
        "Init": lambda: stub.Init(info, timeout=5),
        "Register": lambda: stub.Register(info, timeout=5),
        "ReportProcessFault": lambda: stub.ReportProcessFault(pb.ProcessFaultRequest(jobId=job, faultRanks=rank0),
                                                              timeout=5),
        "ReportStopComplete": lambda: stub.ReportStopComplete(pb.StopCompleteRequest(jobId=job, faultRanks=rank0),
                                                              timeout=5),
        "ReportRecoverStrategy": lambda: stub.ReportRecoverStrategy(
            pb.RecoverStrategyRequest(jobId=job, strategies=["exit"]), timeout=5),
        "ReportRecoverStatus": lambda: stub.ReportRecoverStatus(pb.RecoverStatusRequest(jobId=job), timeout=5),
    }  # fmt: skip
    for name, call in unary.items():
        try:
            status = call()
            out("call", name=name, grpc_code="OK", code=status.code, info=status.info)
        except grpc.RpcError as err:
            out("call", name=name, grpc_code=err.code().name, details=err.details())
    try:
        first = next(stub.SubscribeProcessManageSignal(info, timeout=5))
        out("call", name="SubscribeProcessManageSignal", grpc_code="OK", first=first.signalType)
    except grpc.RpcError as err:
        out("call", name="SubscribeProcessManageSignal", grpc_code=err.code().name, details=err.details())
    chan.close()
    out("calls_done")


def ping_flood(args: argparse.Namespace) -> None:
    """Ping far more often than upstream (every 0.2 s, no call open) and watch the connection.

    A server with gRPC's default ping policy answers this with GOAWAY too_many_pings within a
    second, which drops the channel out of READY; the gateway must keep it READY throughout.
    """
    options = [
        ("grpc.keepalive_time_ms", 200),
        ("grpc.keepalive_timeout_ms", 1000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    chan = channel(args, options)
    stub = rpc.RecoverStub(chan)
    states: list[str] = []
    stub.HealthCheck(pb.ClientInfo(jobId=args.job), timeout=5)
    chan.subscribe(lambda state: states.append(state.name), try_to_connect=False)
    time.sleep(args.ping_seconds)
    result = stub.HealthCheck(pb.ClientInfo(jobId=args.job), timeout=5)
    out("probe", name="ping_flood", code=result.code, states=states)
    chan.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stubs", required=True, help="folder holding recover_pb2.py and recover_pb2_grpc.py")
    parser.add_argument("--addr", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--strategies", default="recover,dump,exit")
    parser.add_argument("--early-report", action="store_true", help="report stop-complete before any signal")
    parser.add_argument("--fault-before-register", default="", help="RANK:TYPE reported before Register")
    parser.add_argument("--reconnect-on-first-signal", action="store_true")
    parser.add_argument("--health-check", action="store_true", help="HealthCheck every second, as upstream")
    parser.add_argument("--exit-on-stream-error", action="store_true")
    parser.add_argument("--probe", action="store_true")
    parser.add_argument("--calls", action="store_true", help="each call on --job once, then exit")
    parser.add_argument("--token", default=None, help="send 'authorization: Bearer TOKEN' with every call")
    parser.add_argument("--exit-only-job", default="")
    parser.add_argument("--ping-seconds", type=float, default=4.0)
    parser.add_argument("--tls-ca", default=None, help="dial with TLS, trusting this CA (PEM)")
    parser.add_argument("--tls-cert", default=None, help="client certificate for mutual TLS (PEM)")
    parser.add_argument("--tls-key", default=None, help="its private key (PEM)")
    args = parser.parse_args()
    load_stubs(args.stubs)
    if args.probe:
        probe(args)
    elif args.calls:
        calls(args)
    else:
        Controller(args).run()
    out("exit")


if __name__ == "__main__":
    main()
