"""Job identity and end, the all-in-one launcher, bounded storage and the process tree."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from recoverd.records import pb

from .cluster import WORKER, Cluster

pytestmark = pytest.mark.etcd


def _recoverd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECOVERD_")}
    return subprocess.run(
        [sys.executable, "-m", "recoverd.cli.main", *args],
        capture_output=True, text=True, timeout=timeout, env={**env, "GRPC_VERBOSITY": "ERROR"},
    )  # fmt: skip


def test_recoverd_run_exits_zero_when_every_rank_finishes(tmp_path: Path) -> None:
    proc = _recoverd(
        "run", "--job", "ok", "--nproc-per-node", "3", "--log-dir", str(tmp_path), "--",
        sys.executable, WORKER, "--steps", "5", "--step-time", "0.02",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "JOB_SUCCEEDED" in proc.stderr
    for rank in range(3):
        log = (tmp_path / f"rank{rank}.log").read_text()
        assert log.startswith("==== ") and " launch generation 0 restart 0 ====" in log
        assert f"rank {rank} done" in log


def test_recoverd_run_fails_a_crash_looping_job(tmp_path: Path) -> None:
    proc = _recoverd(
        "run", "--job", "loop", "--nproc-per-node", "2", "--log-dir", str(tmp_path), "--max-job-restarts", "2",
        "--fault-window", "0.05", "--", sys.executable, WORKER, "--fail-rank", "0",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "JOB_FAILED" in proc.stderr
    # Every attempt of rank 0 is in its one log, appended with a header line each.
    assert (tmp_path / "rank0.log").read_text().count("==== ") == 3


def test_a_crash_loop_is_spaced_out_and_its_error_shown(tmp_path: Path) -> None:
    """A rank that fails at every start (docs/adr/0046): the first restart is immediate, the next
    ones wait 1 s, then 2 s (``--crash-backoff-max 2``), each said once; the job still fails by its
    budgets, and the failure shows the script's own last line. Without the backoff the three
    restarts follow each other within about a second and nothing says so."""
    script = "import sys; print('cannot open /data/shard-7: no such file', flush=True); sys.exit(3)"
    started = time.monotonic()
    proc = _recoverd(
        "run", "--job", "spaced", "--nproc-per-node", "1", "--log-dir", str(tmp_path),
        "--strategies", "recover-in-place,exit", "--max-rank-restarts", "2", "--max-job-restarts", "1",
        "--crash-backoff-max", "2", "--fault-window", "0.05", "--independent-ranks", "--",
        sys.executable, "-c", script,
    )  # fmt: skip
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr
    waits = re.findall(r"times in a row: its command runs in (\S+)s", proc.stderr)
    assert waits == ["1", "2"], proc.stderr  # restart 1 at once; restart 2 after 1 s; the exit after 2 s
    assert "cannot open /data/shard-7: no such file" in proc.stderr
    assert (tmp_path / "rank0.log").read_text().count("==== ") == 4  # the start and three restarts
    print(f"crash loop of 4 lives with waits {waits}: job failed after {took:.1f}s")


def test_recoverd_up_prints_the_endpoint_and_stops_cleanly(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECOVERD_")}
    up = subprocess.Popen(
        [sys.executable, "-m", "recoverd.cli.main", "up"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    try:
        assert up.stdout is not None
        line = up.stdout.readline()
        assert line.startswith("recoverd control plane up; etcd at 127.0.0.1:"), line
        endpoint = line.split("etcd at ", 1)[1].split()[0]
        etcd = [c for c in psutil.Process(up.pid).children() if "etcd" in c.name()]
        assert len(etcd) == 1
        ctl = subprocess.run(
            [sys.executable, "-m", "recoverd.cli.ctl", "--etcd", endpoint, "status", "nothing"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert ctl.returncode == 1 and "no job named 'nothing'" in ctl.stderr
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=20) == 0
        assert not etcd[0].is_running()
    finally:
        if up.poll() is None:
            for child in psutil.Process(up.pid).children(recursive=True):
                child.kill()
            up.kill()
            up.wait()


def test_a_rerun_of_a_job_name_is_a_new_run(cluster: Cluster) -> None:
    cluster.coordinator()
    cluster.strategy()
    short = ("--steps", "3", "--step-time", "0.02")
    cluster.agent("again", nproc=2, worker=short)
    assert cluster.wait_exit("agent-node0") == 0
    first = cluster.view("again")
    assert first.run is not None and first.status is not None and first.status.state == pb.JOB_SUCCEEDED

    cluster.agent("again", nproc=2, worker=("--steps", "600"))
    second = cluster.wait_for(
        "a second run", lambda: (v := cluster.view("again")).run and v.run.uid != first.run.uid and v.ranks and v
    )  # type: ignore[union-attr]
    # The new run never reads the old run's records as its own; they are gone.
    assert second.status is None and not second.other_runs
    assert all(r.state == pb.RANK_RUNNING and r.restart_count == 0 for r in cluster.ranks("again").values())
    assert cluster.get(cluster.keys.status(first.run)) is None


def test_finished_jobs_are_removed_after_the_retention_period_and_events_are_capped(cluster: Cluster) -> None:
    cluster.coordinator(extra=("--retention", "1.5", "--event-cap", "6"))
    cluster.strategy()
    cluster.agent(
        "bounded",
        nproc=2,
        strategies="recover-in-place,exit",
        worker=("--steps", "15", "--step-time", "0.1", "--fail-once-rank", "1", "--fail-at", "1"),
    )
    assert cluster.wait_exit("agent-node0", timeout=30) == 0
    view = cluster.view("bounded")
    assert view.status is not None and view.status.state == pb.JOB_SUCCEEDED
    # A recovery produced more than six events; the oldest were pruned when it closed.
    assert len(cluster.events("bounded")) <= 6 + 2  # the cap, plus the job_succeeded pass
    cluster.wait_for("the finished job to be removed", lambda: cluster.view("bounded").spec is None, timeout=10)
    assert cluster.events("bounded") == []


def test_descendants_that_escape_their_group_are_killed_with_the_agent(cluster: Cluster) -> None:
    cluster.coordinator()
    cluster.strategy()
    agent = cluster.agent("escape", nproc=1, worker=("--steps", "600", "--spawn-daemon"))
    ranks = cluster.wait_running("escape", 1)

    def daemons() -> list[psutil.Process]:
        """This test's rank's daemon (a test run beside this one has daemons of its own)."""
        return [
            p
            for p in psutil.process_iter(["cmdline", "environ"])
            if "daemon of rank" in " ".join(p.info["cmdline"] or [])
            and (p.info["environ"] or {}).get("RECOVERD_PREFIX") == cluster.prefix
        ]

    daemon = cluster.wait_for("the rank's daemon", lambda: daemons())[0]
    assert os.getsid(daemon.pid) != os.getsid(ranks[0].pid)  # out of the rank's session and group
    os.kill(ranks[0].pid, signal.SIGKILL)
    # The agent is a subreaper: the orphan re-parents to it, not to init.
    cluster.wait_for("the orphan to re-parent to the agent", lambda: daemon.ppid() == agent.pid)
    time.sleep(0.2)
    assert cluster.stop("agent-node0") == 143
    assert not daemon.is_running() or daemon.status() == psutil.STATUS_ZOMBIE
