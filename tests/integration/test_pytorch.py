"""examples/ddp_train.py under recoverd: survivors keep their processes, the dead rank is replaced,
training continues from the same step, and the final parameters are bitwise those of a fault-free run.

Real etcd, the services as separate processes, 4 ranks of real PyTorch (gloo, CPU) killed with
SIGKILL at random moments (inside a step's all-reduce or between steps).
"""

from __future__ import annotations

import os
import random
import re
import signal
import time
from pathlib import Path

import pytest

from recoverd.records import pb

from . import cluster as harness
from .cluster import ROOT, Cluster
from .test_bad_input import _cli

pytest.importorskip("torch", reason="PyTorch is not installed (pip install -r requirements-torch.txt)")

pytestmark = pytest.mark.etcd

DDP = str(ROOT / "examples" / "ddp_train.py")
WORLD = 4
STEPS = 80
ARGS = ("--steps", str(STEPS), "--step-sleep", "0.01", "--seed", "7")


@pytest.fixture(autouse=True)
def _ddp_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "WORKER", DDP)


def _log(cluster: Cluster, job: str, rank: int, node: str = "node0") -> str:
    path = Path(cluster.workdir) / f"logs-{job}-{node}" / f"rank{rank}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _done_steps(text: str, rank: int) -> list[int]:
    return [int(s) for s in re.findall(rf"^rank {rank} step (\d+) done", text, flags=re.M)]


def _not_steps(text: str) -> str:
    """A rank's log without its per-step lines: what a failed assertion should show."""
    return "\n".join(line for line in text.splitlines() if not re.match(r"rank \d+ step \d+ done", line))


def _final(text: str, rank: int) -> str | None:
    found = re.search(rf"^rank {rank} final sha256 ([0-9a-f]+)", text, flags=re.M)
    return found.group(1) if found else None


def _warm_log(cluster: Cluster, job: str, node: str = "node0") -> str:
    path = Path(cluster.workdir) / f"logs-{job}-{node}" / "warm-start.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _warm_server_ready(cluster: Cluster) -> bool:
    """Whether the agent's warm-start server has said it is ready (the agent logs it once)."""
    logs = cluster.logs()
    return "warm-start server pid" in logs and " ready in " in logs


def _run(cluster: Cluster, job: str, extra: tuple[str, ...] = ()) -> None:
    cluster.agent(job, nproc=WORLD, strategies="recover-in-place,exit", worker=(*ARGS, *extra))


def _finals(cluster: Cluster, job: str) -> dict[int, str | None]:
    assert cluster.wait_exit("agent-node0", timeout=120) == 0, cluster.logs()
    return {r: _final(_log(cluster, job, r), r) for r in range(WORLD)}


def _reference(tmp_path_factory: pytest.TempPathFactory, etcd_server, extra: tuple[str, ...]) -> str:  # type: ignore[no-untyped-def]
    """The final parameters' hash of a fault-free run (every rank holds the same model)."""
    cluster = Cluster(etcd_server.endpoint, f"/ref{os.getpid()}{len(extra)}/v1", tmp_path_factory.mktemp("ref"))
    worker, harness.WORKER = harness.WORKER, DDP  # module scope: set before the autouse fixture runs
    try:
        cluster.coordinator()
        cluster.strategy()
        _run(cluster, "job-ref", extra)
        finals = _finals(cluster, "job-ref")
    finally:
        harness.WORKER = worker
        cluster.close()
    assert len(set(finals.values())) == 1 and None not in finals.values(), finals
    return str(finals[0])


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, etcd_server) -> str:  # type: ignore[no-untyped-def]
    """The fault-free hash of the trainer's flat all-reduce."""
    return _reference(tmp_path_factory, etcd_server, ())


@pytest.fixture(scope="module")
def reference_ddp(tmp_path_factory: pytest.TempPathFactory, etcd_server) -> str:  # type: ignore[no-untyped-def]
    """The fault-free hash with torch's DistributedDataParallel (``--ddp``: its hook averages each
    bucket before the sum, so the bits differ from the flat all-reduce's)."""
    return _reference(tmp_path_factory, etcd_server, ("--ddp",))


