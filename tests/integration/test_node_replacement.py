"""A lost node without a standing spare: the job waits for an agent to replace it and goes on.

What users run is Kubernetes: a lost pod is rescheduled, and a new agent arrives for the same node
rank under a new node name. Real etcd, the services as separate processes, real rank processes:
node-b's agent and ranks are SIGKILLed, and ``REPLACEMENT_DELAY_S`` later an agent for node rank 1
starts as node-c. The issue's figure is 20 s; ``make test`` uses a shorter delay
(``RECOVERD_TEST_REPLACEMENT_DELAY=20`` runs the issue's).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest

from recoverd.records import pb

from .cluster import ROOT, Cluster
from .test_bad_input import _cli

pytestmark = pytest.mark.etcd

#: Seconds between node-b's death and its replacement's start (the issue's 20 s with the variable).
REPLACEMENT_DELAY_S = float(os.environ.get("RECOVERD_TEST_REPLACEMENT_DELAY", "3"))
STEP_S = 0.1


def _worker(delay_s: float) -> tuple[str, ...]:
    """examples/worker.py, running long enough that the survivors still train when node-c comes."""
    return ("--steps", str(int((delay_s + 15) / STEP_S)), "--step-time", str(STEP_S))


def _two_nodes(
    cluster: Cluster, job: str, *, strategies: str | None, worker: Sequence[str] = (), extra: Sequence[str] = (),
    command: Sequence[str] | None = None, env: dict[str, str] | None = None,
) -> None:  # fmt: skip
    for i, node in enumerate(("node-a", "node-b")):
        cluster.agent(
            job, node, nproc=2, nnodes=2, node_rank=i, strategies=strategies, worker=tuple(worker), extra=extra,
            command=command, env=env,
        )  # fmt: skip


def _lose_node_b(cluster: Cluster, before: dict[int, pb.RankStatus]) -> list[int]:
    """SIGKILL node-b's agent, its ranks and every other process it started (a warm-start server):
    the whole pod is gone. Their pids, for _reap."""
    agent = psutil.Process(cluster.procs["agent-node-b"].pid)
    pids = sorted({before[2].pid, before[3].pid} | {p.pid for p in agent.children(recursive=True)})
    cluster.kill("agent-node-b")
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def _reap(pids: list[int]) -> None:
    """The killed processes were re-parented to the test session (a subreaper): reap them."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _status(cluster: Cluster, job: str) -> str:
    return _cli("recoverd.cli.ctl", ["--etcd", cluster.endpoint, "--prefix", cluster.prefix, "status", job]).stdout


def _waiting(cluster: Cluster, job: str) -> bool:
    view = cluster.view(job)
    return (
        view.recovery is not None
        and view.recovery.phase == pb.PHASE_DECIDING
        and any(e.reason == "replacement_wait" for e in cluster.events(job))
    )


def _wait_then_replace(cluster: Cluster, job: str, delay_s: float, **agent: object) -> None:
    """Wait until the recovery waits for a replacement, check what status shows meanwhile, let
    ``delay_s`` pass since node-b was lost, then start node-c for node rank 1."""
    lost_at = time.monotonic()
    cluster.wait_for("the recovery to wait for node-b's replacement", lambda: _waiting(cluster, job), timeout=30)
    shown = _status(cluster, job)
    lost_lines = [line for line in shown.splitlines() if "node-b (lost)" in line]
    assert len(lost_lines) == 2 and all(" LOST " in line and "RUNNING" not in line for line in lost_lines), shown
    time.sleep(max(0.0, lost_at + delay_s - time.monotonic()))
    cluster.agent(job, "node-c", nproc=2, nnodes=2, node_rank=1, **agent)  # type: ignore[arg-type]


def _replace_node_b_and_finish(
    cluster: Cluster, job: str, before: dict[int, pb.RankStatus], delay_s: float, **agent: object
) -> None:
    """Lose node-b, replace it after ``delay_s`` (``agent``: node-c's options) and wait for both
    agents to end the job with 0; node-b's processes are reaped whatever happens."""
    pids = _lose_node_b(cluster, before)
    try:
        _wait_then_replace(cluster, job, delay_s, **agent)
        assert cluster.wait_exit("agent-node-a", timeout=180 + delay_s) == 0, cluster.logs()
        assert cluster.wait_exit("agent-node-c", timeout=60) == 0, cluster.logs()
    finally:
        _reap(pids)


