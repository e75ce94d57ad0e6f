"""Fixtures for end-to-end tests: a cluster of real recoverd processes in a test-unique prefix."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from recoverd.keys import Keyspace
from recoverd.store import Store

from .cluster import Cluster, owned


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
    with owned(Cluster(etcd_endpoint, key_prefix, tmp_path), request) as c:
        yield c
