"""Fixtures for end-to-end tests: a cluster of real recoverd processes in a test-unique prefix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .cluster import Cluster


@pytest.fixture
def cluster(etcd_endpoint: str, key_prefix: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    c = Cluster(etcd_endpoint, key_prefix, tmp_path)
    try:
        yield c
    finally:
        c.close()
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(c.logs())
