"""Ranks that take part in recoverd's protocol through their node agent (docs/adr/0036).

Real etcd, the services as separate processes, real agents; the ranks are small Python processes
that join through ``taskd_client.agentlink`` (tests/integration/link_rank.py, no torch), so a job of
several ranks per node starts in about a second. The PyTorch trainer's end-to-end dump is in
test_pytorch_via_agent.py.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections import Counter
from functools import partial
from pathlib import Path

import pytest

from recoverd.keys import RunRef
from recoverd.rankwire import address_for, encode_join, sockaddr
from recoverd.records import pb

from .cluster import Cluster
from .history import record_kind, report_writes, run_writes_between
from .test_agent_restart import _reap_orphans

pytestmark = pytest.mark.etcd

LINK_RANK = str(Path(__file__).with_name("link_rank.py"))
NODES = ("node-a", "node-b")


def _start_job(cluster: Cluster, job: str, nproc: int, tmp: Path, env: dict[str, str] | None = None) -> None:
    directory = tmp / job
    directory.mkdir()
    for node_rank, node in enumerate(NODES):
        cluster.agent(
            job, node, nproc=nproc, nnodes=len(NODES), node_rank=node_rank, strategies="dump,exit",
            command=[sys.executable, LINK_RANK], env={"LINK_RANK_DIR": str(directory), **(env or {})},
            extra=["--agent-lease-ttl", "6"],
        )  # fmt: skip


def _declared(cluster: Cluster, job: str) -> bool:
    """Both agents answer for their ranks, and declare what they and their ranks can do."""
    view = cluster.view(job)
    return all(
        n in view.nodes and view.nodes[n].answers_for_ranks and list(view.nodes[n].strategies) == ["dump", "exit"]
        for n in NODES
    )


def _run(cluster: Cluster, job: str) -> RunRef:
    run = cluster.view(job).run
    assert run is not None
    return run


def _name(job: str, node: str) -> str:
    return f"agent-{node}"


def _finish(cluster: Cluster, job: str, tmp: Path) -> None:
    """Let the restarted ranks exit 0 (link_rank.py), and wait for the job's agents to end with it."""
    (tmp / job / "finish").write_text("")
    for node in NODES:
        assert cluster.wait_exit(_name(job, node), timeout=30) == 0, cluster.logs()


def _exit_done(cluster: Cluster, job: str) -> bool:
    """The dump's trailing exit has been confirmed: the recovery is over."""
    rec = cluster.view(job).recovery
    return rec is not None and rec.strategy == "exit" and rec.phase == pb.PHASE_DONE


@pytest.mark.slow
def test_writes_per_recovery_follow_nodes_not_ranks(cluster: Cluster, tmp_path: Path) -> None:
    """The same dump -> exit recovery of a 2-node job with 1 and with 4 ranks per node: one report
    per node per phase, and the same writes under the run, from the fault to the recovery's end."""
    cluster.coordinator()
    cluster.strategy()
    writes: dict[int, Counter[str]] = {}
    revisions: dict[int, int] = {}
    for nproc in (1, 4):
        job = f"job-link-{nproc}"
        _start_job(cluster, job, nproc, tmp_path)
        cluster.wait_running(job, 2 * nproc)
        cluster.wait_for(f"{job}: both agents to answer for their ranks", partial(_declared, cluster, job))
        start = cluster.view(job).revision + 1
        victim = 2 * nproc - 1  # on node-b
        os.kill(cluster.ranks(job)[victim].pid, signal.SIGKILL)
        cluster.wait_for(f"{job}: the dump and its exit", partial(_exit_done, cluster, job), timeout=30)
        view = cluster.view(job)
        assert [(o.strategy, o.ok) for o in view.history.outcomes] == [("dump", True), ("exit", True)]  # type: ignore[union-attr]
        run = _run(cluster, job)
        events = run_writes_between(cluster, run, start, view.revision)
        reports = report_writes(events, cluster.keys.reports_prefix(run))
        assert reports == Counter({f"agent.{n}/{k}": 1 for n in NODES for k in ("stop_complete", "recover_status")})
        # Every live rank saved, none twice; the victim could not.
        saved = sorted(p.name.split(".")[0] for p in (tmp_path / job).glob("rank*"))
        assert saved == [f"rank{r}" for r in range(2 * nproc) if r != victim]
        writes[nproc] = Counter(record_kind(cluster, run, e.key) for e in events if not e.is_delete)
        revisions[nproc] = len({e.mod_revision for e in events})
        _finish(cluster, job, tmp_path)
    print("keys written under the run per recovery, by ranks per node:", writes, "transactions:", revisions)
    # What the agents write does not grow with the ranks per node: their reports, acks and rank
    # tables (a command changes a node's ranks in one write, with its ack), and their records.
    for kind in ("reports", "acks", "ranks", "nodes", "faults"):
        assert writes[4][kind] == writes[1][kind], (kind, writes)
    # The coordinator's own writes depend only on how its passes fall: the two agents' answers to a
    # phase (stop, dump status, exit ack) are read in one pass or in two, so up to one recovery
    # write more per phase, whatever the ranks.
    assert revisions[4] <= revisions[1] + 3, revisions


