"""`recoverd adopt`: supervising real rank processes that were started outside recoverd."""

from __future__ import annotations

import contextlib
import os
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


def _launch_ranks(tmp_path: Path, n: int, steps: int = 600) -> subprocess.Popen[bytes]:
    """Like an upstream launch script: a shell starts the ranks in the background and waits."""
    script = "\n".join(
        f"RANK_ID={rank} RANK_SIZE={n} {sys.executable} {WORKER} --steps {steps} --step-time 0.05 &"
        for rank in range(n)
    )
    return subprocess.Popen(["bash", "-c", f"{script}\nwait"], cwd=tmp_path, stdout=subprocess.DEVNULL)


def _rank_pids(launcher: subprocess.Popen[bytes], n: int) -> list[int]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        children = psutil.Process(launcher.pid).children()
        # A just-forked child is still a copy of the shell (no RANK_ID until it execs the worker).
        envs = {c.pid: c.environ() for c in children if WORKER in " ".join(c.cmdline())}
        if len(envs) == n and all("RANK_ID" in env for env in envs.values()):
            by_rank = {int(env["RANK_ID"]): pid for pid, env in envs.items()}
            return [by_rank[r] for r in range(n)]
        time.sleep(0.02)
    raise AssertionError("the launcher did not start its ranks")


def _adopt(cluster: Cluster, job: str, pids: list[int], *extra: str) -> subprocess.Popen[bytes]:
    args = ["--job", job, "--etcd", cluster.endpoint, "--prefix", cluster.prefix, "--node", "node0",
            "--agent-lease-ttl", "1", "--vanish-grace", "0.5", "--log-dir", str(cluster.workdir / f"logs-{job}"),
            "-p", *map(str, pids), *extra]  # fmt: skip
    cluster._counter += 1
    log_path = cluster.workdir / f"adopt.{cluster._counter}.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "recoverd.cli.adopt", *args], stdout=log_file,
                                stderr=subprocess.STDOUT, cwd=cluster.workdir)  # fmt: skip
    proc.log_path = log_path  # type: ignore[attr-defined]
    cluster.procs["adopt"] = proc
    return proc


def _finish(launcher: subprocess.Popen[bytes]) -> None:
    children = psutil.Process(launcher.pid).children(recursive=True)
    for child in children:
        child.kill()
    launcher.kill()
    launcher.wait(timeout=5)
    for child in children:  # orphans re-parent to the test session (a subreaper): reap them
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child.pid, 0)


@pytest.mark.parametrize("mode", ["common", "elastic"])
def test_adopted_ranks_are_recovered_with_their_captured_command(cluster: Cluster, tmp_path: Path, mode: str) -> None:
    cluster.coordinator()
    cluster.strategy()
    launcher = _launch_ranks(tmp_path, 2)
    try:
        pids = _rank_pids(launcher, 2)
        originals = {pid: psutil.Process(pid).cmdline() for pid in pids}
        # The ranks it restarts get the job's client user, never the adopter's identity.
        password = tmp_path / "client.pw"
        password.write_text("unused: this etcd has no users\n")
        password.chmod(0o600)
        user = f"recoverd-client-adopt-{mode}"
        identity = ("--rank-etcd-user", user, "--rank-etcd-password-file", str(password))
        _adopt(cluster, f"adopt-{mode}", pids, "-r", "-m", mode, "-t", "1", *identity)
        ranks = cluster.wait_running(f"adopt-{mode}", 2)
        assert [ranks[r].pid for r in (0, 1)] == pids  # adopted, not restarted

        os.kill(pids[1], signal.SIGKILL)  # the launch script's shell reaps it: exit status unknown
        after = cluster.wait_for(
            "both ranks restarted (exit strategy)",
            lambda: (r := cluster.ranks(f"adopt-{mode}")) and all(
                x.restart_count == 1 and x.state == pb.RANK_RUNNING for x in r.values()) and r,
        )  # fmt: skip
        for rank in (0, 1):
            proc = psutil.Process(after[rank].pid)
            assert proc.ppid() == cluster.procs["adopt"].pid  # now a child of the adopting agent
            assert proc.cmdline() == originals[pids[rank]]
            assert proc.cwd() == str(tmp_path)
            assert proc.environ()["RANK_ID"] == str(rank)
            assert proc.environ()["RECOVERD_RESTART_COUNT"] == "1"
            assert (proc.environ()["RECOVERD_ETCD_USER"], proc.environ()["RECOVERD_ETCD_PASSWORD_FILE"]) == (
                user,
                str(password),
            )
        assert not psutil.pid_exists(pids[0]) or psutil.Process(pids[0]).status() == psutil.STATUS_ZOMBIE
        view = cluster.view(f"adopt-{mode}")
        assert [f.rank for f in view.recovery.faults] == [1]  # type: ignore[union-attr]
        # The launcher's SIGTERM (training finished, as upstream's script sends it) ends adopt with 0.
        assert cluster.stop("adopt") == 0
        for rank in (0, 1):
            assert not psutil.pid_exists(after[rank].pid)
    finally:
        _finish(launcher)


def test_a_job_of_adopted_ranks_that_finish_ends_with_zero(cluster: Cluster, tmp_path: Path) -> None:
    cluster.coordinator()
    cluster.strategy()
    # Ranks are the test's own children here: their zombies keep the exit status readable. They
    # start stepping only once adopt has registered (a fixed step count would race a loaded machine).
    start = tmp_path / "start"
    ranks = [
        subprocess.Popen(
            [sys.executable, WORKER, "--steps", "20", "--step-time", "0.05", "--start-file", str(start)],
            env={**os.environ, "RANK_ID": str(r)},
            stdout=subprocess.DEVNULL,
        )
        for r in range(2)
    ]
    try:
        adopt = _adopt(cluster, "adopt-done", [p.pid for p in ranks], "-r")
        cluster.wait_for("adopt to register the node", lambda: cluster.view("adopt-done").nodes)
        start.touch()
        assert adopt.wait(timeout=30) == 0
        view = cluster.view("adopt-done")
        assert view.status is not None and view.status.state == pb.JOB_SUCCEEDED
        assert view.recovery is None  # exits with status 0 are not faults
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()


def test_refuses_a_process_of_another_user_and_one_already_gone(cluster: Cluster, tmp_path: Path) -> None:
    foreign = subprocess.Popen(["sleep", "30"], user=65534)  # nobody
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        proc = _adopt(cluster, "adopt-bad", [foreign.pid])
        assert proc.wait(timeout=20) == 2
        assert "belongs to uid 65534" in proc.log_path.read_text()  # type: ignore[attr-defined]
        proc = _adopt(cluster, "adopt-bad", [gone.pid])
        assert proc.wait(timeout=20) == 2
        assert "exited before it could be adopted" in proc.log_path.read_text()  # type: ignore[attr-defined]
        assert cluster.view("adopt-bad").spec is None  # nothing was written
        assert psutil.Process(foreign.pid).is_running()  # never touched
    finally:
        foreign.kill()
        foreign.wait()
