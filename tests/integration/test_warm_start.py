"""Warm starts through the real agent: a restarted rank is forked from the warm-start server.

The job's command is a plain ``python script.py`` that knows nothing of recoverd
(tests/integration/warm_rank.py). The agent keeps a warm-start server that has imported ``decimal``
(``--warm-start-modules``; torch in real jobs), a rank is SIGKILLed, and the replacement must be
forked from that server and yet look, to the script, like a fresh ``python script.py``: its own
environment, argv, ``__main__``, working directory and session, stdin from /dev/null, a random
state of its own. It must be the agent's child (re-parented), so the agent reads its real exit
status: the first replacement exits 3, and the fault record says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from recoverd.priority import DEFAULT_BOOST
from recoverd.records import pb

from .cluster import Cluster
from .test_agent_restart import _reap_orphans

pytestmark = pytest.mark.etcd

WARM_RANK = str(Path(__file__).with_name("warm_rank.py"))
JOB = "job-warm"


def _identities(log: Path) -> list[dict[str, object]]:
    if not log.exists():
        return []
    return [json.loads(line.split(" ", 1)[1]) for line in log.read_text().splitlines() if line.startswith("identity ")]


def _warm_processes(agent_pid: int, *, standby: bool) -> list[psutil.Process]:
    """The agent's warm-start server (``standby=False``) or the standbys it forked ahead."""
    found = []
    for child in psutil.Process(agent_pid).children():
        try:
            cmdline = child.cmdline()
        except psutil.Error:
            continue
        if any(part.endswith("warmstart_server.py") for part in cmdline) and ("--standby-of" in cmdline) is standby:
            found.append(child)
    return found


def _warm_log(logs: Path) -> str:
    path = logs / "warm-start.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _server(agent_pid: int) -> psutil.Process | None:
    return next(iter(_warm_processes(agent_pid, standby=False)), None)


def _start(
    cluster: Cluster,
    command: list[str],
    modules: str,
    env: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
) -> subprocess.Popen[bytes]:
    """The control plane, and an agent of JOB's 2 ranks whose warm-start server imports ``modules``."""
    cluster.coordinator()
    cluster.strategy()
    extra = ["--warm-start-modules", modules, "--max-rank-restarts", "10", *extra]
    return cluster.agent(JOB, nproc=2, strategies="recover-in-place,exit", command=command, extra=extra, env=env)


