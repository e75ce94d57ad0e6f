"""Shared test harness: one etcd per session, a keyspace prefix per test, and a process-leak check.

* **etcd**: every test that needs etcd shares one server (``etcd_server``) and isolates itself by
  a unique key prefix (``key_prefix``); starting etcd per test would cost ~0.1 s each. By default it
  is an :class:`~recoverd.etcd_server.EmbeddedEtcd` (native binary, no Docker). With
  ``RECOVERD_TEST_ETCD=container`` and a reachable Docker engine it is the official etcd image via
  testcontainers; without an engine that falls back to the native binary with a warning.
* **no leaked processes**: recoverd's core promise is process hygiene (start, kill, reap), so every
  test is checked for child processes it left behind. The pytest process is made a *child
  subreaper* at import time: an orphaned grandchild (its parent died without killing it) re-parents
  to pytest instead of init, where the check can see it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

import psutil
import pytest

from recoverd.etcd_server import EmbeddedEtcd

log = logging.getLogger("recoverd.tests")

_PR_SET_CHILD_SUBREAPER = 36
_LEAK_GRACE_S = 5.0
_ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.17"
_ETCD_BACKEND_ENV = "RECOVERD_TEST_ETCD"


def _become_subreaper() -> None:
    """Make orphaned descendants re-parent to pytest (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(err)}")


_become_subreaper()


# ---------------------------------------------------------------------------- etcd backends


class EtcdBackend(Protocol):
    """What tests may do with the shared etcd (both backends offer it)."""

    @property
    def endpoint(self) -> str: ...

    @property
    def url(self) -> str: ...

    @property
    def pid(self) -> int | None: ...

    def kill9(self) -> None: ...

    def restart(self) -> None: ...


class _ContainerEtcd:
    """The official etcd image run by testcontainers; only for hosts with a Docker engine.

    ``kill9``/``restart`` skip the calling test: the container's ports are remapped on restart, so
    those tests use their own native :class:`EmbeddedEtcd` instead.
    """

    def __init__(self) -> None:
        from testcontainers.core.container import DockerContainer

        command = [
            "etcd",
            "--listen-client-urls", "http://0.0.0.0:2379",
            "--advertise-client-urls", "http://0.0.0.0:2379",
            "--log-level", "error",
        ]  # fmt: skip
        self._container = DockerContainer(_ETCD_IMAGE).with_exposed_ports(2379).with_command(command)
        self._container.start()
        try:
            host = self._container.get_container_host_ip()
            port = self._container.get_exposed_port(2379)
            self.endpoint = f"{host}:{port}"
            self.url = f"http://{self.endpoint}"
            self._wait_healthy(timeout_s=30.0)
        except BaseException:
            self.stop()
            raise
        self.pid: int | None = None

    def _wait_healthy(self, timeout_s: float) -> None:
        # etcd has no readiness signal but /health; polled only here, at session start.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError, ValueError):
                with opener.open(f"{self.url}/health", timeout=1.0) as response:
                    if b'"true"' in response.read():
                        return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"etcd container at {self.url} not healthy within {timeout_s}s")
            time.sleep(0.05)

    def kill9(self) -> None:
        pytest.skip("kill9 needs the native etcd backend (RECOVERD_TEST_ETCD=container is set)")

    def restart(self) -> None:
        pytest.skip("restart needs the native etcd backend (RECOVERD_TEST_ETCD=container is set)")

    def stop(self) -> None:
        self._container.stop()


def _start_backend() -> tuple[EtcdBackend, Any]:
    """Start the session's etcd; returns (backend, stopper)."""
    if os.environ.get(_ETCD_BACKEND_ENV, "").strip().lower() == "container":
        try:
            # DockerException when no engine answers; anything else while building the client
            # (bad DOCKER_HOST, missing socket) means the same: no containers here.
            import docker.errors

            try:
                container = _ContainerEtcd()
                return container, container.stop
            except docker.errors.DockerException as err:
                log.warning("no Docker engine for %s=container (%s); using the native etcd", _ETCD_BACKEND_ENV, err)
        except Exception as err:
            log.warning("cannot use testcontainers (%r); using the native etcd binary", err)
    native = EmbeddedEtcd(for_tests=True)
    native.start()
    return native, native.stop


_SESSION_ETCD = pytest.StashKey[EtcdBackend]()


@pytest.fixture(scope="session")
def etcd_server(request: pytest.FixtureRequest) -> Iterator[EtcdBackend]:
    """The session's shared etcd: ``.endpoint``, ``.url``, ``.kill9()``, ``.restart()``.

    Shared by every test; tests isolate themselves with ``key_prefix``. A test that kills etcd
    should use its own :class:`EmbeddedEtcd` instead, so it cannot break its neighbours.
    """
    backend, stop = _start_backend()
    request.config.stash[_SESSION_ETCD] = backend
    try:
        yield backend
    finally:
        del request.config.stash[_SESSION_ETCD]
        stop()


