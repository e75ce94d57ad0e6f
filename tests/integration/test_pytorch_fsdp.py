"""examples/fsdp_train.py under recoverd: a sharded model (FSDP2, HSDP 2 x 2) whose killed rank is
healed from its twin, with the survivors' processes kept, and bitwise the fault-free run's shards.

Real etcd, the services as separate processes, 4 ranks of real PyTorch (gloo, CPU) on a
replicate x shard mesh over recoverd's stable groups (issue 26, docs/adr/0047); a rank SIGKILLed at
a random step and moment (inside FSDP2's all-gathers, reduce-scatters or all-reduces, or between).
"""

from __future__ import annotations

import os
import random
import re
import signal
import sys
import time
from typing import Any

import pytest

from . import cluster as harness
from .cluster import ROOT, Cluster
from .test_bad_input import _cli
from .test_pytorch import _done_steps, _final, _log, _not_steps, _warm_log, _warm_server_ready

pytest.importorskip("torch", reason="PyTorch is not installed (pip install -r requirements-torch.txt)")

pytestmark = pytest.mark.etcd

FSDP = str(ROOT / "examples" / "fsdp_train.py")
WORLD = 4
STEPS = 60
ARGS = ("--steps", str(STEPS), "--step-sleep", "0.01", "--seed", "5")


def _twin(rank: int) -> int:
    """The rank holding the same shard in the other replica of the 2 x 2 mesh ([[0, 1], [2, 3]])."""
    return (rank + 2) % WORLD


#: Pure FSDP over 4 ranks (no twin), a copy of each shard in a peer's RAM every 10 steps.
PURE = ("--mesh", "fsdp", "--ram-copy-every", "10")


def _run(cluster: Cluster, job: str, extra: tuple[str, ...] = ()) -> None:
    command = [sys.executable, FSDP, *ARGS, *extra]
    cluster.agent(job, nproc=WORLD, strategies="recover-in-place,exit", command=command)


def _finals(cluster: Cluster, job: str) -> dict[int, str | None]:
    assert cluster.wait_exit("agent-node0", timeout=180) == 0, cluster.logs()
    return {r: _final(_log(cluster, job, r), r) for r in range(WORLD)}


def _reference(tmp_path_factory: pytest.TempPathFactory, etcd_server, extra: tuple[str, ...]) -> dict[int, str | None]:  # type: ignore[no-untyped-def]
    """Each rank's shard hash in a fault-free run."""
    name = f"fsdpref{len(extra)}"
    cluster = Cluster(etcd_server.endpoint, f"/{name}{os.getpid()}/v1", tmp_path_factory.mktemp(name))
    try:
        cluster.coordinator()
        cluster.strategy()
        _run(cluster, "job-fsdp-ref", extra)
        finals = _finals(cluster, "job-fsdp-ref")
    finally:
        cluster.close()
    assert None not in finals.values(), finals
    return finals


def _kill_at_a_random_step(
    cluster: Cluster, job: str, victim: int, first: int, last: int
) -> tuple[dict[int, Any], int]:
    """Once the job runs and the warm-start server is ready (the replacement is forked from it),
    SIGKILL ``victim`` at a random moment after a random step in [first, last). Returns the ranks
    as they were before, and that step."""
    before = cluster.wait_running(job, WORLD, timeout=60)
    cluster.wait_for("the warm-start server", lambda: _warm_server_ready(cluster), timeout=120)
    now = max(_done_steps(_log(cluster, job, victim), victim), default=-1)
    target = random.randrange(max(first, now + 2), max(last, now + 3))
    assert target < STEPS - 5, f"training ran to step {now} before the warm-start server was ready"
    cluster.wait_for(f"step {target}", lambda: target in _done_steps(_log(cluster, job, victim), victim), timeout=60)
    time.sleep(random.uniform(0.0, 0.02))
    os.kill(before[victim].pid, signal.SIGKILL)
    return before, target


def _story(victim: int, target: int, logs: dict[int, str]) -> str:
    """What a failed assertion shows: the kill, and each rank's log without its step lines."""
    return f"victim {victim} after step {target}\n" + "\n".join(
        f"--- rank {r}:\n{_not_steps(text)[-3000:]}" for r, text in logs.items()
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, etcd_server) -> dict[int, str | None]:  # type: ignore[no-untyped-def]
    """HSDP 2 x 2: twins hold the same shard, bit for bit."""
    finals = _reference(tmp_path_factory, etcd_server, ())
    assert finals[0] == finals[2] and finals[1] == finals[3] and finals[0] != finals[1], finals
    return finals


@pytest.fixture(scope="module")
def reference_pure(tmp_path_factory: pytest.TempPathFactory, etcd_server) -> dict[int, str | None]:  # type: ignore[no-untyped-def]
    """Pure FSDP: four different shards."""
    finals = _reference(tmp_path_factory, etcd_server, PURE)
    assert len(set(finals.values())) == WORLD, finals
    return finals


