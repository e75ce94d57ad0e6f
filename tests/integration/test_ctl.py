"""``recoverctl status/events/decisions`` (text and ``--json``) after a real recovery, and the CLIs' help.

Each test recovers a SIGKILLed rank in place with the real services, then runs ``recoverctl`` as a
subprocess (``python -m recoverd.cli.ctl``) against the same etcd and prefix, and checks what an
operator reads.
"""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest

from .cluster import Cluster
from .recovered import JOB, Recovered, cli, recover_one_rank

pytestmark = pytest.mark.etcd

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def recovered(cluster: Cluster) -> Recovered:
    """A 4-rank job (recover-in-place,exit) whose rank 2 was SIGKILLed and recovered in place."""
    return recover_one_rank(cluster, JOB)


def _split(line: str) -> list[str]:
    return line.split()


def test_status_text_shows_the_header_every_rank_and_the_recovery(recovered: Recovered) -> None:
    out = recovered.ctl("status", JOB).splitlines()
    assert out[0] == f"job {JOB}  run {recovered.run}  state RUNNING"
    assert out[1] == "world size 4 on 1 node(s); strategies recover-in-place,exit"
    (rec_line,) = [line for line in out if line.startswith("recovery ")]
    assert "phase DONE" in rec_line
    assert f"epoch {recovered.epoch}" in rec_line
    assert "strategy recover-in-place" in rec_line
    assert "fault ranks [2]" in rec_line
    assert "deadline" not in rec_line  # a closed recovery has none

    (header_at,) = [i for i, line in enumerate(out) if line.lstrip().startswith("RANK")]
    assert _split(out[header_at]) == ["RANK", "NODE", "PID", "STATE", "RESTARTS", "GEN", "EXIT"]
    rows = [_split(line) for line in out[header_at + 1 :]]
    assert [int(row[0]) for row in rows] == [0, 1, 2, 3]
    by_rank = {int(row[0]): row for row in rows}
    for rank, status in recovered.after.items():
        row = by_rank[rank]
        assert row[1] == "node0"
        assert int(row[2]) == status.pid
        assert row[3] == "RUNNING"
        assert int(row[4]) == (1 if rank == 2 else 0)
        assert int(row[5]) == status.generation
        assert row[6] == "-"
    assert int(by_rank[2][5]) >= 1
    assert int(by_rank[2][2]) != recovered.before[2].pid


def test_status_json(recovered: Recovered) -> None:
    data = json.loads(recovered.ctl("status", JOB, "--json"))
    assert (data["job"], data["run"], data["state"]) == (JOB, recovered.run, "RUNNING")
    assert (data["world_size"], data["nnodes"]) == (4, 1)
    assert data["strategies"] == ["recover-in-place", "exit"]
    assert set(data["nodes"]) == {"node0"}
    assert recovered.cluster.procs["agent-node0"].pid == data["nodes"]["node0"]["agent_pid"]
    ranks = {r["rank"]: r for r in data["ranks"]}
    assert sorted(ranks) == [0, 1, 2, 3]
    for rank, status in recovered.after.items():
        assert ranks[rank]["pid"] == status.pid
        assert ranks[rank]["state"] == "RUNNING"
        assert ranks[rank]["restarts"] == (1 if rank == 2 else 0)
        assert ranks[rank]["node"] == "node0" and ranks[rank]["node_alive"] is True
    rec = data["recovery"]
    assert rec["phase"] == "DONE"
    assert rec["strategy"] == "recover-in-place"
    assert rec["epoch"] == recovered.epoch
    assert rec["fault_ranks"] == [2]
    assert sorted(rec["participants"]) == ["agent.node0", "agents"]
    assert rec["deadline_at"] is None