def test_a_restarted_rank_is_forked_from_the_warm_start_server(cluster: Cluster) -> None:
    agent = _start(
        cluster,
        [sys.executable, "-u", WARM_RANK, "--flag", "x y"],
        "decimal,json",
        {"WARM_RANK_FAIL_FIRST_RESTART": "1"},
        # The first start is plain (it does not wait for the server): what a fork must look like.
        # No crash-loop backoff (ADR 0046): the first life is killed early and the first restart
        # fails at once, so the second restart would wait, as a plain start.
        extra=("--warm-start-wait", "0", "--crash-backoff-max", "0"),
    )
    logs = cluster.workdir / f"logs-{JOB}-node0"
    before = cluster.wait_running(JOB, 2)
    cluster.wait_for(
        "the warm-start server", lambda: "warm-start server pid" in cluster.logs() and " ready in " in cluster.logs()
    )
    server = _server(agent.pid)
    assert server is not None, cluster.logs()
    first = cluster.wait_for("rank 1's identity", lambda: _identities(logs / "rank1.log"))[0]
    assert first["preloaded"] is False  # started plainly: the server was not ready at launch
    standby = cluster.wait_for("a standby forked ahead", lambda: _warm_processes(agent.pid, standby=True))
    assert len(standby) == 1 and [a for a in standby[0].cmdline() if a][-2:] == ["--standby-of", str(server.pid)]
    assert "RANK" not in standby[0].environ()  # not a rank until it is given one: adoption ignores it
    # Unused for a while, it compiles the script (runpy would, on the replacement's critical path).
    cluster.wait_for("the script compiled ahead", lambda: "script compiled ahead" in _warm_log(logs))

    os.kill(before[1].pid, signal.SIGKILL)

    # The first replacement is forked, prints its identity and exits 3; the second one stays.
    after = cluster.wait_for(
        "rank 1's second replacement",
        lambda: (r := cluster.ranks(JOB))[1].state == pb.RANK_RUNNING and r[1].restart_count == 2 and r,
        timeout=40,
    )
    ids = cluster.wait_for("three identities", lambda: (i := _identities(logs / "rank1.log"))[2:] and i)
    forked, stays = ids[1], ids[2]
    assert (forked["restart"], stays["restart"]) == ("1", "2")
    log_text = (logs / "rank1.log").read_text()
    assert log_text.count("(warm start) ====") == 2, log_text
    for seen in (forked, stays):
        assert seen["preloaded"] is True, seen  # decimal was imported by the server, not the script
        assert seen["rank"] == "1"
        assert seen["argv"] == [WARM_RANK, "--flag", "x y"]
        assert seen["name"] == "__main__" and seen["file"] == WARM_RANK
        assert seen["path0"] == str(Path(WARM_RANK).parent)
        assert seen["cwd"] == str(cluster.workdir)
        assert seen["pgid"] == seen["pid"] == seen["sid"], seen  # its own session and process group
        assert seen["stdin_is_null"] is True
        # As `python script.py` runs it, from the standby's compiled code or not (the second one):
        assert seen["annotation"] == "<class 'int'>" and seen["doc"] == first["doc"], seen
        assert seen["main_is_this"] is True
    # The first replacement ran the standby's compiled code, the second runpy's: the same module.
    assert forked["spec_loader_cached"] == stays["spec_loader_cached"]
    assert len({first["random"], forked["random"], stays["random"]}) == 3  # reseeded in each fork
    assert forked["pid"] == standby[0].pid  # the first replacement was the standby: no fork to wait for
    # Each use is followed by a new standby (the next replacement's), forked after the answer.
    again = cluster.wait_for("the next standby", lambda: _warm_processes(agent.pid, standby=True))
    assert len(again) == 1 and again[0].pid not in (forked["pid"], stays["pid"])
    # Re-parented to the agent (a subreaper), not the server's: the agent reaps it and reads its status.
    replacement = psutil.Process(after[1].pid)
    assert replacement.pid == stays["pid"]
    assert replacement.ppid() == agent.pid
    # What ps and /proc show are the rank's command line and environment, not the server's.
    # (The server's longer command line leaves NUL padding: psutil lists it as empty strings.)
    assert [a for a in replacement.cmdline() if a] == [sys.executable, "-u", WARM_RANK, "--flag", "x y"]
    shown = replacement.environ()
    assert (shown["RANK"], shown["RECOVERD_RESTART_COUNT"], shown["RECOVERD_JOB"]) == ("1", "2", JOB)
    assert "RECOVERD_WARM_START_ROOM" not in shown
    assert _server(agent.pid) is not None and _server(agent.pid).pid == server.pid  # the server lives on
    # The forked rank's exit 3 is a second recovery, or a second round of the first one when it came
    # before that recovery was DONE (the standby starts it within ~0.1 s): either way its fault
    # carries the forked rank's real exit status, read through the re-parenting.
    view = cluster.wait_for(
        "the recovery of the exit 3",
        lambda: (
            (v := cluster.view(JOB)).recovery
            and v.recovery.phase == pb.PHASE_DONE
            and any(f.exit_code == 3 for f in v.recovery.faults)
            and v
        ),
    )
    assert view.recovery is not None
    assert after[0].pid == before[0].pid  # rank 0 untouched