# One run at a random victim in make test; every victim in make test-slow.
@pytest.mark.parametrize(
    "victim",
    [pytest.param(None, id="random"), *(pytest.param(r, id=f"rank{r}", marks=pytest.mark.slow) for r in range(WORLD))],
)
@pytest.mark.timeout(300)  # the reference and the run: two 4-rank torch jobs on 2 shared cores
def test_a_killed_fsdp_rank_is_healed_from_its_twin(
    cluster: Cluster, reference: dict[int, str | None], victim: int | None
) -> None:
    victim = random.randrange(WORLD) if victim is None else victim
    job = f"job-fsdp-{victim}-{random.randrange(10**6)}"
    cluster.coordinator()
    cluster.strategy()
    _run(cluster, job)
    cluster.wait_for("the standby's store", lambda: "etcd store made ahead" in _warm_log(cluster, job), timeout=60)
    before, target = _kill_at_a_random_step(cluster, job, victim, 5, STEPS // 2)

    finals = _finals(cluster, job)
    after = cluster.ranks(job)
    logs = {r: _log(cluster, job, r) for r in range(WORLD)}
    story = _story(victim, target, logs)
    survivors = [r for r in range(WORLD) if r != victim]
    assert all(after[r].pid == before[r].pid and after[r].restart_count == 0 for r in survivors), story
    assert after[victim].restart_count == 1 and after[victim].pid != before[victim].pid, story
    for r in survivors:
        resumed = [int(s) for s in re.findall(r"resuming at step (\d+)", logs[r])]
        assert len(resumed) == 2 and resumed[0] == 0 and resumed[1] >= target, (r, resumed, story)
        assert set(_done_steps(logs[r], r)) == set(range(STEPS)), story
    # The replacement took its shard from its twin, not from a checkpoint.
    assert f"with the shard of rank {_twin(victim)} (its twin)" in logs[victim], story
    # Bitwise the fault-free run's shards, in every rank (the replacement included).
    assert finals == reference, story
    assert "(warm start) ====" in logs[victim], story
    view = cluster.view(job)
    assert [(o.strategy, o.ok) for o in view.history.outcomes] == [("recover-in-place", True)], story  # type: ignore[union-attr]


_ = harness  # the cluster fixture's module


@pytest.mark.slow  # two 4-rank jobs (the reference and the run): make test-slow
@pytest.mark.timeout(300)  # two 4-rank torch jobs on 2 shared cores
def test_a_killed_pure_fsdp_rank_is_restored_from_a_peer_s_ram_copy(
    cluster: Cluster, reference_pure: dict[int, str | None]
) -> None:
    """No twin: every rank goes back to the last copy step, the replacement takes its shard from
    the RAM of the rank holding its copy (rank + 1), and the steps since are run again; no disk."""
    victim = random.randrange(WORLD)
    job = f"job-fsdp-pure-{victim}-{random.randrange(10**6)}"
    cluster.coordinator()
    cluster.strategy()
    _run(cluster, job, PURE)
    before, target = _kill_at_a_random_step(cluster, job, victim, 12, STEPS // 2 + 5)

    finals = _finals(cluster, job)
    after = cluster.ranks(job)
    logs = {r: _log(cluster, job, r) for r in range(WORLD)}
    story = _story(victim, target, logs)
    survivors = [r for r in range(WORLD) if r != victim]
    assert all(after[r].pid == before[r].pid and after[r].restart_count == 0 for r in survivors), story
    assert after[victim].restart_count == 1, story
    restored = re.findall(
        r"resuming at step (\d+) with its shard as of step \d+ from rank (\d+)'s RAM copy", logs[victim]
    )
    assert restored and int(restored[0][1]) == (victim + 1) % WORLD, story
    step = int(restored[0][0])
    assert step % 10 == 0 and step <= target + 1, story
    for r in survivors:
        assert f"to step {step}, the last RAM copy" in logs[r], story
        assert set(_done_steps(logs[r], r)) == set(range(STEPS)), story
    # The steps since the copy were run again, and the run is bitwise the fault-free one.
    assert finals == reference_pure, story


@pytest.mark.slow  # two 4-rank jobs and a restart of every rank: make test-slow
@pytest.mark.timeout(400)  # two 4-rank torch jobs, then every rank again, on 2 shared cores
def test_with_no_twin_and_no_copy_every_rank_restarts_from_the_checkpoint(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory, etcd_server
) -> None:  # type: ignore[no-untyped-def]
    """Pure FSDP with neither a twin nor a RAM copy: the ranks say why and exit with code 86, recoverd
    restarts the job (`exit`, the decision saying why), and every rank reads the
    torch.distributed.checkpoint together (a collective, through the mesh's stable groups) and ends
    bitwise as a fault-free run."""
    reference = _reference(
        tmp_path_factory,
        etcd_server,
        ("--mesh", "fsdp", "--ckpt-every", "10", "--ckpt-dir", str(tmp_path_factory.mktemp("ck"))),
    )
    victim = random.randrange(WORLD)
    job = f"job-fsdp-dcp-{victim}-{random.randrange(10**6)}"
    ckpt = tmp_path_factory.mktemp("ckpt")
    cluster.coordinator()
    cluster.strategy()
    _run(cluster, job, ("--mesh", "fsdp", "--ckpt-every", "10", "--ckpt-dir", str(ckpt)))
    cluster.wait_for("a checkpoint", lambda: (ckpt / "step").exists(), timeout=120)
    _, target = _kill_at_a_random_step(cluster, job, victim, 12, STEPS // 2 + 5)

    finals = _finals(cluster, job)
    logs = {r: _log(cluster, job, r) for r in range(WORLD)}
    story = _story(victim, target, logs) + cluster.logs()
    survivors = [r for r in range(WORLD) if r != victim]
    for r in survivors:
        assert "cannot be rebuilt from peers" in logs[r], story
    loaded = {r: re.findall(r"loaded the checkpoint of step (\d+)", logs[r]) for r in range(WORLD)}
    assert all(loaded[r] for r in range(WORLD)), story
    # The ranks exited with code 86 (their state cannot be rebuilt from peers): recoverd ruled out
    # every strategy that keeps live ranks and restarted the job, which read the checkpoint
    # together and ended bitwise as the fault-free run.
    view = cluster.view(job)
    outcomes = [(o.strategy, o.ok) for o in view.history.outcomes]  # type: ignore[union-attr]
    assert outcomes[-1] == ("exit", True), (outcomes, story)
    decisions = _cli("recoverd.cli.ctl", ["--etcd", cluster.endpoint, "--prefix", cluster.prefix, "decisions", job])
    assert "exited with code 86" in decisions.stdout, (decisions.stdout, decisions.stderr, story)
    assert all(status.restart_count >= 1 for status in cluster.ranks(job).values()), story
    assert finals == reference, story


TP = str(ROOT / "examples" / "tp_train.py")
TP_ARGS = ("--launcher", "recoverd", "--steps", str(STEPS), "--step-sleep", "0.01")


def _run_tp(cluster: Cluster, job: str) -> None:
    command = [sys.executable, TP, *TP_ARGS]
    cluster.agent(job, nproc=WORLD, strategies="recover-in-place,exit", command=command)


@pytest.fixture(scope="module")
def reference_tp(tmp_path_factory: pytest.TempPathFactory, etcd_server) -> dict[int, str | None]:  # type: ignore[no-untyped-def]
    """Tensor parallel x data parallel (2 x 2), fault-free: twins hold the same TP shard."""
    cluster = Cluster(etcd_server.endpoint, f"/tpref{os.getpid()}/v1", tmp_path_factory.mktemp("tpref"))
    try:
        cluster.coordinator()
        cluster.strategy()
        _run_tp(cluster, "job-tp-ref")
        finals = _finals(cluster, "job-tp-ref")
    finally:
        cluster.close()
    assert None not in finals.values() and finals[0] == finals[2] and finals[1] == finals[3], finals
    return finals


@pytest.mark.slow  # two 4-rank jobs: make test-slow
@pytest.mark.timeout(300)
def test_a_killed_tensor_parallel_rank_is_healed_from_its_twin(
    cluster: Cluster, reference_tp: dict[int, str | None]
) -> None:
    """TP (DTensor parallelize_module) x DP: the dp all-reduce, TP's functional collectives in
    forward, backward and clip_grad_norm_ all go through the stable groups; a SIGKILLed rank is
    replaced and takes its TP shard from its twin, the survivors keep their processes, bitwise."""
    victim = random.randrange(WORLD)
    job = f"job-tp-{victim}-{random.randrange(10**6)}"
    cluster.coordinator()
    cluster.strategy()
    _run_tp(cluster, job)
    before, target = _kill_at_a_random_step(cluster, job, victim, 5, STEPS // 2)

    finals = _finals(cluster, job)
    after = cluster.ranks(job)
    logs = {r: _log(cluster, job, r) for r in range(WORLD)}
    story = _story(victim, target, logs)
    survivors = [r for r in range(WORLD) if r != victim]
    assert all(after[r].pid == before[r].pid and after[r].restart_count == 0 for r in survivors), story
    assert after[victim].restart_count == 1, story
    assert f"with the shard of rank {_twin(victim)} (its twin)" in logs[victim], story
    for r in survivors:
        assert set(_done_steps(logs[r], r)) == set(range(STEPS)), story
    assert finals == reference_tp, story