@pytest.fixture
def etcd_endpoint(etcd_server: EtcdBackend) -> str:
    """``host:port`` of the shared etcd, as :class:`recoverd.store.Store` takes it."""
    return etcd_server.endpoint


@pytest.fixture
def key_prefix() -> str:
    """A keyspace prefix unique to this test (starts with ``/``, no trailing ``/``)."""
    return f"/rt{uuid.uuid4().hex[:10]}/v1"


# ---------------------------------------------------------------------------- leak check


def _describe(proc: psutil.Process) -> str:
    """pid, name, state, parent and command line; each part best effort (a zombie has no cmdline)."""

    def attr(getter: Any, default: str) -> str:
        try:
            return str(getter())
        except psutil.Error:
            return default

    name = attr(proc.name, "?")
    cmdline = attr(lambda: " ".join(proc.cmdline()), "") or f"[{name}]"
    return f"pid {proc.pid} {name!r} ({attr(proc.status, 'gone')}, ppid {attr(proc.ppid, '?')}): {cmdline[:200]}"


def _leftovers(allowed: set[int]) -> list[psutil.Process]:
    me = psutil.Process()
    return [p for p in me.children(recursive=True) if p.pid not in allowed]


def _is_zombie(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill_tree(procs: list[psutil.Process]) -> None:
    """SIGKILL leftovers (their whole group when it is not pytest's own) and reap our children."""
    own_group = os.getpgrp()
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError, psutil.Error):
            pgid = os.getpgid(proc.pid)
            if pgid != own_group:
                os.killpg(pgid, signal.SIGKILL)
            else:
                os.kill(proc.pid, signal.SIGKILL)
    # psutil's wait() reaps when the process is our child (it is, or re-parents to us: subreaper).
    psutil.wait_procs(procs, timeout=2.0)
    _reap_zombies()


def _reap_zombies() -> list[int]:
    reaped: list[int] = []
    for proc in psutil.Process().children():
        if _is_zombie(proc):
            with contextlib.suppress(ChildProcessError):
                pid, _ = os.waitpid(proc.pid, os.WNOHANG)
                if pid:
                    reaped.append(pid)
    return reaped


_LONG_LIVED = pytest.StashKey[set[int]]()


@pytest.fixture(scope="session")
def long_lived_pids(request: pytest.FixtureRequest) -> set[int]:
    """Pids a module-scoped fixture owns across its tests (it stops them at its own teardown):
    the leak check of each test leaves them alone."""
    return request.config.stash.setdefault(_LONG_LIVED, set())


@pytest.fixture(autouse=True)
def no_leftover_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves any child process behind, alive or unreaped.

    After the test (and its fixtures, which tear down first) every descendant of pytest must be
    gone, except the shared etcd server. Owners get a grace period of 5 s to finish a graceful
    stop and reap; then any process still alive, or any zombie nobody reaped (typically an orphan
    that re-parented to pytest), fails the test with its pid, name and command line. Leftovers are
    killed and reaped after reporting, so one leak does not fail every later test.
    """
    yield

    def allowed() -> set[int]:
        backend = request.config.stash.get(_SESSION_ETCD, None)
        pid = backend.pid if backend is not None else None
        return ({pid} if pid else set()) | request.config.stash.get(_LONG_LIVED, set())

    deadline = time.monotonic() + _LEAK_GRACE_S
    procs = _leftovers(allowed())
    while procs and time.monotonic() < deadline:
        # Waiting on the owners (a Popen.wait, an asyncio child watcher) to finish; a leak check has
        # no event to wait for, so this one loop polls, and only when something is left.
        time.sleep(0.05)
        procs = _leftovers(allowed())
    if not procs:
        return
    alive = [p for p in procs if not _is_zombie(p)]
    zombies = [p for p in procs if _is_zombie(p)]
    lines = [f"  alive:  {_describe(p)}" for p in alive]
    lines += [f"  zombie (never reaped; reaped by the harness): {_describe(p)}" for p in zombies]
    _kill_tree(procs)
    pytest.fail(
        f"{request.node.nodeid} left {len(procs)} child process(es) after a {_LEAK_GRACE_S:.0f}s grace "
        "period (every started process must be killed and reaped):\n" + "\n".join(lines),
        pytrace=False,
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The fuzz figures (tests/fuzzstats.py): cases per target, and crashes (a crash fails its test)."""
    from tests.fuzzstats import CASES, FIGURES

    if not CASES:
        return
    failed = len(terminalreporter.stats.get("failed", []))
    parts = ", ".join(f"{name} {count}" for name, count in sorted(CASES.items()))
    parts += "".join(f"; {name} {count}" for name, count in sorted(FIGURES.items()))
    terminalreporter.write_line(
        f"fuzz: {sum(CASES.values())} cases ({parts}); crashes: {'see failures' if failed else 0}"
    )
