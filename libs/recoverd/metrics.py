"""Every Prometheus metric recoverd exports, and the port that serves them (docs/operations.md).

One module owns the names: services record into these objects, and :class:`MetricsServer` exposes them with
``/healthz`` and ``/readyz`` on ``--metrics-port``. Until then (:func:`enable`) recording does nothing
and prometheus-client is not even imported. Every service of one process (``recoverd run``
and ``up`` run several) shares one registry and one port.

* ``/metrics``: the Prometheus text format.
* ``/healthz``: 200 while the event loop turns (its heartbeat is younger than :data:`LOOP_STALE_S`);
  it answers from a thread, so a wedged loop shows as 503 instead of a hung endpoint.
* ``/readyz``: 200 when etcd answered the last probe (a Status call, every ``probe_s``) and, for a
  coordinator, a leader is known; 503 with the reason otherwise.

The HTTP server is the standard library's, on a daemon thread: prometheus-client's own
``start_http_server`` serves only ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

__all__ = [
    "DETECTION_SECONDS",
    "ETCD_ERRORS",
    "ETCD_SECONDS",
    "FAULTS",
    "LEADER",
    "LEADER_CHANGES",
    "PHASE_SECONDS",
    "RANKS",
    "RECOVERIES",
    "RECOVERY_SECONDS",
    "WARM_SPARES",
    "WATCH_RESYNCS",
    "Health",
    "MetricsServer",
    "enable",
]

log = logging.getLogger(__name__)

# Recoveries take from ~0.1 s (recover-in-place) to minutes (a deadline): buckets over both.
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_ETCD = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class _Ignored:
    """What a metric gives while metrics are off: every call does nothing."""

    def labels(self, *values: str) -> _Ignored:
        return self

    def inc(self, amount: float = 1) -> None:
        return None

    def set(self, value: float) -> None:
        return None

    def observe(self, value: float) -> None:
        return None


_IGNORED = _Ignored()
_ALL: list[_Metric] = []


class _Metric:
    """A Prometheus metric that records nothing until :func:`enable`.

    A process without ``--metrics-port`` (most tests, ``recoverctl``, every short-lived agent) never
    imports prometheus-client: with its HTTP exposition it costs ~75 ms at every start."""

    def __init__(
        self, kind: str, name: str, doc: str, labels: Sequence[str] = (), buckets: Sequence[float] | None = None
    ) -> None:
        self.kind, self.name, self.doc, self.label_names, self.buckets = kind, name, doc, tuple(labels), buckets
        self._real: Any = None
        _ALL.append(self)

    def _create(self, prom: Any, registry: Any) -> None:
        cls = {"counter": prom.Counter, "gauge": prom.Gauge, "histogram": prom.Histogram}[self.kind]
        extra = {"buckets": self.buckets} if self.buckets is not None else {}
        self._real = cls(self.name, self.doc, list(self.label_names), registry=registry, **extra)

    def labels(self, *values: str) -> Any:
        return self._real.labels(*values) if self._real is not None else _IGNORED

    def inc(self, amount: float = 1) -> None:
        if self._real is not None:
            self._real.inc(amount)

    def set(self, value: float) -> None:
        if self._real is not None:
            self._real.set(value)

    def observe(self, value: float) -> None:
        if self._real is not None:
            self._real.observe(value)


_registry: Any = None


def enable() -> Any:
    """Start recording (idempotent): create every metric in this process's registry; return it."""
    global _registry
    if _registry is None:
        import prometheus_client as prom

        _registry = prom.CollectorRegistry(auto_describe=True)
        for metric in _ALL:
            metric._create(prom, _registry)
    return _registry


# ---------------------------------------------------------------- the coordinator
FAULTS = _Metric(
    "counter",
    "recoverd_faults_total",
    "Faults merged into a recovery, by MindCluster fault type (0 UCE, 1 other, 2 network) and source",
    ["type", "source"],
)
RECOVERIES = _Metric(
    "counter",
    "recoverd_recoveries_total",
    "Recoveries closed, by the strategy that ended them and the outcome (succeeded, failed)",
    ["strategy", "outcome"],
)
PHASE_SECONDS = _Metric(
    "histogram",
    "recoverd_recovery_phase_seconds",
    "Time a recovery spent in each phase (COLLECTING, STOPPING, ..., RECOVERING), observed when it leaves it",
    ["phase"],
    _SECONDS,
)
DETECTION_SECONDS = _Metric(
    "histogram",
    "recoverd_fault_detection_seconds",
    "From a fault's detection (the detector's clock) to the coordinator merging it into a recovery",
    buckets=_SECONDS,
)
RECOVERY_SECONDS = _Metric(
    "histogram",
    "recoverd_recovery_seconds",
    "From the recovery's first fault to DONE: the ranks run again (kill -> running)",
    ["strategy"],
    _SECONDS,
)
LEADER = _Metric("gauge", "recoverd_coordinator_leader", "1 while this coordinator holds the leader key")
LEADER_CHANGES = _Metric(
    "counter", "recoverd_coordinator_leader_changes_total", "Terms this coordinator began or ended", ["change"]
)

