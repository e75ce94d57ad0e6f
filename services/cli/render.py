"""What ``recoverctl`` prints: records and views turned into dicts (``--json``) and text, and nothing else.

Pure: no etcd, no clock, no printing. Every read command builds one dict (or list) here and prints
either its JSON or its text form, so the two always say the same thing. The JSON forms are a
stable interface (docs/recoverctl-schemas/, checked by tests): fields are added, never renamed or
removed. Records shown as they are stored (events, decisions) keep proto3 JSON's conventions:
fields at their default value are left out and 64-bit integers are strings (docs/keyspace.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf import json_format

from recoverd import hangstacks
from recoverd.jobview import JobView, idle_spares
from recoverd.keys import printable
from recoverd.records import LIVE_RANK_STATES, pb, ts_to_s

__all__ = [
    "ENDED",
    "as_dict",
    "decision_lines",
    "enum_name",
    "format_event",
    "format_jobs",
    "format_stacks",
    "format_status",
    "has_ended",
    "iso",
    "job_row",
    "stacks_list",
    "status_dict",
]

#: The job states after which nothing more happens to a run.
ENDED = frozenset({pb.JOB_SUCCEEDED, pb.JOB_FAILED})


def iso(seconds: float) -> str:
    """UTC, milliseconds, RFC 3339 (``-`` for an unset time): string order is time order."""
    if not seconds:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds * 1000) % 1000:03d}Z"


def as_dict(message: Any) -> dict[str, Any]:
    """A stored record in its stored form (proto3 JSON, the ``.proto`` field names)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def enum_name(enum: Any, value: int, prefix: str) -> str:
    return str(enum.Name(value)).removeprefix(prefix)


def has_ended(view: JobView) -> bool:
    """The run finished (succeeded or failed): its status record says so, and it is written once."""
    return view.status is not None and view.status.state in ENDED


def _state(view: JobView) -> str:
    return enum_name(pb.JobState, view.status.state, "JOB_") if view.status else "RUNNING"


def _recovery_brief(rec: pb.Recovery) -> dict[str, Any]:
    return {
        "id": rec.recovery_id,
        "epoch": rec.epoch,
        "phase": enum_name(pb.Phase, rec.phase, "PHASE_"),
        "strategy": rec.strategy,
    }


def _absent_state(view: JobView, node: str) -> str:
    """The state of a running rank whose node's agent is not registered: HELD while the
    coordinator holds the node after trouble in etcd (docs/adr/0045), else LOST."""
    return "HELD" if view.recovery is not None and node in view.recovery.held_nodes else "LOST"


def status_dict(view: JobView) -> dict[str, Any]:
    """One job in full: its ranks, nodes and current recovery, as of ``revision`` (the etcd
    revision read; ``status --watch`` prints one per change)."""
    assert view.spec is not None
    ranks = sorted((r for nr in view.ranks.values() for r in nr.ranks), key=lambda r: r.rank)
    out: dict[str, Any] = {
        "job": view.spec.name,
        "run": view.spec.uid,
        "revision": view.revision,
        "world_size": view.spec.world_size,
        "nnodes": view.spec.nnodes,
        "strategies": list(view.spec.policy.strategies),
        "state": _state(view),
        "reason": view.status.reason if view.status else "",
        "nodes": {
            name: {"host": n.host, "agent_pid": n.agent_pid, "node_rank": n.node_rank, "spare": n.is_spare}
            for name, n in sorted(view.nodes.items())
        },
        "spares": list(idle_spares(view)),
        "warm_spares": {node: list(t.warm_spare_pids) for node, t in sorted(view.ranks.items()) if t.warm_spare_pids},
        "isolated": [{"rank": p.rank, "node": p.node} for p in view.recovery.isolated] if view.recovery else [],
        "ranks": [
            {
                "rank": r.rank,
                "node": r.node,
                "pid": r.pid,
                # A lost node's table keeps its last state: its running ranks are not running
                # (HELD while the coordinator waits for its agent after etcd trouble: ADR 0045).
                "state": _absent_state(view, r.node)
                if r.node not in view.nodes and r.state in LIVE_RANK_STATES
                else enum_name(pb.RankState, r.state, "RANK_"),
                "restarts": r.restart_count,
                "generation": r.generation,
                "exit_code": r.exit_code,
                "signal": r.signal,
                "node_alive": r.node in view.nodes,
            }
            for r in ranks
        ],
        "recovery": None,
    }
    if view.recovery is not None:
        rec = view.recovery
        out["recovery"] = {
            **_recovery_brief(rec),
            "fault_ranks": sorted({f.rank for f in rec.faults}),
            "participants": list(rec.participants),
            "reported": list(rec.reported),
            "deadline_at": iso(ts_to_s(rec.deadline_at)) if rec.HasField("deadline_at") else None,
            "outcome": rec.outcome,
        }
    return out