def test_a_dead_warm_start_server_is_replaced(cluster: Cluster) -> None:
    """The server is started again after it dies (plain starts meanwhile), and forks again."""
    agent = _start(cluster, [sys.executable, WARM_RANK], "decimal")
    logs = cluster.workdir / f"logs-{JOB}-node0"
    before = cluster.wait_running(JOB, 2)
    cluster.wait_for("the warm-start server", lambda: " ready in " in cluster.logs())
    server = _server(agent.pid)
    assert server is not None
    standby = cluster.wait_for("a standby forked ahead", lambda: _warm_processes(agent.pid, standby=True))[0]
    server.kill()
    cluster.wait_for("the agent to notice", lambda: "the warm-start server ended" in cluster.logs())
    # The standby ends with its server (its pipe closes) and the agent reaps it: no zombie is left.
    cluster.wait_for("the standby gone", lambda: not psutil.pid_exists(standby.pid))
    cluster.wait_for("a new server", lambda: cluster.logs().count(" ready in ") == 2)
    again = _server(agent.pid)
    assert again is not None and again.pid != server.pid
    assert not psutil.pid_exists(server.pid) or psutil.Process(server.pid).status() == psutil.STATUS_ZOMBIE

    os.kill(before[0].pid, signal.SIGKILL)

    cluster.wait_for(
        "rank 0 back",
        lambda: (r := cluster.ranks(JOB))[0].state == pb.RANK_RUNNING and r[0].restart_count == 1 and r,
        timeout=40,
    )
    ids = cluster.wait_for("two identities", lambda: (i := _identities(logs / "rank0.log"))[1:] and i)
    # The first start waited for the first server; the restart was forked from the new one (a
    # plain start, with the server gone, would not have decimal imported).
    assert [i["preloaded"] for i in ids] == [True, True], ids
    assert ids[1]["pid"] not in (ids[0]["pid"], before[0].pid)


def test_the_first_start_is_forked_from_the_warm_start_server(cluster: Cluster) -> None:
    """By default the first start waits for the server, so every rank is forked from it: one
    import per node, and the ranks look as plainly started ones do."""
    agent = _start(cluster, [sys.executable, "-u", WARM_RANK, "--flag", "x y"], "decimal,json")
    logs = cluster.workdir / f"logs-{JOB}-node0"
    before = cluster.wait_running(JOB, 2)
    assert "first start forked from the warm-start server" in cluster.logs()
    server = _server(agent.pid)
    assert server is not None
    ids = [cluster.wait_for(f"rank {r}'s identity", lambda r=r: _identities(logs / f"rank{r}.log"))[0] for r in (0, 1)]
    for rank, seen in enumerate(ids):
        assert seen["preloaded"] is True, seen  # imported by the server, not by the script
        assert (seen["rank"], seen["argv"], seen["name"]) == (str(rank), [WARM_RANK, "--flag", "x y"], "__main__")
        assert seen["pgid"] == seen["pid"] == seen["sid"], seen
        assert seen["pid"] == before[rank].pid
        assert psutil.Process(before[rank].pid).ppid() == agent.pid  # re-parented: the agent reaps it
    assert ids[0]["random"] != ids[1]["random"]  # reseeded in each fork
    for rank in (0, 1):
        assert (logs / f"rank{rank}.log").read_text().count("(warm start) ====") == 1


@pytest.mark.parametrize(
    ("modules", "wait", "why"),
    [
        ("no_such_module_here", "30", "nothing to preload"),  # given up at once: no 30 s wait
        ("slow_import", "0.5", "not ready within 0.5s"),  # still importing when the wait ends
    ],
    ids=["server-gives-up", "wait-ends"],
)
def test_the_first_start_does_not_wait_for_a_server_that_cannot_serve(
    cluster: Cluster, modules: str, wait: str, why: str
) -> None:
    """A server that gives up ends the first start's wait at once; one still importing when the
    wait ends is not waited for longer. Either way the ranks start plainly and the log says why."""
    _start(cluster, [sys.executable, WARM_RANK], modules, {"SLOW_IMPORT_S": "60"}, extra=("--warm-start-wait", wait))
    logs = cluster.workdir / f"logs-{JOB}-node0"
    cluster.wait_running(JOB, 2)
    assert f"first start without the warm-start server ({why}" in cluster.logs(), cluster.logs()
    for rank in (0, 1):
        seen = cluster.wait_for(f"rank {rank}'s identity", lambda r=rank: _identities(logs / f"rank{r}.log"))[0]
        assert seen["preloaded"] is False, seen
        assert "(warm start) ====" not in (logs / f"rank{rank}.log").read_text()  # a plain start