def _print_timeline(cluster: Cluster, job: str, what: str) -> None:
    """Measured, not asserted: when the recovery opened, waited, decided and ended (event times)."""
    first: dict[str, float] = {}
    for e in cluster.events(job):
        at = e.at.seconds + e.at.nanos / 1e9
        if e.reason in ("recovery_opened", "replacement_wait", "decision", "recovery_done", "job_succeeded"):
            first.setdefault(e.reason, at)
            if e.reason in ("decision", "recovery_done"):
                first[e.reason] = at  # the last one: the decision that placed the ranks
    start = first.get("recovery_opened", 0.0)
    print(f"{what}: " + ", ".join(f"{k} +{v - start:.2f}s" for k, v in sorted(first.items(), key=lambda kv: kv[1])))


def _outcomes(cluster: Cluster, job: str) -> list[tuple[str, bool]]:
    history = cluster.view(job).history
    return [(o.strategy, o.ok) for o in history.outcomes] if history is not None else []


@pytest.mark.timeout(180)
@pytest.mark.parametrize("delay_s", [REPLACEMENT_DELAY_S])
def test_a_lost_node_of_a_plain_script_is_replaced_and_the_job_spends_one_restart(
    cluster: Cluster, delay_s: float
) -> None:
    """The default policy (`exit` only) and a restart budget of 1: the one node loss restarts every
    rank once, node-b's ranks on node-c, and the job ends 0. Before, the `exit` waited for node-b's
    dead agent and the job failed."""
    job = "job-replace-exit"
    cluster.coordinator()
    cluster.strategy()
    worker = _worker(delay_s)
    _two_nodes(cluster, job, strategies=None, worker=worker, extra=("--max-job-restarts", "1"))
    before = cluster.wait_running(job, 4)
    pids = _lose_node_b(cluster, before)
    try:
        _wait_then_replace(cluster, job, delay_s, worker=worker, extra=("--max-job-restarts", "1"))
        assert cluster.wait_exit("agent-node-a", timeout=60 + delay_s) == 0, cluster.logs()
        assert cluster.wait_exit("agent-node-c", timeout=30) == 0, cluster.logs()
    finally:
        _reap(pids)
    view = cluster.view(job)
    assert view.status is not None and view.status.state == pb.JOB_SUCCEEDED
    _print_timeline(cluster, job, f"plain worker, exit, replacement after {delay_s:g}s")
    assert _outcomes(cluster, job) == [("exit", True)], "one incident, one unit of the restart budget"
    after = cluster.ranks(job)
    assert {r: s.node for r, s in after.items()} == {0: "node-a", 1: "node-a", 2: "node-c", 3: "node-c"}
    assert all(after[r].restart_count == 1 and after[r].pid != before[r].pid for r in range(4)), after
    decision = view.decisions[max(view.decisions)]
    assert decision.strategy == "exit" and [(m.from_node, m.to_node) for m in decision.moves] == [("node-b", "node-c")]
    reasons = [e.message for e in cluster.events(job) if e.reason == "replacement_wait"]
    assert len(reasons) == 1 and "node(s) ['node-b'] lost with no spare" in reasons[0], reasons


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("delay_s", [REPLACEMENT_DELAY_S])
def test_with_recover_allowed_the_survivors_keep_their_processes(cluster: Cluster, delay_s: float) -> None:
    job = "job-replace-recover"
    strategies = "recover-in-place,recover,exit"
    cluster.coordinator()
    cluster.strategy()
    worker = _worker(delay_s)
    _two_nodes(cluster, job, strategies=strategies, worker=worker)
    before = cluster.wait_running(job, 4)
    pids = _lose_node_b(cluster, before)
    try:
        _wait_then_replace(cluster, job, delay_s, strategies=strategies, worker=worker)
        assert cluster.wait_exit("agent-node-a", timeout=60 + delay_s) == 0, cluster.logs()
        assert cluster.wait_exit("agent-node-c", timeout=30) == 0, cluster.logs()
    finally:
        _reap(pids)
    _print_timeline(cluster, job, f"plain worker, recover, replacement after {delay_s:g}s")
    assert _outcomes(cluster, job) == [("recover", True)]
    after = cluster.ranks(job)
    assert all(after[r].pid == before[r].pid and after[r].restart_count == 0 for r in (0, 1)), "survivors kept"
    assert all(after[r].node == "node-c" and after[r].restart_count == 1 for r in (2, 3))
    spare = cluster.view(job).nodes.get("node-c")
    assert spare is None or (not spare.is_spare and spare.node_rank == 1)