def format_status(data: dict[str, Any]) -> str:
    lines = [
        f"job {data['job']}  run {data['run']}  state {data['state']}"
        + (f" ({data['reason']})" if data["reason"] else ""),
        f"world size {data['world_size']} on {data['nnodes']} node(s); strategies {','.join(data['strategies'])}",
    ]
    if data["isolated"]:
        out = sorted(p["rank"] for p in data["isolated"])
        lines.append(
            f"downgraded: training with {data['world_size'] - len(out)} of {data['world_size']} ranks;"
            f" ranks {out} are isolated until a spare registers"
        )
    if data["warm_spares"]:
        waiting = "; ".join(f"{node}: pids {pids}" for node, pids in data["warm_spares"].items())
        lines.append(f"warm spare processes waiting for a rank: {waiting}")
    if data["spares"]:
        lines.append(f"idle spare node(s): {', '.join(data['spares'])}")
    rec = data["recovery"]
    if rec is None:
        lines.append("recovery: none so far")
    else:
        lines.append(
            f"recovery {rec['id']}: phase {rec['phase']}  epoch {rec['epoch']}  strategy {rec['strategy'] or '-'}"
            f"  fault ranks {rec['fault_ranks']}" + (f"  deadline {rec['deadline_at']}" if rec["deadline_at"] else "")
        )
    lines.append(f"{'RANK':>4}  {'NODE':<16} {'PID':>7}  {'STATE':<9} {'RESTARTS':>8} {'GEN':>4}  EXIT")
    for r in data["ranks"]:
        if r["signal"]:
            ended = f"signal {r['signal']}"
        elif r["state"] in ("SUCCEEDED", "FAILED", "STOPPED"):
            ended = f"code {r['exit_code']}"
        else:
            ended = "-"
        node = r["node"] + ("" if r["node_alive"] else " (lost)")
        lines.append(
            f"{r['rank']:>4}  {node:<16} {r['pid']:>7}  {r['state']:<9} {r['restarts']:>8}"
            f" {r['generation']:>4}  {ended}"
        )
    return "\n".join(lines)


def job_row(name: str, view: JobView) -> dict[str, Any]:
    """One line of ``recoverctl jobs``: state, ranks running of the world, live nodes, the recovery.

    A rank counts as running when its node's rank table says so and the node is live (its leased
    record is there): the table of a lost node keeps its last state. A job whose spec is bad or
    missing is listed with the reason in ``error`` (state ``BAD_SPEC`` / ``NO_SPEC``).
    """
    if view.spec is None:
        return {
            "job": name,
            "run": "",
            "state": "BAD_SPEC" if view.spec_error else "NO_SPEC",
            "error": printable(view.spec_error) if view.spec_error else "keys under the job but no spec record",
            "ranks_running": 0,
            "world_size": 0,
            "nodes": [],
            "nnodes": 0,
            "recovery": None,
        }
    running = {
        r.rank
        for node, table in view.ranks.items()
        if node in view.nodes
        for r in table.ranks
        if r.state == pb.RANK_RUNNING
    }
    return {
        "job": name,
        "run": view.spec.uid,
        "state": _state(view),
        "error": "",
        "ranks_running": len(running),
        "world_size": view.spec.world_size,
        "nodes": sorted(view.nodes),
        "nnodes": view.spec.nnodes,
        "recovery": _recovery_brief(view.recovery) if view.recovery is not None else None,
    }


