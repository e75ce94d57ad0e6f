"""Every Prometheus metric recoverd exports, and the port that serves them (docs/operations.md).

One module owns the names: services record into these objects, and :class:`MetricsServer` exposes them with
``/healthz`` and ``/readyz`` on ``--metrics-port``. Every service of one process (``recoverd run``
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
from collections.abc import Awaitable, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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
    "REGISTRY",
    "WARM_SPARES",
    "WATCH_RESYNCS",
    "Health",
    "MetricsServer",
]

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

# Recoveries take from ~0.1 s (recover-in-place) to minutes (a deadline): buckets over both.
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_ETCD = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)

# ---------------------------------------------------------------- the coordinator
FAULTS = Counter(
    "recoverd_faults_total",
    "Faults merged into a recovery, by MindCluster fault type (0 UCE, 1 other, 2 network) and source",
    ["type", "source"],
    registry=REGISTRY,
)
RECOVERIES = Counter(
    "recoverd_recoveries_total",
    "Recoveries closed, by the strategy that ended them and the outcome (succeeded, failed)",
    ["strategy", "outcome"],
    registry=REGISTRY,
)
PHASE_SECONDS = Histogram(
    "recoverd_recovery_phase_seconds",
    "Time a recovery spent in each phase (COLLECTING, STOPPING, ..., RECOVERING), observed when it leaves it",
    ["phase"],
    buckets=_SECONDS,
    registry=REGISTRY,
)
DETECTION_SECONDS = Histogram(
    "recoverd_fault_detection_seconds",
    "From a fault's detection (the detector's clock) to the coordinator merging it into a recovery",
    buckets=_SECONDS,
    registry=REGISTRY,
)
RECOVERY_SECONDS = Histogram(
    "recoverd_recovery_seconds",
    "From the recovery's first fault to DONE: the ranks run again (kill -> running)",
    ["strategy"],
    buckets=_SECONDS,
    registry=REGISTRY,
)
LEADER = Gauge("recoverd_coordinator_leader", "1 while this coordinator holds the leader key", registry=REGISTRY)
LEADER_CHANGES = Counter(
    "recoverd_coordinator_leader_changes_total", "Terms this coordinator began or ended", ["change"], registry=REGISTRY
)

# ---------------------------------------------------------------- every etcd client
ETCD_SECONDS = Histogram(
    "recoverd_etcd_request_seconds", "etcd requests by operation", ["op"], buckets=_ETCD, registry=REGISTRY
)
ETCD_ERRORS = Counter(
    "recoverd_etcd_request_errors_total",
    "etcd requests that failed: unavailable (retried), refused, denied (TLS or credentials)",
    ["op", "kind"],
    registry=REGISTRY,
)
WATCH_RESYNCS = Counter(
    "recoverd_etcd_watch_resyncs_total",
    "Watches that re-read their state: after a reconnect, or history compacted under them",
    ["reason"],
    registry=REGISTRY,
)

# ---------------------------------------------------------------- the agent
RANKS = Gauge("recoverd_agent_ranks", "This agent's ranks by state", ["job", "node", "state"], registry=REGISTRY)
WARM_SPARES = Gauge(
    "recoverd_agent_warm_spares", "Warm spare processes waiting for a rank", ["job", "node"], registry=REGISTRY
)

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

    def __init__(self, port: int, health: Health, host: str = "0.0.0.0") -> None:
        self.health = health
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._answer(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
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