@pytest.mark.slow
def test_a_plain_scripts_lost_node_moves_to_a_standing_spare(cluster: Cluster) -> None:
    """The default policy (`exit` only) and a `--spare`: no wait; every rank restarts, node-b's on
    the spare. Before, the `exit` waited for node-b's dead agent and the job failed."""
    job = "job-replace-spare"
    cluster.coordinator()
    cluster.strategy()
    worker = _worker(0)
    _two_nodes(cluster, job, strategies=None, worker=worker)
    before = cluster.wait_running(job, 4)
    cluster.agent(job, "spare-0", nproc=2, nnodes=2, worker=worker, extra=("--spare",))
    cluster.wait_for("the spare to register", lambda: "spare-0" in cluster.view(job).nodes)
    pids = _lose_node_b(cluster, before)
    try:
        assert cluster.wait_exit("agent-node-a", timeout=60) == 0, cluster.logs()
        assert cluster.wait_exit("agent-spare-0", timeout=30) == 0, cluster.logs()
    finally:
        _reap(pids)
    _print_timeline(cluster, job, "plain worker, exit, standing spare")
    assert _outcomes(cluster, job) == [("exit", True)]
    after = cluster.ranks(job)
    assert {r: s.node for r, s in after.items()} == {0: "node-a", 1: "node-a", 2: "spare-0", 3: "spare-0"}
    assert not any(e.reason == "replacement_wait" for e in cluster.events(job))


@pytest.mark.slow
def test_no_replacement_within_the_wait_fails_the_job_saying_why(cluster: Cluster, tmp_path: Path) -> None:
    """The wait is bounded (the policy's deadlines.replacement): with nobody coming, the job fails
    at its end, not at an `exit` that waits for the dead agent."""
    job = "job-replace-none"
    policy = tmp_path / "policy.yaml"
    policy.write_text("deadlines: {replacement: 2}\n")
    cluster.coordinator()
    cluster.strategy()
    _two_nodes(cluster, job, strategies=None, worker=_worker(30), extra=("--policy", str(policy)))
    before = cluster.wait_running(job, 4)
    pids = _lose_node_b(cluster, before)
    try:
        assert cluster.wait_exit("agent-node-a", timeout=60) == 1, cluster.logs()
    finally:
        _reap(pids)
    view = cluster.view(job)
    assert view.status is not None and view.status.state == pb.JOB_FAILED
    assert "node(s) ['node-b'] lost and no agent replaced them" in view.status.reason, view.status
    assert _outcomes(cluster, job) == [], "nothing was restarted"


def test_an_agent_for_a_live_nodes_rank_is_still_refused(cluster: Cluster) -> None:
    job = "job-replace-dup"
    cluster.coordinator()
    _two_nodes(cluster, job, strategies=None, worker=_worker(30))
    cluster.wait_running(job, 4)
    dup = cluster.agent(job, "node-c", nproc=2, nnodes=2, node_rank=1, worker=_worker(30))
    assert dup.wait(timeout=30) != 0
    assert (
        "node rank 1 of job job-replace-dup is already taken by node node-b"
        in Path(
            dup.log_path  # type: ignore[attr-defined]
        ).read_text()
    )


def test_the_replacement_wait_flag_is_the_job_s_policy(cluster: Cluster) -> None:
    """``--replacement-wait`` is what a policy file's ``deadlines.replacement`` is: stored in the
    job's policy by the agent that creates it (the selector reads it from there)."""
    job = "job-replace-flag"
    cluster.agent(job, nproc=1, worker=_worker(30), extra=("--replacement-wait", "45"))
    cluster.wait_running(job, 1)
    spec = cluster.view(job).spec
    assert spec is not None and spec.policy.deadlines.replacement_s == 45.0


# ---------------------------------------------------------------- PyTorch ranks

PLAIN_DDP = str(ROOT / "examples" / "plain_ddp.py")
DDP = str(ROOT / "examples" / "ddp_train.py")


