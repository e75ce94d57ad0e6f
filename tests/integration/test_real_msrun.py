"""Opt-in: recoverd's MSRunPlugin under the real ``msrun`` of MindSpore 2.10.0 (CPU, trivial workers).

MindSpore is about 3 GB installed, so it lives in its own virtual environment (``make msrun-venv``)
and this test runs only with ``RECOVERD_TEST_MSRUN=1`` (``make test-msrun``). Everything else about
the plugin is tested on every run through the port of msrun's process manager (test_msrun_plugin.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from recoverd.records import pb

from .cluster import ROOT, Cluster

pytestmark = [
    pytest.mark.etcd,
    pytest.mark.skipif(
        os.environ.get("RECOVERD_TEST_MSRUN") != "1",
        reason="opt-in: set RECOVERD_TEST_MSRUN=1 after `make msrun-venv` (MindSpore 2.10.0, ~3 GB)",
    ),
]

VENV = Path(os.environ.get("RECOVERD_TEST_MSRUN_VENV", str(ROOT / ".venv-msrun")))
WORKER = str(ROOT / "tests" / "msrun_port" / "trivial_worker.py")


def test_real_msrun_restarts_only_the_killed_worker_and_exits_zero(cluster: Cluster, tmp_path: Path) -> None:
    msrun_bin = VENV / "bin" / "msrun"
    assert msrun_bin.exists(), f"{msrun_bin} is missing: run `make msrun-venv` first"
    cluster.coordinator()
    cluster.strategy()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RECOVERD_", "MS_"))},
        "MS_ENABLE_TFT": "{ARF:1}",
        "RECOVERD_ETCD": cluster.endpoint,
        "RECOVERD_PREFIX": cluster.prefix,
        "RECOVERD_JOB": "real-msrun",
        "RECOVERD_STRATEGIES": "recover-in-place,exit",
        "RECOVERD_AGENT_LEASE_TTL": "2",
        "RECOVERD_STOP_GRACE_S": "1",
        "MSRUN_TEST_SCHED_S": "120",
        "PATH": f"{VENV / 'bin'}:{os.environ.get('PATH', '')}",
    }
    with open(tmp_path / "msrun.out", "wb") as out:
        msrun = subprocess.Popen(
            [str(msrun_bin), "--worker_num", "2", "--local_worker_num", "2", "--master_port", "18129",
             "--log_dir", str(tmp_path / "logs"), "--join", "False", WORKER, "--steps", "200", "--step-time", "0.05"],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    cluster.procs["msrun"] = msrun
    before = cluster.wait_running("real-msrun", 2, timeout=120)
    os.kill(before[1].pid, signal.SIGKILL)
    after = cluster.wait_for(
        "rank 1 restarted by msrun's START_WORKER_LIST",
        lambda: (r := cluster.ranks("real-msrun"))[1].restart_count == 1 and r,
        timeout=60,
    )
    assert after[1].pid != before[1].pid and after[0].pid == before[0].pid
    assert msrun.wait(timeout=120) == 0, (tmp_path / "msrun.out").read_text()[-3000:]
    assert cluster.view("real-msrun").status.state == pb.JOB_SUCCEEDED  # type: ignore[union-attr]