def format_jobs(rows: Sequence[dict[str, Any]], prefix: str) -> str:
    if not rows:
        return f"no jobs under {prefix}"
    width = max(len("JOB"), *(len(row["job"]) for row in rows))
    lines = [f"{'JOB':<{width}}  {'STATE':<9} {'RANKS':>9} {'NODES':>7}  RECOVERY"]
    for row in rows:
        rec = row["recovery"]
        if row["error"]:
            recovery = row["error"]
        elif rec is None:
            recovery = "-"
        else:
            recovery = f"{rec['id']} {rec['phase']} {rec['strategy'] or '-'} (epoch {rec['epoch']})"
        ranks = f"{row['ranks_running']}/{row['world_size']}"
        nodes = f"{len(row['nodes'])}/{row['nnodes']}"
        lines.append(f"{row['job']:<{width}}  {row['state']:<9} {ranks:>9} {nodes:>7}  {recovery}")
    return "\n".join(lines)


def format_event(event: pb.Event) -> str:
    where = []
    if event.HasField("rank"):
        where.append(f"rank={event.rank}")
    if event.node:
        where.append(f"node={event.node}")
    if event.epoch:
        where.append(f"epoch={event.epoch}")
    return f"{iso(ts_to_s(event.at))}  {event.source:<16} {event.reason:<18} {event.message}" + (
        f"  [{' '.join(where)}]" if where else ""
    )


def decision_lines(decisions: Iterable[pb.Decision]) -> list[str]:
    lines = []
    for d in decisions:
        lines.append(f"epoch {d.epoch}  {iso(ts_to_s(d.decided_at))}  {d.strategy or 'GIVE UP'}  by {d.decided_by}")
        lines.extend(f"    move: {move.from_node} -> {move.to_node}" for move in d.moves)
        lines.extend(f"    {reason}" for reason in d.reasons)
    return lines


def stacks_list(hangs: Sequence[hangstacks.HangStacks], recovery: int | None, rank: int | None) -> list[dict[str, Any]]:
    """The ``hang_stacks`` of one recovery (``recovery``, else the last one that has any), each with
    its stacks (only ``rank``'s when given)."""
    if recovery is None and hangs:
        recovery = hangs[-1].recovery
    out = []
    for hang in hangs:
        if hang.recovery != recovery:
            continue
        out.append(
            {
                "recovery": hang.recovery,
                "fault_id": hang.fault_id,
                "kind": hang.kind,
                "rank": hang.event.rank,
                "node": hang.event.node,
                "at": iso(ts_to_s(hang.event.at)),
                "summary": hang.summary,
                "stacks": [
                    {"rank": s.rank, "pid": s.pid, "tool": s.tool, "where": s.where, "error": s.error, "text": s.text}
                    for s in hang.stacks
                    if rank is None or s.rank == rank
                ],
            }
        )
    return out


def format_stacks(data: list[dict[str, Any]]) -> str:
    lines: list[str] = []
    for hang in data:
        if lines:
            lines.append("")
        lines.append(
            f"recovery {hang['recovery']}: {hang['kind'] or 'fault'} of rank {hang['rank']} on {hang['node']}"
            f" ({hang['fault_id']}), stacks taken {hang['at']}"
        )
        lines.append(f"  {hang['summary']}")
        for stack in hang["stacks"]:
            head = f"--- rank {stack['rank']}  pid {stack['pid']}  {stack['tool'] or '-'}"
            if stack["text"]:
                lines.extend(["", f"{head}  in {stack['where'] or 'unknown'}", stack["text"].rstrip()])
            else:
                lines.extend(["", f"{head}  no stack: {stack['error'] or 'unknown reason'}"])
    return "\n".join(lines)