# ---------------------------------------------------------------- every etcd client
ETCD_SECONDS = _Metric("histogram", "recoverd_etcd_request_seconds", "etcd requests by operation", ["op"], _ETCD)
ETCD_ERRORS = _Metric(
    "counter",
    "recoverd_etcd_request_errors_total",
    "etcd requests that failed: unavailable (retried), refused, denied (TLS or credentials)",
    ["op", "kind"],
)
WATCH_RESYNCS = _Metric(
    "counter",
    "recoverd_etcd_watch_resyncs_total",
    "Watches that re-read their state: after a reconnect, or history compacted under them",
    ["reason"],
)

# ---------------------------------------------------------------- the agent
RANKS = _Metric("gauge", "recoverd_agent_ranks", "This agent's ranks by state", ["job", "node", "state"])
WARM_SPARES = _Metric("gauge", "recoverd_agent_warm_spares", "Warm spare processes waiting for a rank", ["job", "node"])

LOOP_STALE_S = 10.0


class Health:
    """What ``/healthz`` and ``/readyz`` answer, kept up to date by :meth:`run` on the event loop.

    ``probe()`` raises when etcd cannot be reached; ``leader()`` (coordinators only) returns
    whether a leader is known. The HTTP thread only reads the results."""

    def __init__(
        self,
        probe: Callable[[], Awaitable[Any]],
        leader: Callable[[], Awaitable[bool]] | None = None,
        probe_s: float = 1.0,
    ) -> None:
        self._probe = probe
        self._leader = leader
        self.probe_s = probe_s
        self.ready_reason = "not probed yet"
        self._beat = time.monotonic()

    @property
    def alive(self) -> bool:
        return time.monotonic() - self._beat < LOOP_STALE_S

    @property
    def ready(self) -> bool:
        return not self.ready_reason

    async def check(self) -> None:
        """One probe: etcd reachable, then (coordinators) a leader known."""
        try:
            await asyncio.wait_for(self._probe(), timeout=max(self.probe_s * 2, 2.0))
        except Exception as err:  # any failure to reach etcd is "not ready", with its reason
            self.ready_reason = f"etcd unreachable: {err}"[:300]
            return
        if self._leader is not None and not await self._leader():
            self.ready_reason = "no coordinator leader known"
            return
        self.ready_reason = ""

    async def run(self) -> None:
        while True:
            self._beat = time.monotonic()
            with contextlib.suppress(Exception):
                await self.check()
            self._beat = time.monotonic()
            await asyncio.sleep(self.probe_s)


class MetricsServer:
    """``/metrics``, ``/healthz``, ``/readyz`` on ``host:port`` (port 0: any free one, see ``port``)."""

    def __init__(self, port: int, health: Health, host: str = "127.0.0.1") -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        registry = enable()
        self.health = health
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._answer(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    ok = server.health.alive
                    self._answer(200 if ok else 503, b"ok\n" if ok else b"event loop stalled\n")
                elif path == "/readyz":
                    reason = server.health.ready_reason
                    self._answer(503 if reason else 200, (reason or "ready").encode() + b"\n")
                else:
                    self._answer(404, b"not found: /metrics, /healthz, /readyz\n")

            def _answer(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # a scrape every few seconds is not worth a log line

        try:
            self._httpd = ThreadingHTTPServer((host, port), Handler)
        except OSError as err:
            from recoverd.errors import ConfigError

            raise ConfigError(f"cannot serve metrics on {host}:{port}: {err.strerror}") from None
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metrics-http", daemon=True)

    def start(self) -> MetricsServer:
        self._thread.start()
        log.info("metrics, /healthz and /readyz on port %d", self.port)
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
