"""Hangs of real PyTorch jobs (gloo, 4 ranks on the CPU), detected from progress, recovered by the
ladder.

* With recoverd's trainer (examples/ddp_train.py): rank 2 is SIGSTOPped while its peers block in
  the step's all-reduce (gloo's timeout is an hour: they would wait "forever"). The trainer reports
  progress and, from the peers, that they wait in a collective: only rank 2 is a fault (stopped);
  the peers keep their processes and every rank ends with bitwise the same parameters.

The plain torch.distributed + DDP case (one ``heartbeat(step)`` per step, a deadlocked rank, its
peers blocked in DDP's all-reduce for good: all four are hangs, restarted, the job finishes) is
measured by ``make bench-hangs`` (bench/hangs.py), to keep ``make test`` short.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from recoverd import hangstacks
from recoverd.records import pb

from . import cluster as harness
from .cluster import ROOT, Cluster

pytest.importorskip("torch", reason="PyTorch is not installed (pip install -r requirements-torch.txt)")

pytestmark = pytest.mark.etcd

#: The harness's fast phase deadlines (3 s to stop, 5 s to recover) escalate to `exit` on a loaded
#: machine; these tests check that only the hung rank is restarted, so they give the phases time.
PATIENT = ["--stop-timeout", "30", "--strategies-timeout", "30", "--recover-timeout", "60"]

DDP = str(ROOT / "examples" / "ddp_train.py")
POLICY = """
strategies: [recover-in-place, exit]
hang:
  startup: 60
  warmup_steps: 2
"""


@pytest.fixture(autouse=True)
def _ddp_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "WORKER", DDP)


def _log(cluster: Cluster, job: str, rank: int) -> str:
    path = Path(cluster.workdir) / f"logs-{job}-node0" / f"rank{rank}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _policy(tmp_path: Path) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return str(path)


def _done_recovery(cluster: Cluster, job: str) -> pb.Recovery:
    def done() -> pb.Recovery | None:
        rec = cluster.view(job).recovery
        return rec if rec is not None and rec.phase == pb.PHASE_DONE else None

    return cluster.wait_for("the hang's recovery to finish", done, timeout=90)


@pytest.mark.slow
def test_a_sigstopped_rank_blocks_its_peers_in_all_reduce_only_it_is_recovered(
    cluster: Cluster, tmp_path: Path
) -> None:
    job = "torch-stop"
    cluster.coordinator(extra=PATIENT)
    cluster.strategy()
    worker = ("--steps", "100", "--step-sleep", "0.02", "--seed", "3", "--collective-timeout", "3600")
    cluster.agent(job, nproc=4, worker=worker, extra=["--policy", _policy(tmp_path)])
    before = cluster.wait_running(job, 4, timeout=120)
    cluster.wait_for(
        "rank 2 past warm-up", lambda: re.search(r"^rank 2 step 20 done", _log(cluster, job, 2), re.M), timeout=120
    )

    stopped_at = time.time()
    os.kill(before[2].pid, signal.SIGSTOP)
    recovery = _done_recovery(cluster, job)

    assert [(f.rank, f.kind) for f in recovery.faults] == [(2, "hang")]
    assert "(process stopped)" in recovery.faults[0].detail
    print(f"SIGSTOP -> hang: {recovery.faults[0].detected_at.ToNanoseconds() / 1e9 - stopped_at:.2f}s")
    stacks = cluster.wait_for(
        "the hang's stacks", lambda: next(filter(None, map(hangstacks.from_event, cluster.events(job))), None)
    )
    print(f"stacks: {stacks.summary}")
    where = {s.rank: s.where for s in stacks.stacks}
    assert all(where[r] in ("allreduce", "all_reduce") for r in (0, 1, 3)), stacks.summary
    assert cluster.wait_exit("agent-node0", timeout=180) == 0, cluster.logs()
    finals = {r: re.search(rf"^rank {r} final sha256 (\w+)", _log(cluster, job, r), re.M) for r in range(4)}
    assert all(finals.values()), finals
    assert len({m.group(1) for m in finals.values() if m}) == 1  # bitwise the same everywhere
    after = cluster.ranks(job)
    log = "\n".join(f"{e.reason}: {e.message}" for e in cluster.events(job))
    for rank in (0, 1, 3):  # the victims kept their processes: they waited in a collective
        assert after[rank].pid == before[rank].pid and after[rank].restart_count == 0, log
    assert after[2].restart_count == 1