def test_recover_in_place_still_works_and_every_node_confirms_the_stop(cluster: Cluster, tmp_path: Path) -> None:
    """A strategy the agents carry out themselves: each agent that answers for its ranks confirms
    the stop once for them, and the faulty node's command ack is its recover status."""
    job = "job-link-rip"
    cluster.coordinator()
    cluster.strategy()
    directory = tmp_path / job
    directory.mkdir()
    for node_rank, node in enumerate(NODES):
        cluster.agent(
            job, node, nproc=2, nnodes=2, node_rank=node_rank, strategies="recover-in-place,exit",
            command=[sys.executable, LINK_RANK],
            env={"LINK_RANK_DIR": str(directory), "LINK_RANK_OFFER": "recover-in-place,exit"},
            extra=["--agent-lease-ttl", "6"],
        )  # fmt: skip
    before = cluster.wait_running(job, 4)

    def declared() -> bool:
        nodes = cluster.view(job).nodes
        return all(n in nodes and nodes[n].answers_for_ranks for n in NODES)

    cluster.wait_for("both agents to answer for their ranks", declared)
    run = _run(cluster, job)
    start = cluster.view(job).revision + 1
    os.kill(before[3].pid, signal.SIGKILL)
    view = cluster.wait_for(
        "rank 3 restarted in place",
        lambda: (v := cluster.view(job)).recovery is not None and v.recovery.phase == pb.PHASE_DONE and v,
    )
    assert view.recovery is not None and view.recovery.strategy == "recover-in-place"
    after = cluster.ranks(job)
    assert after[3].pid != before[3].pid and all(after[r].pid == before[r].pid for r in (0, 1, 2))
    reports = report_writes(run_writes_between(cluster, run, start, view.revision), cluster.keys.reports_prefix(run))
    assert reports == Counter({f"agent.{n}/stop_complete": 1 for n in NODES}), reports
    # Every surviving rank was asked to stop (and answered): the agents relayed the stop.
    for r in (0, 1, 2):
        log = Path(cluster.workdir) / f"logs-{job}-{NODES[r // 2]}" / f"rank{r}.log"
        assert f"rank {r} stop" in log.read_text(), (r, log.read_text())
    cluster.stop("agent-node-a")
    cluster.stop("agent-node-b")


def test_a_rank_that_fails_its_dump_fails_its_nodes_answer(cluster: Cluster, tmp_path: Path) -> None:
    job = "job-link-fail"
    cluster.coordinator()
    cluster.strategy()
    _start_job(cluster, job, 2, tmp_path, env={"LINK_RANK_FAIL_DUMP": "0"})
    cluster.wait_running(job, 4)
    cluster.wait_for("both agents to answer for their ranks", partial(_declared, cluster, job))
    os.kill(cluster.ranks(job)[3].pid, signal.SIGKILL)
    cluster.wait_for("the fallback to exit", partial(_exit_done, cluster, job), timeout=30)
    _finish(cluster, job, tmp_path)
    view = cluster.view(job)
    # The dump failed (node-a's rank 0 could not save), so recoverd fell back to exit.
    assert [(o.strategy, o.ok) for o in view.history.outcomes] == [("dump", False), ("exit", True)]  # type: ignore[union-attr]
    failures = [e.message for e in cluster.events(job) if "no space left on device" in e.message]
    assert failures and "rank 0" in failures[0], [e.message for e in cluster.events(job)]


