"""The job policy end to end: ``recoverd agent --policy FILE`` stores it, ``recoverctl policy set``
changes it (a bad file changes nothing), and a policy deadline drives the coordinator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from recoverd.records import decode, pb, ts_to_s

from .cluster import Cluster

pytestmark = pytest.mark.etcd


def _ctl(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RECOVERD_ETCD", "RECOVERD_PREFIX")}
    return subprocess.run(
        [sys.executable, "-m", "recoverd.cli.ctl", "--etcd", cluster.endpoint, "--prefix", cluster.prefix, *args],
        capture_output=True,
        text=True,
        timeout=15,
        env={**env, "GRPC_VERBOSITY": "ERROR"},
    )


def _spec(cluster: Cluster, job: str) -> tuple[bytes, pb.JobSpec]:
    raw = cluster.get(cluster.keys.job_spec(job))
    assert raw is not None
    return raw, decode(pb.JobSpec, raw)


def test_agent_stores_the_policy_and_recoverctl_changes_it(cluster: Cluster, tmp_path: Path) -> None:
    job = "job-policy"
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "strategies: [recover-in-place]\n"
        "deadlines: {decide: 5, recover: 30}\n"
        "budgets: {recover-in-place: {max: 2, window_s: 3600}}\n"
        "spares: [spare0]\n"
        "allow_rank0_in_place: false\n"
    )
    cluster.coordinator()
    cluster.strategy()
    cluster.agent(job, nproc=2, extra=["--policy", str(policy)])
    cluster.wait_running(job, 2)

    _, spec = _spec(cluster, job)
    assert list(spec.policy.strategies) == ["recover-in-place", "exit"]
    assert spec.policy.deadlines.decide_s == 5 and spec.policy.deadlines.recover_s == 30
    assert spec.policy.max_rank_restarts == 2 and spec.policy.budgets["recover-in-place"].window_s == 3600
    assert list(spec.policy.spares) == ["spare0"] and spec.policy.allow_rank0_in_place is False

    shown = _ctl(cluster, "policy", "show", job, "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["deadlines"] == {"decide": 5.0, "recover": 30.0}
    assert data["allow_rank0_in_place"] is False

    # A bad file: a clear error, exit 2, nothing written.
    before, _ = _spec(cluster, job)
    bad = tmp_path / "bad.yaml"
    bad.write_text("deadlines: {decide: -1}\n")
    proc = _ctl(cluster, "policy", "set", job, str(bad))
    assert proc.returncode == 2
    assert "deadlines.decide: -1 is not valid; expected a positive number of seconds" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert _spec(cluster, job)[0] == before

    # A good one replaces the policy; what it does not set keeps the strategies.
    new = tmp_path / "new.yaml"
    new.write_text("deadlines: {decide: 0.5}\nbudgets: {exit: {max: 7}}\n")
    proc = _ctl(cluster, "policy", "set", job, str(new))
    assert proc.returncode == 0, proc.stderr
    _, spec = _spec(cluster, job)
    assert list(spec.policy.strategies) == ["recover-in-place", "exit"]
    assert spec.policy.deadlines.decide_s == 0.5 and spec.policy.deadlines.recover_s == 0
    assert spec.policy.max_job_restarts == 7 and spec.policy.allow_rank0_in_place is True
    assert list(spec.policy.spares) == []
    shown = _ctl(cluster, "policy", "show", job)
    assert shown.returncode == 0, shown.stderr
    assert yaml.safe_load(shown.stdout)["deadlines"] == {"decide": 0.5}

    assert _ctl(cluster, "policy", "set", "no-such-job", str(new)).returncode == 1


def test_a_bad_policy_file_refuses_to_start(cluster: Cluster, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("strategies: [reboot]\n")
    proc = cluster.agent("job-badpolicy", nproc=1, extra=["--policy", str(bad)])
    assert proc.wait(timeout=30) == 2
    log = Path(proc.log_path).read_text()  # type: ignore[attr-defined]
    assert "strategies: 'reboot' is not valid; allowed: retry, recover-in-place" in log
    assert cluster.get(cluster.keys.job_spec("job-badpolicy")) is None


def test_a_policy_deadline_makes_the_coordinator_apply_exit(cluster: Cluster, tmp_path: Path) -> None:
    """No strategy service: the job's decide deadline (0.5 s, the coordinator's is 60 s) applies exit."""
    job = "job-deadline"
    policy = tmp_path / "policy.yaml"
    policy.write_text("strategies: [recover-in-place]\ndeadlines: {decide: 0.5}\n")
    cluster.coordinator()
    cluster.agent(job, nproc=2, extra=["--policy", str(policy)])
    before = cluster.wait_running(job, 2)

    os.kill(before[1].pid, signal.SIGKILL)
    after = cluster.wait_for(
        "every rank to be restarted by exit",
        lambda: (
            (r := cluster.ranks(job))
            and all(x.restart_count == 1 and x.state == pb.RANK_RUNNING for x in r.values())
            and r
        ),
        timeout=20,
    )
    assert all(after[r].pid != before[r].pid for r in (0, 1))
    view = cluster.view(job)
    assert view.recovery is not None and view.recovery.strategy == "exit"
    log = [(e.phase, ts_to_s(e.at)) for e in view.recovery.phase_log]
    deciding = next(at for phase, at in log if phase == pb.PHASE_DECIDING)
    recovering = next(at for phase, at in log if phase == pb.PHASE_RECOVERING and at >= deciding)
    assert 0.45 <= recovering - deciding < 5.0, log


def test_an_agent_naming_no_strategies_joins_whatever_the_stored_policy_is(cluster: Cluster) -> None:
    cluster.coordinator()
    cluster.agent("job-join", "node-a", nproc=1, nnodes=2, node_rank=0, strategies="recover-in-place,exit")
    cluster.wait_for("node-a registered", lambda: "node-a" in cluster.view("job-join").nodes)
    cluster.agent("job-join", "node-b", nproc=1, nnodes=2, node_rank=1)  # no --strategies: takes the job's
    cluster.wait_for("node-b registered", lambda: "node-b" in cluster.view("job-join").nodes)
    cluster.agent("job-join", "node-c", nproc=1, nnodes=2, node_rank=1, strategies="exit")
    assert cluster.wait_exit("agent-node-c") == 2  # a different list, named explicitly: refused
    log = cluster.procs["agent-node-c"].log_path.read_text()  # type: ignore[attr-defined]
    assert "strategies exit != recover-in-place,exit" in log