def test_events_text_is_one_line_per_event_oldest_first(recovered: Recovered) -> None:
    lines = recovered.ctl("events", JOB).splitlines()
    events = recovered.cluster.events(JOB)
    assert len(lines) == len(events) > 0
    stamps = []
    for line in lines:
        stamp = line.split()[0]
        assert ISO.match(stamp), line
        stamps.append(datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ"))
    assert stamps == sorted(stamps)
    reasons = [line.split()[2] for line in lines]
    assert reasons == [e.reason for e in events]
    for reason in ("job_created", "fault_detected", "strategy_decided", "command_sent", "command_executed"):
        assert reason in reasons, reasons
    assert "recovery_done" in reasons
    # The causal order of one recovery.
    order = ["fault_detected", "strategy_decided", "command_sent", "command_executed", "recovery_done"]
    assert [reasons.index(r) for r in order] == sorted(reasons.index(r) for r in order)
    (fault,) = [line for line in lines if line.split()[2] == "fault_detected"]
    assert fault.split()[1] == "agent.node0" and "rank=2" in fault and "node=node0" in fault
    (sent,) = [line for line in lines if line.split()[2] == "command_sent"]
    assert sent.split()[1] == "coordinator" and f"epoch={recovered.epoch}" in sent


def test_events_json(recovered: Recovered) -> None:
    data = json.loads(recovered.ctl("events", JOB, "--json"))
    assert isinstance(data, list) and data
    reasons = [e["reason"] for e in data]
    assert {"fault_detected", "strategy_decided", "command_sent", "command_executed", "recovery_done"} <= set(reasons)
    (fault,) = [e for e in data if e["reason"] == "fault_detected"]
    assert fault["rank"] == 2 and fault["node"] == "node0" and fault["source"] == "agent.node0"
    assert all(e["at"] and e["message"] for e in data)
    stamps = [e["at"] for e in data]
    assert stamps == sorted(stamps)  # RFC 3339 in UTC with the same precision: string order is time order


def test_decisions_text_and_json(recovered: Recovered) -> None:
    lines = recovered.ctl("decisions", JOB).splitlines()
    head = _split(lines[0])
    assert head[:2] == ["epoch", str(recovered.epoch)]
    assert ISO.match(head[2])
    assert head[3] == "recover-in-place"
    assert head[4] == "by" and head[5].startswith("strategy@")
    reasons = lines[1:]
    assert reasons and all(line.startswith("    ") and line.strip() for line in reasons)
    assert any("recover-in-place: yes" in line for line in reasons)

    data = json.loads(recovered.ctl("decisions", JOB, "--json"))
    assert [(int(d["epoch"]), d["strategy"]) for d in data] == [(recovered.epoch, "recover-in-place")]
    assert [r.strip() for r in reasons] == data[0]["reasons"]


def test_status_before_any_recovery(cluster: Cluster) -> None:
    cluster.coordinator()
    cluster.agent("job-quiet", nproc=2)
    ranks = cluster.wait_running("job-quiet", 2)
    args = ["--etcd", cluster.endpoint, "--prefix", cluster.prefix]
    text = cli("recoverd.cli.ctl", [*args, "status", "job-quiet"])
    assert text.returncode == 0, text.stderr
    assert "recovery: none so far" in text.stdout
    data = json.loads(cli("recoverd.cli.ctl", [*args, "status", "job-quiet", "--json"]).stdout)
    assert data["recovery"] is None
    assert {r["rank"]: r["pid"] for r in data["ranks"]} == {r: s.pid for r, s in ranks.items()}
    decisions = cli("recoverd.cli.ctl", [*args, "decisions", "job-quiet", "--json"])
    assert decisions.returncode == 0 and json.loads(decisions.stdout) == []


# ---------------------------------------------------------------------------- help


def test_recoverctl_help() -> None:
    proc = cli("recoverd.cli.ctl", ["--help"])
    assert proc.returncode == 0, proc.stderr
    for word in ("status", "events", "decisions", "stacks", "--etcd", "--prefix"):
        assert word in proc.stdout
    sub = cli("recoverd.cli.ctl", ["status", "--help"])
    assert sub.returncode == 0 and "--json" in sub.stdout
    stacks = cli("recoverd.cli.ctl", ["stacks", "--help"])
    assert stacks.returncode == 0 and all(flag in stacks.stdout for flag in ("--recovery", "--rank", "--json"))


def test_recoverd_help() -> None:
    proc = cli("recoverd.cli.main", ["--help"])
    assert proc.returncode == 0, proc.stderr
    for word in ("run", "up", "coordinator", "strategy", "agent"):
        assert re.search(rf"^\s+{word}\s", proc.stdout, re.MULTILINE), f"{word} missing from:\n{proc.stdout}"


def test_recoverd_run_help() -> None:
    proc = cli("recoverd.cli.main", ["run", "--help"])
    assert proc.returncode == 0, proc.stderr
    for flag in ("--nproc-per-node", "--strategies", "--etcd", "--prefix", "--job", "--log-dir", "--max-rank-restarts"):
        assert flag in proc.stdout, f"{flag} missing from:\n{proc.stdout}"
