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

import json
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from recoverd.records import pb

from .cluster import Cluster

pytestmark = pytest.mark.etcd

WARM_RANK = str(Path(__file__).with_name("warm_rank.py"))
JOB = "job-warm"


def _identities(log: Path) -> list[dict[str, object]]:
    if not log.exists():
        return []
    return [json.loads(line.split(" ", 1)[1]) for line in log.read_text().splitlines() if line.startswith("identity ")]


def _server(agent_pid: int) -> psutil.Process | None:
    for child in psutil.Process(agent_pid).children():
        try:
            if any(part.endswith("warmstart_server.py") for part in child.cmdline()):
                return child
        except psutil.Error:
            continue
    return None


def test_a_restarted_rank_is_forked_from_the_warm_start_server(cluster: Cluster) -> None:
    cluster.coordinator()
    cluster.strategy()
    agent = cluster.agent(
        JOB,
        nproc=2,
        strategies="recover-in-place,exit",
        command=[sys.executable, "-u", WARM_RANK, "--flag", "x y"],
        extra=["--warm-start-modules", "decimal,json", "--max-rank-restarts", "10"],
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
    assert len({first["random"], forked["random"], stays["random"]}) == 3  # reseeded in each fork
    # Re-parented to the agent (a subreaper), not the server's: the agent reaps it and reads its status.
    replacement = psutil.Process(after[1].pid)
    assert replacement.pid == stays["pid"]
    assert replacement.ppid() == agent.pid
    assert _server(agent.pid) is not None and _server(agent.pid).pid == server.pid  # the server lives on
    view = cluster.wait_for(
        "the second recovery",
        lambda: (
            (v := cluster.view(JOB)).recovery
            and v.recovery.recovery_id == 2
            and v.recovery.phase == pb.PHASE_DONE
            and v
        ),
    )
    assert view.recovery is not None
    assert view.recovery.faults[0].exit_code == 3, view.recovery  # the forked rank's real exit status
    assert after[0].pid == before[0].pid  # rank 0 untouched


def test_a_dead_warm_start_server_is_replaced(cluster: Cluster) -> None:
    """The server is started again after it dies (plain starts meanwhile), and forks again."""
    cluster.coordinator()
    cluster.strategy()
    agent = cluster.agent(
        JOB,
        nproc=2,
        strategies="recover-in-place,exit",
        command=[sys.executable, WARM_RANK],
        extra=["--warm-start-modules", "decimal", "--max-rank-restarts", "10"],
    )
    logs = cluster.workdir / f"logs-{JOB}-node0"
    before = cluster.wait_running(JOB, 2)
    cluster.wait_for("the warm-start server", lambda: " ready in " in cluster.logs())
    server = _server(agent.pid)
    assert server is not None
    server.kill()
    cluster.wait_for("the agent to notice", lambda: "the warm-start server ended" in cluster.logs())
    cluster.wait_for("a new server", lambda: cluster.logs().count(" ready in ") == 2)
    again = _server(agent.pid)
    assert again is not None and again.pid != server.pid
    assert not psutil.pid_exists(server.pid) or psutil.Process(server.pid).status() == psutil.STATUS_ZOMBIE

    os.kill(before[0].pid, signal.SIGKILL)

    cluster.wait_for(
        "rank 0 back twice",
        lambda: (r := cluster.ranks(JOB))[0].state == pb.RANK_RUNNING and r[0].restart_count == 2 and r,
        timeout=40,
    )
    ids = cluster.wait_for("three identities", lambda: (i := _identities(logs / "rank0.log"))[2:] and i)
    assert [i["preloaded"] for i in ids] == [False, True, True], ids