def _torch_log(cluster: Cluster, job: str, node: str, rank: int) -> str:
    path = Path(cluster.workdir) / f"logs-{job}-{node}" / f"rank{rank}.log"
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.mark.slow
@pytest.mark.timeout(300)  # four torch ranks start twice on 2 shared cores
@pytest.mark.parametrize("delay_s", [REPLACEMENT_DELAY_S])
def test_a_plain_ddp_script_restarts_on_the_new_set_of_nodes(cluster: Cluster, delay_s: float) -> None:
    """examples/plain_ddp.py (no recoverd code): its survivors cannot take new peers in, so the job
    restarts every rank (`exit`, the default policy), node-b's on node-c, from the checkpoint."""
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install -r requirements-torch.txt)")
    job = "job-replace-ddp"
    ckpt = Path(cluster.workdir) / "ckpt"
    command = (sys.executable, PLAIN_DDP, "--steps", "400", "--step-sleep", "0.05", "--ckpt-dir", str(ckpt))
    cluster.coordinator()
    cluster.strategy()
    _two_nodes(cluster, job, strategies=None, command=command)
    before = cluster.wait_running(job, 4, timeout=120)
    cluster.wait_for("step 20", lambda: "rank 3 step 20 done" in _torch_log(cluster, job, "node-b", 3), timeout=120)
    _replace_node_b_and_finish(cluster, job, before, delay_s, command=command)
    _print_timeline(cluster, job, f"plain_ddp.py, exit, replacement after {delay_s:g}s")
    assert _outcomes(cluster, job) == [("exit", True)]
    finals = {r: _torch_log(cluster, job, "node-a" if r < 2 else "node-c", r) for r in range(4)}
    assert all(f"rank {r} final sha256" in text for r, text in finals.items()), finals


@pytest.mark.slow
@pytest.mark.timeout(300)  # four torch ranks and two more on the replacement, on 2 shared cores
@pytest.mark.parametrize("delay_s", [REPLACEMENT_DELAY_S])
def test_resilient_trainer_survivors_keep_their_pids_and_take_the_new_ranks_in(
    cluster: Cluster, delay_s: float
) -> None:
    """examples/ddp_train.py (a ResilientTrainer): with `recover` allowed, node-b's ranks start on
    node-c and join the survivors' next group generation; the survivors keep their processes."""
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install -r requirements-torch.txt)")
    job = "job-replace-trainer"
    strategies = "recover-in-place,recover,exit"
    command = (sys.executable, DDP, "--steps", "300", "--step-sleep", "0.05", "--seed", "7")
    cluster.coordinator(extra=("--recover-timeout", "60"))
    cluster.strategy()
    _two_nodes(cluster, job, strategies=strategies, command=command)
    before = cluster.wait_running(job, 4, timeout=120)
    cluster.wait_for("step 20", lambda: "rank 3 step 20 done" in _torch_log(cluster, job, "node-b", 3), timeout=120)
    _replace_node_b_and_finish(cluster, job, before, delay_s, strategies=strategies, command=command)
    _print_timeline(cluster, job, f"ResilientTrainer, recover, replacement after {delay_s:g}s")
    assert _outcomes(cluster, job) == [("recover", True)]
    after = cluster.ranks(job)
    assert all(after[r].pid == before[r].pid for r in (0, 1)), "the survivors keep their processes"
    assert all(after[r].node == "node-c" for r in (2, 3))
    finals = {r: _torch_log(cluster, job, "node-a" if r < 2 else "node-c", r) for r in range(4)}
    hashes = {line.split()[-1] for text in finals.values() for line in text.splitlines() if "final sha256" in line}
    assert len(hashes) == 1, finals


ELASTIC = str(ROOT / "examples" / "elastic_train.py")


@pytest.mark.slow
@pytest.mark.timeout(300)  # four torch ranks and two more on the replacement, on 2 shared cores
@pytest.mark.parametrize("delay_s", [REPLACEMENT_DELAY_S])
def test_a_trainer_with_recoverds_protocol_takes_the_replacement_in(cluster: Cluster, delay_s: float) -> None:
    """examples/elastic_train.py: rank 0's relay client is the job's participant and offers
    recover; node-b's ranks start on node-c, the survivors keep their pids, one budget unit."""
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install -r requirements-torch.txt)")
    job = "job-replace-protocol"
    strategies = "recover,exit"
    command = (sys.executable, ELASTIC, "--steps", "300", "--step-sleep", "0.05", "--offer", strategies)
    cluster.coordinator(extra=("--recover-timeout", "60"))
    cluster.strategy()
    _two_nodes(cluster, job, strategies=strategies, command=command)
    before = cluster.wait_running(job, 4, timeout=120)
    cluster.wait_for("rank 0 to register as the job's client", lambda: cluster.view(job).clients, timeout=120)
    cluster.wait_for("step 20", lambda: "rank 3 step 20 done" in _torch_log(cluster, job, "node-b", 3), timeout=120)
    _replace_node_b_and_finish(cluster, job, before, delay_s, strategies=strategies, command=command)
    _print_timeline(cluster, job, f"elastic_train.py (relay client), recover, replacement after {delay_s:g}s")
    assert _outcomes(cluster, job) == [("recover", True)]
    after = cluster.ranks(job)
    assert all(after[r].pid == before[r].pid for r in (0, 1)), "the survivors keep their processes"
    assert all(after[r].node == "node-c" for r in (2, 3))
