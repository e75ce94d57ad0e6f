"""MSRunPlugin driven the way msrun drives it: through the port of msrun's ``_ProcessManager``.

``tests/msrun_port/fake_msrun.py`` is msrun's main with the same plugin discovery (``MS_ENABLE_TFT``,
``taskd.api`` first, then ``taskd.python.framework.agent.ms_mgr.msrun_plugin.MSRunPlugin``) and the
same four callbacks, bugs included; the plugin under test is the one the ``recoverd`` distribution
ships. The services run as real processes against the real etcd.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from recoverd.records import pb

from .cluster import ROOT, Cluster

pytestmark = pytest.mark.etcd

WORKER = str(ROOT / "tests" / "msrun_port" / "trivial_worker.py")


def _msrun(
    cluster: Cluster, job: str, workers: int, *worker_args: str, strategies: str | None = None, **env: str
) -> subprocess.Popen[bytes]:
    log_dir = cluster.workdir / f"msrun-{job}"
    log_dir.mkdir()
    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RECOVERD_", "MS_"))},
        "MS_ENABLE_TFT": "{ARF:1}",
        "RECOVERD_ETCD": cluster.endpoint,
        "RECOVERD_PREFIX": cluster.prefix,
        "RECOVERD_JOB": job,
        "RECOVERD_AGENT_LEASE_TTL": "1",
        "RECOVERD_STOP_GRACE_S": "1",
        "MSRUN_TEST_SCHED_S": "60",
        "MSRUN_TEST_MARKER_DIR": str(log_dir),
        **env,
    }
    if strategies:
        environ["RECOVERD_STRATEGIES"] = strategies
    argv = [sys.executable, "-m", "tests.msrun_port.fake_msrun", "--worker_num", str(workers), "--local_worker_num",
            str(workers), "--master_port", "0", "--log_dir", str(log_dir), WORKER, *worker_args]  # fmt: skip
    out = open(cluster.workdir / f"msrun-{job}.log", "wb")
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=environ, cwd=ROOT)
    out.close()
    cluster.procs[f"msrun-{job}"] = proc
    return proc


def _descendants(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_a_killed_worker_alone_is_restarted_and_msrun_ends_with_zero(cluster: Cluster) -> None:
    cluster.coordinator()
    cluster.strategy()
    msrun = _msrun(cluster, "ms-rip", 3, "--steps", "60", "--step-time", "0.05", strategies="recover-in-place,exit")
    before = cluster.wait_running("ms-rip", 3)
    schedulers = [p for p in _descendants(msrun) if p.environ().get("MS_ROLE") == "MS_SCHED"]
    assert len(schedulers) == 1  # msrun's scheduler runs the script too, and is never a rank

    os.kill(before[1].pid, signal.SIGKILL)
    after = cluster.wait_for(
        "rank 1 restarted through START_WORKER_LIST",
        lambda: (r := cluster.ranks("ms-rip"))[1].restart_count == 1 and r[1].state == pb.RANK_RUNNING and r,
    )
    assert after[1].pid != before[1].pid
    assert after[0].pid == before[0].pid and after[2].pid == before[2].pid
    assert psutil.Process(after[1].pid).environ()["RECOVERD_RESTART_COUNT"] == "1"
    recovery = cluster.view("ms-rip").recovery
    assert recovery is not None and recovery.strategy == "recover-in-place"
    assert [(f.rank, f.detail) for f in recovery.faults] == [(1, f"pid {before[1].pid} failed (exit status unknown)")]

    assert msrun.wait(timeout=30) == 0  # every rank finished 0: the plugin ends msrun with 0
    assert cluster.view("ms-rip").status.state == pb.JOB_SUCCEEDED  # type: ignore[union-attr]
    assert not any(p.is_running() for p in schedulers)  # nothing left behind, scheduler included


def test_every_worker_finishing_zero_ends_msrun_with_zero(cluster: Cluster) -> None:
    cluster.coordinator()
    cluster.strategy()
    msrun = _msrun(cluster, "ms-ok", 2, "--steps", "5", "--step-time", "0.02")
    assert msrun.wait(timeout=30) == 0
    ranks = cluster.ranks("ms-ok")
    assert sorted(ranks) == [0, 1] and all(r.state == pb.RANK_SUCCEEDED for r in ranks.values())


def test_an_unrecoverable_job_ends_msrun_with_one(cluster: Cluster) -> None:
    cluster.coordinator()
    cluster.strategy()
    # Every attempt of local rank 0 exits 3 (a fresh marker dir per attempt is not kept: the worker
    # fails only on its first attempt, so kill it again each time it comes back instead).
    msrun = _msrun(cluster, "ms-fail", 2, "--steps", "600", "--step-time", "0.05", strategies="exit")
    cluster.wait_running("ms-fail", 2)
    deadline = time.monotonic() + 40
    killed = 0
    while msrun.poll() is None and time.monotonic() < deadline:
        ranks = cluster.ranks("ms-fail")
        rank0 = ranks.get(0)
        if rank0 is not None and rank0.state == pb.RANK_RUNNING and rank0.restart_count == killed:
            os.kill(rank0.pid, signal.SIGKILL)
            killed += 1
        time.sleep(0.05)
    assert msrun.wait(timeout=10) == 1
    view = cluster.view("ms-fail")
    assert view.status is not None and view.status.state == pb.JOB_FAILED
    assert killed == 4  # three exits (the job budget), then the job fails


def test_sigterm_stops_every_worker_and_the_scheduler(cluster: Cluster) -> None:
    cluster.coordinator()
    msrun = _msrun(cluster, "ms-term", 2, "--steps", "600", "--step-time", "0.05")
    cluster.wait_running("ms-term", 2)
    everything = _descendants(msrun)
    assert len(everything) >= 3  # two workers and the scheduler
    msrun.send_signal(signal.SIGTERM)
    assert msrun.wait(timeout=20) == 143
    _gone, alive = psutil.wait_procs(everything, timeout=5)
    assert alive == []


def test_missing_settings_end_msrun_with_a_clear_error(cluster: Cluster) -> None:
    msrun = _msrun(cluster, "ms-noetcd", 1, "--steps", "5", RECOVERD_ETCD="", MINDX_SERVER_IP="10.0.0.1")
    assert msrun.wait(timeout=30) == 2
    log = Path(cluster.workdir / "msrun-ms-noetcd.log").read_text()
    assert "no etcd endpoint: set RECOVERD_ETCD" in log and "gateway" in log
