"""scratch repro"""
from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from recoverd.records import pb

from .cluster import Cluster

pytestmark = pytest.mark.etcd


@pytest.mark.parametrize("strategies", ["recover-in-place,recover,exit"])
def test_repro(cluster: Cluster, strategies: str) -> None:
    job = "job-repl"
    cluster.coordinator()
    cluster.strategy()
    for i, node in enumerate(("node-a", "node-b")):
        cluster.agent(job, node, nproc=2, nnodes=2, node_rank=i, strategies=strategies, worker=("--steps", "150", "--step-time", "0.1"))
    before = cluster.wait_running(job, 4)
    cluster.kill("agent-node-b")
    for r in (2, 3):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(before[r].pid, signal.SIGKILL)
    time.sleep(5)
    cluster.agent(job, "node-c", nproc=2, nnodes=2, node_rank=1, strategies=strategies, worker=("--steps", "150", "--step-time", "0.1"))
    try:
        rc = cluster.wait_exit("agent-node-a", timeout=90)
    finally:
        for r in (2, 3):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(before[r].pid, 0)
    for e in cluster.events(job):
        print(e.reason, e.source, e.message)
    print(cluster.logs())
    assert rc == 0