# One run per victim, each at a random step and moment: rank 1 with the trainer's flat all-reduce,
# rank 0 with the user's DistributedDataParallel (rebuilt on every generation). The suite's time
# budget (6 minutes, docs/adr/0028) paid for two more of the same before.
@pytest.mark.parametrize(
    ("victim", "ddp"), [(1, False), pytest.param(0, True, marks=pytest.mark.slow)], ids=["rank1", "rank0-ddp"]
)
def test_a_killed_rank_is_replaced_and_the_survivors_carry_on(
    cluster: Cluster, request: pytest.FixtureRequest, victim: int, ddp: bool
) -> None:
    reference = request.getfixturevalue("reference_ddp" if ddp else "reference")
    job = f"job-ddp-{victim}-{random.randrange(10**6)}"
    cluster.coordinator()
    cluster.strategy()
    _run(cluster, job, ("--ddp",) if ddp else ())
    before = cluster.wait_running(job, WORLD, timeout=60)
    # The replacement must be forked from the warm-start server, so the kill waits for it: the
    # server imports torch beside four ranks that do the same, and under load it can be ready
    # only after training has begun (make test in CI killed rank 1 before it was).
    cluster.wait_for("the warm-start server", lambda: _warm_server_ready(cluster), timeout=120)
    # Its standby (the replacement to be) makes its rank's etcd store once it has waited a while.
    cluster.wait_for("the standby's store", lambda: "etcd store made ahead" in _warm_log(cluster, job), timeout=60)
    # Then somewhere in the first half of what is left, at a random moment within a step.
    now = max(_done_steps(_log(cluster, job, victim), victim), default=-1)
    target = random.randrange(max(5, now + 2), max(STEPS // 2, now + 3))
    assert target < STEPS - 5, f"training ran to step {now} before the warm-start server was ready"
    cluster.wait_for(f"step {target}", lambda: target in _done_steps(_log(cluster, job, victim), victim), timeout=60)
    time.sleep(random.uniform(0.0, 0.02))
    os.kill(before[victim].pid, signal.SIGKILL)

    finals = _finals(cluster, job)
    after = cluster.ranks(job)
    survivors = [r for r in range(WORLD) if r != victim]
    assert all(after[r].pid == before[r].pid and after[r].restart_count == 0 for r in survivors), "survivors kept"
    assert after[victim].restart_count == 1 and after[victim].pid != before[victim].pid
    # Continued from the same step: no survivor went back to step 0, every step was completed.
    for r in survivors:
        text = _log(cluster, job, r)
        resumed = [int(s) for s in re.findall(r"resuming at step (\d+)", text)]
        assert len(resumed) == 2 and resumed[0] == 0 and resumed[1] >= target, (r, resumed)
        assert set(_done_steps(text, r)) == set(range(STEPS))
    # Bitwise the same model as the fault-free run, in every rank (the replacement included).
    assert finals == dict.fromkeys(range(WORLD), reference)
    # The replacement was forked from the warm-start server (torch imported there beforehand), and
    # it took the standby's etcd store (connected and in step with the rendezvous keys already).
    assert "(warm start) ====" in _log(cluster, job, victim)
    assert "(start; etcd store made ahead)" in _log(cluster, job, victim)
    view = cluster.view(job)
    assert [(o.strategy, o.ok) for o in view.history.outcomes] == [("recover-in-place", True)]  # type: ignore[union-attr]


@pytest.mark.slow
# Through the agents (docs/adr/0036) recoverd decides what a RetryableFault gets: `retry` where the
# policy allows it (no process restarts), else recover-in-place (the faulty rank, waiting for the
# decision, is restarted and healed by its peers). Either way the model is the fault-free run's.
@pytest.mark.parametrize("policy", ["retry,recover-in-place,exit", "recover-in-place,exit"], ids=["retry", "no-retry"])
def test_a_retryable_fault_through_the_agents_gets_what_recoverd_decides(
    cluster: Cluster, reference: str, policy: str
) -> None:
    job = f"job-ddp-agent-{policy.split(',')[0]}"
    cluster.coordinator()
    cluster.strategy()
    worker = (*ARGS, "--retry-at-step", "20", "--retry-rank", "2", "--via-agent")
    cluster.agent(job, nproc=WORLD, strategies=policy, worker=worker)
    before = cluster.wait_running(job, WORLD, timeout=60)
    finals = _finals(cluster, job)
    after = cluster.ranks(job)
    view = cluster.view(job)
    logs = {r: _log(cluster, job, r) for r in range(WORLD)}
    story = "\n".join(f"--- rank {r}:\n{_not_steps(text)}" for r, text in logs.items()) + "\n" + cluster.logs()
    assert not view.clients  # the agents answered for the ranks
    if policy.startswith("retry"):
        assert [(o.strategy, o.ok) for o in view.history.outcomes] == [("retry", True)], story  # type: ignore[union-attr]
        assert {r: s.pid for r, s in after.items()} == {r: s.pid for r, s in before.items()}, story
        assert all(s.restart_count == 0 for s in after.values())
        decided = re.findall(r"recoverd decided retry after (\d+) ms", logs[2])
        assert decided, story
        print("fault -> recoverd's retry reached the faulty rank (ms):", decided[0])  # measured, not asserted
        for r, text in logs.items():
            assert _done_steps(text, r).count(20) == 1 or r == 2, story  # step 20 applied once
    else:
        assert [(o.strategy, o.ok) for o in view.history.outcomes] == [("recover-in-place", True)], story  # type: ignore[union-attr]
        assert after[2].restart_count == 1 and after[2].pid != before[2].pid, story
        assert all(after[r].pid == before[r].pid for r in (0, 1, 3)), story
    assert finals == dict.fromkeys(range(WORLD), reference), story


@pytest.mark.slow
def test_retry_rolls_the_step_back_in_every_rank_without_a_restart(cluster: Cluster, reference: str) -> None:
    job = "job-ddp-retry"
    cluster.coordinator()
    cluster.strategy()
    _run(cluster, job, ("--retry-at-step", "20", "--retry-rank", "2"))
    before = cluster.wait_running(job, WORLD, timeout=60)
    finals = _finals(cluster, job)
    after = cluster.ranks(job)
    assert {r: s.pid for r, s in after.items()} == {r: s.pid for r, s in before.items()}
    assert all(s.restart_count == 0 for s in after.values())
    logs = {r: _log(cluster, job, r) for r in range(WORLD)}
    story = "\n".join(f"--- rank {r}:\n{_not_steps(text)}" for r, text in logs.items()) + "\n" + cluster.logs()
    assert "retryable fault in step 20" in logs[2], story
    # Every rank resumes at the same step after the retry: 20, or 19 when a peer's step-19 all-reduce
    # was still finishing as rank 2 aborted the generation (a ring all-reduce completes on one rank
    # before another). That peer is then at 19, the lowest step, and the others roll back to it
    # (the trainer's rule). Under load this happens; insisting on 20 made this test fail in CI.
    resumed = {r: [int(s) for s in re.findall(r"resuming at step (\d+)", text)] for r, text in logs.items()}
    assert all(steps[:1] == [0] and len(steps) >= 2 for steps in resumed.values()), story
    agreed = {steps[-1] for steps in resumed.values()}
    assert len(agreed) == 1 and agreed <= {19, 20}, story
    for r, text in logs.items():
        assert _done_steps(text, r).count(20) == 1 or r == 2, story  # step 20 applied once
    assert finals == dict.fromkeys(range(WORLD), reference)
    assert cluster.view(job).recovery is None, "no process-level recovery was needed"
    assert pb.RANK_SUCCEEDED == after[0].state


@pytest.mark.slow
def test_a_warm_spare_becomes_the_replacement(cluster: Cluster, reference: str) -> None:
    job = "job-ddp-warm"
    cluster.coordinator()
    cluster.strategy()
    cluster.agent(
        job, "node1", nproc=WORLD, strategies="recover-in-place,exit", worker=ARGS, extra=("--warm-spares", "1")
    )
    before = cluster.wait_running(job, WORLD, timeout=60)
    spares = cluster.wait_for(
        "a warm spare", lambda: list(cluster.view(job).ranks["node1"].warm_spare_pids), timeout=60
    )
    shown = _cli("recoverd.cli.ctl", ["--etcd", cluster.endpoint, "--prefix", cluster.prefix, "status", job]).stdout
    assert f"warm spare processes waiting for a rank: node1: pids [{spares[0]}]" in shown
    # The first start forked every rank from the warm-start server (ADR 0039) and took no spare:
    # the spare, started before that wait, is kept for a restart.
    assert spares[0] not in {p.pid for p in before.values()}
    assert all("(warm start) ====" in _log(cluster, job, r, "node1") for r in range(WORLD))
    target = 10
    cluster.wait_for(f"step {target}", lambda: target in _done_steps(_log(cluster, job, 1, "node1"), 1), timeout=60)
    os.kill(before[1].pid, signal.SIGKILL)

    assert cluster.wait_exit("agent-node1", timeout=120) == 0, cluster.logs()
    after = cluster.ranks(job)
    # The replacement is the process that was waiting, torch imported: no interpreter, no import.
    assert after[1].pid == spares[0] and after[1].restart_count == 1
    text = _log(cluster, job, 1, "node1")
    assert f"warm spare pid {spares[0]} is rank 1" in text and "framework imported beforehand" in text
    assert all(after[r].pid == before[r].pid for r in (0, 2, 3))
    assert {r: _final(_log(cluster, job, r, "node1"), r) for r in range(WORLD)} == dict.fromkeys(
        range(WORLD), reference
    )
