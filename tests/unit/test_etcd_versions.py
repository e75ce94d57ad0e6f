"""The table of etcd releases with known data-loss bugs (docs/dependencies.md)."""

from __future__ import annotations

import pytest

from recoverd.etcd_versions import KNOWN_BAD, known_problem, parse_version


@pytest.mark.parametrize(
    "version",
    ["3.5.0", "3.5.1", "3.5.2", "3.5.3", "3.5.4", "3.5.5", "3.4.20", "3.4.21", "v3.5.1", "3.5.2-rc.0"],
)
def test_known_bad_releases_are_flagged(version: str) -> None:
    assert known_problem(version)


@pytest.mark.parametrize("version", ["3.4.19", "3.4.22", "3.4.23", "3.5.6", "3.5.17", "3.6.0", "3.6.5", "2.3.8"])
def test_good_releases_are_not(version: str) -> None:
    assert known_problem(version) is None


def test_sigkill_bug_is_named_for_3_5_0_to_3_5_2_only() -> None:
    assert "13766" in (known_problem("3.5.2") or "")
    assert "13766" not in (known_problem("3.5.3") or "")
    assert "defrag" in (known_problem("3.5.5") or "")


@pytest.mark.parametrize("text", ["", "unknown", "3.5", "x3.5.1"])
def test_unparsable_versions_are_not_flagged(text: str) -> None:
    assert parse_version(text) is None and known_problem(text) is None


def test_table_ranges_are_ordered() -> None:
    assert all(bad.first <= bad.last for bad in KNOWN_BAD)
