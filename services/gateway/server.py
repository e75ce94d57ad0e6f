"""The gateway's gRPC server: the ``Recover`` service on a grpc.aio server, its options and its CLI flags.

Keepalive (reference/mindcluster-contract.md section 1): upstream clients ping every 3 s, also with no
stream open (``keepalive_time_ms=3000``, ``keepalive_permit_without_calls=1``). gRPC's server
defaults allow one ping without data per 5 minutes and close the connection with GOAWAY
``too_many_pings`` after two early pings, so the server options permit pings without calls, accept
them every second and never count strikes. The server's own pings follow ClusterD (every 60 s,
5 s timeout).
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import logging
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from recoverd.argtypes import lease_ttl, positive
from recoverd.errors import ConfigError
from recoverd.keys import Keyspace
from recoverd.mindcluster import recover_pb2_grpc
from recoverd.store import Store

from . import callers
from .service import GatewaySettings, RecoverService

__all__ = ["SERVER_OPTIONS", "Gateway", "add_arguments", "settings_from_args"]

log = logging.getLogger(__name__)

#: MindCluster's service name, as the gRPC health service reports it (besides "" for the server).
RECOVER_SERVICE = "Recover"

SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 1000),
    ("grpc.http2.max_ping_strikes", 0),  # 0: never GOAWAY for early pings
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.so_reuseport", 0),  # gRPC's default would let a second gateway bind the same port silently
)


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


class Gateway:
    """``async with Gateway(store, keys, settings) as gw:`` listens until the block ends.

    Entering binds ``settings.listen`` (ConfigError if it cannot) and starts serving. Leaving
    deregisters every session, so the agents take over the jobs' recoveries at once instead of
    after a lease TTL, ends the subscription streams, and stops the server (calls in flight get
    ``shutdown_grace_s`` to finish).
    """

    def __init__(self, store: Store, keys: Keyspace, settings: GatewaySettings) -> None:
        self.settings = settings
        self.service = RecoverService(store, keys, settings, admission(settings))
        self.port = 0
        self.health: health.aio.HealthServicer | None = None
        self._server: grpc.aio.Server | None = None
        self._state = _State.UNOPENED

    async def __aenter__(self) -> Gateway:
        if self._state is not _State.UNOPENED:
            raise RuntimeError(f"Gateway cannot be entered twice (state: {self._state.value})")
        self._state = _State.OPEN
        server = grpc.aio.server(options=list(SERVER_OPTIONS))
        recover_pb2_grpc.add_RecoverServicer_to_server(self.service, server)
        # The standard gRPC health service (grpc.health.v1): load balancers and `grpc_health_probe`.
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        try:
            credentials = server_credentials(self.settings)
            if credentials is None:
                self.port = server.add_insecure_port(self.settings.listen)
            else:
                self.port = server.add_secure_port(self.settings.listen, credentials)
        except RuntimeError as err:
            raise ConfigError(f"cannot listen on {self.settings.listen}: {err}") from err
        if not self.port:
            raise ConfigError(f"cannot listen on {self.settings.listen} (in use, or not a host:port)")
        await server.start()
        for name in ("", RECOVER_SERVICE):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._server = server
        log.info(
            "recoverd gateway listening on %s (port %d, %s)",
            self.settings.listen,
            self.port,
            "mutual TLS" if self.settings.tls_client_ca else "TLS" if self.settings.tls_cert else "plaintext",
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop serving and deregister every session; idempotent."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        server, self._server = self._server, None
        async with asyncio.timeout(self.settings.shutdown_grace_s + self.settings.call_timeout_s + 5):
            # Sessions first: that ends every subscription stream at once (UNAVAILABLE) instead of
            # after the grace, and Register is refused meanwhile; then the unary calls drain.
            if self.health is not None:
                await self.health.enter_graceful_shutdown()
            await self.service.aclose()
            if server is not None:
                await server.stop(self.settings.shutdown_grace_s)
        log.info("recoverd gateway stopped")


def admission(settings: GatewaySettings) -> callers.CallerTable | None:
    """The caller table of ``--auth-file``, or None for local trust, which is allowed only on a
    loopback address or with ``--allow-any-caller`` (ConfigError otherwise: exit 2 before
    listening). Says in the log which it is."""
    if settings.auth_file:
        table = callers.load(settings.auth_file)
        log.info(
            "gateway callers from %s: %d token(s), %d certificate name(s); every other caller is refused",
            settings.auth_file, len(table.by_token), len(table.by_certificate),
        )  # fmt: skip
        if table.by_token and not settings.tls_cert and not callers.is_loopback(settings.listen):
            log.warning(
                "bearer tokens over plaintext on %s: anyone on the path can read and reuse them;"
                " serve TLS (--tls-cert/--tls-key)",
                settings.listen,
            )
        return table
    if callers.is_loopback(settings.listen):
        log.info("no --auth-file: local trust, every caller that reaches %s may act on every job", settings.listen)
        return None
    if settings.allow_any_caller:
        log.warning(
            "no --auth-file and --allow-any-caller: every caller that reaches %s may act on every job"
            " (inject faults, restart ranks); only behind a network policy that admits the jobs' own pods",
            settings.listen,
        )
        return None
    raise ConfigError(
        f"the gateway would listen on {settings.listen} with no --auth-file: any caller that reaches it could"
        " act on every job. Give --auth-file FILE (callers and their jobs: docs/gateway.md), listen on"
        " loopback, or accept it with --allow-any-caller behind a network policy"
    )


_positive_float = positive(float)


def _pem(flag: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except OSError as err:
        raise ConfigError(f"{flag} {path}: cannot read it: {err.strerror}") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{flag} {path}: not a PEM file")
    return data


def server_credentials(settings: GatewaySettings) -> grpc.ServerCredentials | None:
    """TLS for the Recover port from the settings' PEM files; None for plaintext."""
    if not (settings.tls_cert or settings.tls_key or settings.tls_client_ca):
        return None
    if not (settings.tls_cert and settings.tls_key):
        raise ConfigError("the gateway's TLS needs both --tls-cert and --tls-key")
    pair = (_pem("--tls-key", settings.tls_key), _pem("--tls-cert", settings.tls_cert))
    if settings.tls_client_ca:
        return grpc.ssl_server_credentials(
            [pair], root_certificates=_pem("--tls-client-ca", settings.tls_client_ca), require_client_auth=True
        )
    return grpc.ssl_server_credentials([pair])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The gateway's own flags (``--etcd``/``--prefix``/``--log-level`` come from the CLI)."""
    default = GatewaySettings()
    number: Callable[[str], Any] = _positive_float
    parser.add_argument("--listen", default=default.listen, help="host:port to serve Recover on (%(default)s)")
    parser.add_argument(
        "--keepalive-interval", type=number, default=default.keepalive_interval_s,
        help="seconds between keep-alive messages on a subscription stream (%(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--client-lease-ttl", type=lease_ttl, default=default.client_lease_ttl_s,
        help="lease TTL of each registered client session, whole seconds, at least 1 (%(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--client-grace", type=number, default=default.client_grace_s,
        help="deregister a job's client after this many seconds with no subscription stream open (%(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--call-timeout", type=number, default=default.call_timeout_s,
        help="budget of one RPC's etcd work, in seconds; over it the call answers 599 (%(default)s)",
    )  # fmt: skip
    tls = parser.add_argument_group("the gateway's TLS (docs/security.md)")
    tls.add_argument("--tls-cert", metavar="FILE", help="serve TLS with this certificate (PEM; with --tls-key)")
    tls.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    tls.add_argument(
        "--tls-client-ca", metavar="FILE", help="require client certificates signed by this CA (mutual TLS)"
    )
    who = parser.add_argument_group('the gateway\'s callers (docs/gateway.md, "Callers")')
    who.add_argument(
        "--auth-file",
        metavar="FILE",
        help="YAML: which callers (bearer token digest, or client certificate name) may act on which jobs;"
        " every other call is refused. Without it, every caller may act on every job (local trust)",
    )
    who.add_argument(
        "--allow-any-caller",
        action="store_true",
        help="allow local trust on a non-loopback --listen (only behind a network policy)",
    )


def settings_from_args(args: argparse.Namespace) -> GatewaySettings:
    return GatewaySettings(
        listen=args.listen,
        keepalive_interval_s=args.keepalive_interval,
        client_lease_ttl_s=args.client_lease_ttl,
        client_grace_s=args.client_grace,
        call_timeout_s=args.call_timeout,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        auth_file=args.auth_file,
        allow_any_caller=args.allow_any_caller,
    )