def _pending_in_etcd(cluster: Cluster) -> dict[int, pb.RankStatus]:
    """JOB's two ranks, once etcd has them, during the first start's wait (the server imports for 60 s)."""
    ranks = cluster.wait_for("the pending ranks in etcd", lambda: len(r := cluster.ranks(JOB)) == 2 and r)
    assert {r.state for r in ranks.values()} == {pb.RANK_PENDING}, ranks
    assert "first start" not in cluster.logs()  # still waiting
    return ranks


def test_an_agent_stopped_during_the_first_starts_wait_starts_nothing(cluster: Cluster) -> None:
    """SIGTERM while the first start waits: no rank is started on the way out, and the ranks end
    STOPPED in etcd, so the coordinator sees a node that left, not a node lost with its ranks."""
    _start(cluster, [sys.executable, WARM_RANK], "slow_import", {"SLOW_IMPORT_S": "60"})
    logs = cluster.workdir / f"logs-{JOB}-node0"
    _pending_in_etcd(cluster)

    cluster.stop("agent-node0")

    assert "first start" not in cluster.logs()
    assert not any(logs.glob("rank*.log")), "a rank was started on the way out"
    assert {r.state for r in cluster.ranks(JOB).values()} == {pb.RANK_STOPPED}


def test_a_node_lost_during_the_first_starts_wait_is_recovered(cluster: Cluster) -> None:
    """The pending ranks are in etcd during the wait, so a node lost then is a fault like any."""
    agent = _start(cluster, [sys.executable, WARM_RANK], "slow_import", {"SLOW_IMPORT_S": "60"})
    _pending_in_etcd(cluster)
    server = cluster.wait_for("the importing server", lambda: _server(agent.pid))

    cluster.kill("agent-node0")

    view = cluster.wait_for("the lost node's recovery", lambda: (v := cluster.view(JOB)).recovery and v)
    assert view.recovery is not None
    assert {(f.source, f.node) for f in view.recovery.faults} == {(pb.SOURCE_LEASE, "node0")}
    assert sorted(f.rank for f in view.recovery.faults) == [0, 1]
    # The server, still importing, was re-parented to this test process (a subreaper): as init would.
    server.kill()
    _reap_orphans(cluster, [server.pid])