def test_an_idle_spare_does_not_take_dump_away(cluster: Cluster, tmp_path: Path) -> None:
    """A spare agent holds no rank, so nothing of a dump is its to do: it declares dump too."""
    job = "job-link-spare"
    cluster.coordinator()
    cluster.strategy()
    _start_job(cluster, job, 1, tmp_path)
    cluster.wait_running(job, 2)  # a spare joins a running job
    cluster.agent(
        job, "spare-0", nproc=1, nnodes=2, strategies="dump,exit", command=[sys.executable, LINK_RANK],
        env={"LINK_RANK_DIR": str(tmp_path / job)}, extra=["--spare", "--agent-lease-ttl", "6"],
    )  # fmt: skip
    cluster.wait_for("both agents to answer for their ranks", partial(_declared, cluster, job))
    spare = cluster.wait_for("the spare to register", lambda: cluster.view(job).nodes.get("spare-0"))
    assert spare.is_spare and not spare.answers_for_ranks and "dump" in spare.strategies
    os.kill(cluster.ranks(job)[1].pid, signal.SIGKILL)
    cluster.wait_for("the dump and its exit", partial(_exit_done, cluster, job), timeout=30)
    _finish(cluster, job, tmp_path)
    assert cluster.wait_exit("agent-spare-0", timeout=30) == 0, cluster.logs()
    outcomes = cluster.view(job).history.outcomes  # type: ignore[union-attr]
    assert [(o.strategy, o.ok) for o in outcomes] == [("dump", True), ("exit", True)]


def test_a_join_from_another_process_or_a_malformed_message_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    job = "job-link-untrusted"
    cluster.coordinator()
    cluster.strategy()
    _start_job(cluster, job, 2, tmp_path)
    before = cluster.wait_running(job, 4)
    cluster.wait_for("both agents to answer for their ranks", partial(_declared, cluster, job))
    run = _run(cluster, job)

    # This test process is not rank 0's: its join is refused; then a malformed message.
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.connect(sockaddr(address_for(run.uid, "node-a")))
        sock.send(encode_join(0, ("recover-in-place", "exit")))
        sock.send(b'{"v": 1, "op": "answer", "id": ' + b"[" * 3000)
        refused = cluster.wait_for(
            "the refusal to be recorded",
            lambda: [e for e in cluster.events(job) if e.reason == "bad_rank_message"],
        )
    assert len(refused) == 1 and "join as rank 0 refused" in refused[0].message, refused
    # Nothing changed: the rank runs, the node still declares what its ranks joined with.
    assert cluster.ranks(job)[0].pid == before[0].pid and _declared(cluster, job)

    # And the protocol still works: a dump through the agents.
    os.kill(before[3].pid, signal.SIGKILL)
    cluster.wait_for("the dump and its exit", partial(_exit_done, cluster, job), timeout=30)
    _finish(cluster, job, tmp_path)
    outcomes = cluster.view(job).history.outcomes  # type: ignore[union-attr]
    assert [(o.strategy, o.ok) for o in outcomes] == [("dump", True), ("exit", True)]


def test_ranks_join_a_restarted_agent_again(cluster: Cluster, tmp_path: Path) -> None:
    """ADR 0023: the agent is SIGKILLed and started again; it adopts its ranks, which reconnect to
    the same name and join again, and the next dump goes through it."""
    job = "job-link-restart"
    cluster.coordinator()
    cluster.strategy()
    _start_job(cluster, job, 2, tmp_path)
    before = cluster.wait_running(job, 4)
    cluster.wait_for("both agents to answer for their ranks", partial(_declared, cluster, job))

    cluster.kill("agent-node-a")
    cluster.respawn("agent-node-a")
    cluster.wait_for(
        "the new agent to adopt its ranks", lambda: any(e.reason == "ranks_adopted" for e in cluster.events(job))
    )
    # Its first record declares what the agent alone can do; once its ranks have joined it again,
    # the ranks' strategies (this proves they reconnected: only joined ranks bring `dump`).
    cluster.wait_for("node-a's ranks to join the new agent", lambda: _declared(cluster, job), timeout=20)
    assert all(cluster.ranks(job)[r].pid == before[r].pid for r in range(4)), "ranks kept"

    os.kill(before[3].pid, signal.SIGKILL)
    cluster.wait_for("the dump and its exit", partial(_exit_done, cluster, job), timeout=30)
    _finish(cluster, job, tmp_path)
    outcomes = cluster.view(job).history.outcomes  # type: ignore[union-attr]
    assert [(o.strategy, o.ok) for o in outcomes] == [("dump", True), ("exit", True)]
    saved = sorted(p.name.split(".")[0] for p in (tmp_path / job).glob("rank*"))
    assert saved == ["rank0", "rank1", "rank2"]
    _reap_orphans(cluster, [before[r].pid for r in (0, 1)])
