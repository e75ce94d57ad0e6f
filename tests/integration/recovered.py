"""A job with a real recovery in it, for recoverctl's tests, and recoverctl run as a subprocess.

:func:`recover_one_rank` starts the real services (coordinator, strategy selector, one agent of 4
ranks with recover-in-place,exit), SIGKILLs rank 2 and waits until it is recovered in place: every
record an operator reads (rank tables, the recovery record with its phase log, decisions, events,
history) then comes from the services themselves.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass

from recoverd.records import pb

from .cluster import Cluster
from .test_bad_input import _cli

JOB = "job-ctl"


def cli(module: str, args: list[str], timeout: float = 15) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` (``recoverd.cli.ctl`` is recoverctl), with no etcd from the environment."""
    return _cli(module, args, timeout)


@dataclass
class Recovered:
    cluster: Cluster
    before: dict[int, pb.RankStatus]
    after: dict[int, pb.RankStatus]
    epoch: int
    run: str

    def ctl(self, *args: str) -> str:
        proc = cli("recoverd.cli.ctl", ["--etcd", self.cluster.endpoint, "--prefix", self.cluster.prefix, *args])
        assert proc.returncode == 0, f"recoverctl {' '.join(args)} exited {proc.returncode}: {proc.stderr}"
        assert "Traceback" not in proc.stderr
        return proc.stdout


def wait_recovered(cluster: Cluster, job: str, recovery_id: int) -> pb.Recovery:
    """Wait until recovery ``recovery_id`` of ``job`` is DONE; return the recovery record."""
    view = cluster.wait_for(
        f"recovery {recovery_id} to finish",
        lambda: (
            (v := cluster.view(job)).recovery is not None
            and v.recovery.recovery_id == recovery_id
            and v.recovery.phase == pb.PHASE_DONE
            and v
        ),
    )
    assert view.recovery is not None
    return view.recovery


def recover_one_rank(cluster: Cluster, job: str = JOB) -> Recovered:
    """A 4-rank job (recover-in-place,exit) whose rank 2 was SIGKILLed and recovered in place."""
    cluster.coordinator()
    cluster.strategy()
    cluster.agent(job, strategies="recover-in-place,exit")
    before = cluster.wait_running(job, 4)
    os.kill(before[2].pid, signal.SIGKILL)
    recovery = wait_recovered(cluster, job, 1)
    after = cluster.wait_for(
        "rank 2 to run again",
        lambda: (r := cluster.ranks(job))[2].state == pb.RANK_RUNNING and r[2].restart_count == 1 and r,
    )
    run = cluster.view(job).run
    assert run is not None
    return Recovered(cluster, before, after, recovery.epoch, run.uid)