def test_a_restarted_agent_adopts_a_forked_rank(cluster: Cluster) -> None:
    """A forked rank outlives its agent like any rank, and the next agent adopts it: one process
    per rank, found by its environment, and its next fault is recovered by the new agent."""
    args = {
        "nproc": 2,
        "strategies": "recover-in-place,exit",
        "command": [sys.executable, WARM_RANK],
        # A 6 s lease: the new agent must take its node back within its predecessor's lease.
        "extra": ["--warm-start-modules", "decimal", "--max-rank-restarts", "10", "--agent-lease-ttl", "6"],
    }
    cluster.coordinator()
    cluster.strategy()
    agent = cluster.agent(JOB, **args)  # type: ignore[arg-type]
    before = cluster.wait_running(JOB, 2)
    cluster.wait_for("the warm-start server", lambda: " ready in " in cluster.logs())
    os.kill(before[1].pid, signal.SIGKILL)
    forked = cluster.wait_for(
        "rank 1 forked", lambda: (r := cluster.ranks(JOB))[1].state == pb.RANK_RUNNING and r[1].restart_count == 1 and r
    )[1].pid
    server = _server(agent.pid)
    assert server is not None
    standbys = cluster.wait_for("a standby forked ahead", lambda: _warm_processes(agent.pid, standby=True))
    assert all(p.ppid() == agent.pid for p in standbys), "a standby is the agent's child, as its rank will be"

    cluster.kill("agent-node0")
    cluster.agent(JOB, **args)  # type: ignore[arg-type]
    cluster.wait_for("the ranks adopted", lambda: any(e.reason == "ranks_adopted" for e in cluster.events(JOB)))
    after = cluster.wait_running(JOB, 2)
    assert (after[0].pid, after[1].pid) == (before[0].pid, forked)
    ranks = [
        p.info["pid"]
        for p in psutil.process_iter(["pid", "environ", "status"])
        if (p.info["environ"] or {}).get("RECOVERD_JOB") == JOB
        and (p.info["environ"] or {}).get("RECOVERD_PREFIX") == cluster.prefix  # not a run beside this one
        and "RANK" in (p.info["environ"] or {})
        and p.info["status"] != psutil.STATUS_ZOMBIE
    ]
    assert sorted(ranks) == sorted([before[0].pid, forked]), "one process per rank"

    os.kill(forked, signal.SIGKILL)
    cluster.wait_for(
        "rank 1 back under the new agent",
        lambda: (r := cluster.ranks(JOB))[1].state == pb.RANK_RUNNING and r[1].pid != forked and r,
    )
    cluster.stop("agent-node0")
    # The first agent's ranks and server were re-parented to this test process (a subreaper).
    # So was the standby, which ends with the server (its pipe closes).
    _reap_orphans(cluster, [before[0].pid, forked, server.pid, *(p.pid for p in standbys)])


def _nice_of_threads(pid: int) -> set[int]:
    """The nice value of each thread of ``pid`` (Linux keeps it per thread)."""
    values = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            values.add(int(stat.rsplit(")", 1)[1].split()[16]))  # field 19: nice
    return values


def test_the_control_plane_runs_ahead_of_the_ranks_which_keep_the_jobs_priority(cluster: Cluster) -> None:
    """``--cpu-boost`` (default 10): the agent, all its threads, and the warm-start server once
    ready run ahead of the job; every rank, started plainly or forked, runs at the job's own
    priority. Without CAP_SYS_NICE nothing changes."""
    job_nice = os.getpriority(os.PRIO_PROCESS, 0)  # what this harness gives the agent it starts
    boosted = max(-20, job_nice - DEFAULT_BOOST) if os.geteuid() == 0 else job_nice
    agent = _start(cluster, [sys.executable, WARM_RANK], "decimal")
    before = cluster.wait_running(JOB, 2)
    cluster.wait_for("the warm-start server", lambda: " ready in " in cluster.logs())
    server = _server(agent.pid)
    assert server is not None
    standby = cluster.wait_for("a standby", lambda: _warm_processes(agent.pid, standby=True))[0]
    assert _nice_of_threads(agent.pid) == {boosted}, "every thread of the agent, its event loop's and gRPC's"
    assert _nice_of_threads(server.pid) == {boosted}  # raised once ready, before it says so
    # (The first standby may be forked before that: it runs at either; it waits, and as a rank it
    # puts itself at the job's priority.)
    for status in before.values():
        assert _nice_of_threads(status.pid) == {job_nice}, "a rank started plainly"

    os.kill(before[1].pid, signal.SIGKILL)
    forked = cluster.wait_for(
        "rank 1 forked", lambda: (r := cluster.ranks(JOB))[1].state == pb.RANK_RUNNING and r[1].restart_count == 1 and r
    )[1]
    assert forked.pid == standby.pid
    assert _nice_of_threads(forked.pid) == {job_nice}, "a rank forked from the server puts itself back"
