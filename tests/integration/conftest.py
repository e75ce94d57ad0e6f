"""Fixtures for end-to-end tests: a cluster of real recoverd processes in a test-unique prefix."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from recoverd.keys import Keyspace
from recoverd.store import Store

from .cluster import Cluster


@pytest.fixture
async def store(etcd_endpoint: str) -> AsyncIterator[Store]:
    """A store on the test's etcd (tests that drive the coordinator or etcd directly)."""
    async with Store(etcd_endpoint) as s:
        yield s


@pytest.fixture
def keys(key_prefix: str) -> Keyspace:
    """The keyspace under the test's own prefix."""
    return Keyspace(key_prefix)


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
