"""``recoverctl``: the operator's view of recoverd during an incident.

    recoverctl [--etcd URL] status JOB [--json]       ranks (node, pid, state, restarts) and the recovery phase
    recoverctl [--etcd URL] events JOB [--json]       the event log, one line each, oldest first
    recoverctl [--etcd URL] decisions JOB [--json]    every strategy decision with its reasons
    recoverctl [--etcd URL] timeline JOB [--json]     the last recovery phase by phase, with durations
    recoverctl [--etcd URL] stacks JOB [--recovery N] [--rank R] [--json]
                                                      the Python stacks captured before a hung rank was
                                                      stopped (the last recovery with stacks, or N)

    recoverctl [--etcd URL] policy show JOB [--json]  the job's policy, in the policy file's form
    recoverctl [--etcd URL] policy set JOB FILE       validate FILE, then make it the job's policy

Reads only, with one exception: ``policy set`` rewrites the job's spec record with the new policy,
in one transaction that compares the spec key's mod revision (and value) with what it read, so a
concurrent change makes it fail rather than be overwritten. It is the only write recoverctl makes;
an invalid file writes nothing. ``--json`` prints machine-readable output (proto3 JSON field
names). Exit status: 0 ok, 1 unknown job (or a job whose spec record is bad: the reason is
printed), 2 bad usage, a bad policy file, bad input or etcd unreachable, 3 an internal error. Every
failure is one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import yaml
from google.protobuf import json_format

from recoverd import etcd_security, hangstacks
from recoverd.cli import auth, drills
from recoverd.errors import ConfigError, RecoverdError
from recoverd.jobview import JobView, idle_spares, read_job
from recoverd.keys import DEFAULT_PREFIX, Keyspace, RunRef, printable
from recoverd.policy import JobPolicy, load_policy, policy_dict
from recoverd.records import decode, encode, pb, ts_to_s
from recoverd.store import Compare, ModRevisionAtMost, Put, Store, ValueIs

__all__ = ["main"]


class UnknownJob(RecoverdError):
    pass


def _iso(seconds: float) -> str:
    if not seconds:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds * 1000) % 1000:03d}Z"


def _as_dict(message: Any) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _enum(enum: Any, value: int, prefix: str) -> str:
    return str(enum.Name(value)).removeprefix(prefix)


async def _view(store: Store, keys: Keyspace, job: str) -> JobView:
    view = await read_job(store, keys, job)
    if view.spec_error:
        raise UnknownJob(f"job {job!r} is stored but its spec record is bad: {printable(view.spec_error)}")
    if view.spec is None or view.run is None:
        raise UnknownJob(f"no job named {job!r} under {keys.prefix}")
    return view


def status_dict(view: JobView) -> dict[str, Any]:
    assert view.spec is not None
    ranks = sorted((r for nr in view.ranks.values() for r in nr.ranks), key=lambda r: r.rank)
    out: dict[str, Any] = {
        "job": view.spec.name,
        "run": view.spec.uid,
        "world_size": view.spec.world_size,
        "nnodes": view.spec.nnodes,
        "strategies": list(view.spec.policy.strategies),
        "state": _enum(pb.JobState, view.status.state, "JOB_") if view.status else "RUNNING",
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
                "state": _enum(pb.RankState, r.state, "RANK_"),
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
            "id": rec.recovery_id,
            "epoch": rec.epoch,
            "phase": _enum(pb.Phase, rec.phase, "PHASE_"),
            "strategy": rec.strategy,
            "fault_ranks": sorted({f.rank for f in rec.faults}),
            "participants": list(rec.participants),
            "reported": list(rec.reported),
            "deadline_at": _iso(ts_to_s(rec.deadline_at)) if rec.HasField("deadline_at") else None,
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


async def _events(store: Store, keys: Keyspace, run: RunRef) -> list[pb.Event]:
    snap = await store.get_prefix(keys.events_prefix(run))
    out = []
    for kv in snap.kvs:
        try:
            out.append(decode(pb.Event, kv.value, kv.key))
        except RecoverdError:
            continue
    return out


def format_event(event: pb.Event) -> str:
    where = []
    if event.HasField("rank"):
        where.append(f"rank={event.rank}")
    if event.node:
        where.append(f"node={event.node}")
    if event.epoch:
        where.append(f"epoch={event.epoch}")
    return f"{_iso(ts_to_s(event.at))}  {event.source:<16} {event.reason:<18} {event.message}" + (
        f"  [{' '.join(where)}]" if where else ""
    )


def timeline_dict(view: JobView, hangs: Sequence[hangstacks.HangStacks] = ()) -> dict[str, Any] | None:
    """The last recovery as (phase, start offset, duration) rows, from the fault's detection on,
    with the grouped summary of any stacks captured for it (``hangs``: the job's ``hang_stacks``)."""
    rec = view.recovery
    if rec is None or not rec.phase_log:
        return None
    detected = min((ts_to_s(f.detected_at) for f in rec.faults), default=ts_to_s(rec.opened_at))
    entries = [(_enum(pb.Phase, e.phase, "PHASE_"), ts_to_s(e.at), e.epoch) for e in rec.phase_log]
    rows = [
        {
            "phase": "DETECTED",
            "epoch": entries[0][2],
            "at_ms": 0.0,
            "duration_ms": round((entries[0][1] - detected) * 1000, 1),
        }
    ]
    for i, (phase, at, epoch) in enumerate(entries):
        end = entries[i + 1][1] if i + 1 < len(entries) else None
        rows.append(
            {
                "phase": phase,
                "epoch": epoch,
                "at_ms": round((at - detected) * 1000, 1),
                "duration_ms": round((end - at) * 1000, 1) if end is not None else None,
            }
        )
    return {
        "recovery": rec.recovery_id,
        "strategy": rec.strategy,
        "fault_ranks": sorted({f.rank for f in rec.faults}),
        "detected_at": _iso(detected),
        "total_ms": round((entries[-1][1] - detected) * 1000, 1),
        "phases": rows,
        "stacks": [
            {"fault_id": h.fault_id, "rank": h.event.rank, "node": h.event.node, "summary": h.summary}
            for h in hangs
            if h.recovery == rec.recovery_id
        ],
    }


def format_timeline(data: dict[str, Any] | None) -> str:
    if data is None:
        return "no recovery so far"
    lines = [
        f"recovery {data['recovery']}: ranks {data['fault_ranks']}, strategy {data['strategy'] or '-'},"
        f" fault detected {data['detected_at']}, {data['total_ms']:.1f} ms to the last phase",
    ]
    for hang in data.get("stacks", []):
        lines.append(f"stacks at rank {hang['rank']} on {hang['node']}: {hang['summary']} (recoverctl stacks)")
    lines.append(f"{'PHASE':<14} {'EPOCH':>5} {'AT (ms)':>9} {'TOOK (ms)':>10}")
    for row in data["phases"]:
        took = "-" if row["duration_ms"] is None else f"{row['duration_ms']:.1f}"
        lines.append(f"{row['phase']:<14} {row['epoch']:>5} {row['at_ms']:>9.1f} {took:>10}")
    return "\n".join(lines)


def _hangs(evs: Sequence[pb.Event]) -> list[hangstacks.HangStacks]:
    return [h for e in evs if (h := hangstacks.from_event(e)) is not None]


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
                "at": _iso(ts_to_s(hang.event.at)),
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


async def set_policy(store: Store, keys: Keyspace, job: str, policy: JobPolicy) -> pb.JobSpec:
    """Replace the policy in ``job``'s spec; the write fails if the spec changed since it was read.

    What the file does not set keeps the job's current strategies and flag-level budgets
    (``JobPolicy.to_pb``); deadlines, budgets, spares and allow_rank0_in_place are replaced.
    """
    key = keys.job_spec(job)
    kv = await store.get(key)
    if kv is None:
        raise UnknownJob(f"no job named {job!r} under {keys.prefix}")
    spec = decode(pb.JobSpec, kv.value, key)
    spec.policy.CopyFrom(policy.to_pb(spec.policy))
    compare: list[Compare] = [ValueIs(key, kv.value), ModRevisionAtMost(key, kv.mod_revision)]
    result = await store.txn(compare, [Put(key, encode(spec))])
    if not result.succeeded:
        raise ConfigError(f"job {job}'s spec changed while the policy was being set; nothing written, run it again")
    return spec


async def _policy(store: Store, keys: Keyspace, args: argparse.Namespace) -> int:
    if args.policy_cmd == "set":
        spec = await set_policy(store, keys, args.job, args.policy_file)
        print(f"policy of job {args.job} (run {spec.uid}) set from {args.file}:")
    else:
        view = await _view(store, keys, args.job)
        assert view.spec is not None
        spec = view.spec
        if args.json:
            print(json.dumps(policy_dict(spec.policy), indent=2))
            return 0
    print(yaml.safe_dump(policy_dict(spec.policy), sort_keys=False).rstrip())
    return 0


async def _run(args: argparse.Namespace) -> int:
    keys = Keyspace(args.prefix)
    security = etcd_security.from_args(args)
    async with Store(args.etcd, connect_timeout_s=args.timeout, op_timeout_s=args.timeout, security=security) as store:
        await store.verify()
        if args.cmd == "auth":
            return await auth.run(store, keys, args)
        if args.cmd in ("inject", "drain"):
            result = await drills.run(store, keys, args)
            print(json.dumps(result, indent=2) if args.json else drills.describe(result))
            return 0 if result.get("taken", True) else 1
        if args.cmd == "policy":
            return await _policy(store, keys, args)
        view = await _view(store, keys, args.job)
        assert view.run is not None
        if args.cmd == "status":
            data = status_dict(view)
            print(json.dumps(data, indent=2) if args.json else format_status(data))
        elif args.cmd == "events":
            evs = await _events(store, keys, view.run)
            if args.json:
                print(json.dumps([_as_dict(e) for e in evs], indent=2))
            else:
                for event in evs:
                    print(format_event(event))
        elif args.cmd == "timeline":
            timeline = timeline_dict(view, _hangs(await _events(store, keys, view.run)))
            print(json.dumps(timeline, indent=2) if args.json else format_timeline(timeline))
        elif args.cmd == "stacks":
            found = stacks_list(_hangs(await _events(store, keys, view.run)), args.recovery, args.rank)
            if args.json:
                print(json.dumps(found, indent=2))
            elif not found:
                which = f" in recovery {args.recovery}" if args.recovery is not None else ""
                print(f"no stacks recorded for job {args.job}{which}")
            else:
                print(format_stacks(found))
        elif args.cmd == "decisions":
            decisions = [view.decisions[e] for e in sorted(view.decisions)]
            if args.json:
                print(json.dumps([_as_dict(d) for d in decisions], indent=2))
            else:
                for d in decisions:
                    print(
                        f"epoch {d.epoch}  {_iso(ts_to_s(d.decided_at))}  {d.strategy or 'GIVE UP'}  by {d.decided_by}"
                    )
                    for move in d.moves:
                        print(f"    move: {move.from_node} -> {move.to_node}")
                    for reason in d.reasons:
                        print(f"    {reason}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recoverctl", description="Inspect recoverd jobs in etcd.")
    parser.add_argument(
        "--etcd", default=os.environ.get("RECOVERD_ETCD"), help="etcd endpoints (default: $RECOVERD_ETCD)"
    )
    parser.add_argument("--prefix", default=os.environ.get("RECOVERD_PREFIX", DEFAULT_PREFIX), help="%(default)s")
    parser.add_argument("--timeout", type=float, default=5.0, help="etcd timeout in seconds (%(default)s)")
    etcd_security.add_arguments(parser)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for name, text in (
        ("status", "ranks and the current recovery of a job"),
        ("events", "the event log of a job, oldest first"),
        ("decisions", "the strategy decisions of a job, with reasons"),
        ("timeline", "the last recovery of a job phase by phase, with durations"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("job")
        cmd.add_argument("--json", action="store_true", help="machine-readable output")
    stacks = sub.add_parser(
        "stacks",
        help="the Python stacks taken before a hung rank was stopped (docs/detectors.md)",
        description="The Python stacks (py-spy or faulthandler) of a hung rank and its node's peers, taken"
        " before the rank was stopped, with where each one was. Default: the last recovery that has stacks.",
    )
    stacks.add_argument("job")
    stacks.add_argument("--recovery", type=int, metavar="N", help="the stacks of recovery N (recoverctl timeline)")
    stacks.add_argument("--rank", type=int, metavar="R", help="only rank R's stack")
    stacks.add_argument("--json", action="store_true", help="machine-readable output")
    policy = sub.add_parser("policy", help="show or set a job's policy (docs/policy.md)")
    policy_sub = policy.add_subparsers(dest="policy_cmd", required=True, metavar="ACTION")
    show = policy_sub.add_parser("show", help="the job's policy, in the policy file's form")
    show.add_argument("job")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    set_ = policy_sub.add_parser("set", help="validate FILE, then make it the job's policy (the only write)")
    set_.add_argument("job")
    set_.add_argument("file")
    auth.add_parser(sub)
    drills.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    # One line per failure: library warnings (a known-bad etcd release, which the services log)
    # would bury the answer; errors still show, as "recoverctl: ..." lines.
    logging.basicConfig(level=logging.ERROR, format="recoverctl: %(message)s")
    if not args.etcd:
        print("recoverctl: error: no etcd endpoint (--etcd or RECOVERD_ETCD)", file=sys.stderr)
        sys.exit(2)
    try:
        if args.cmd == "policy" and args.policy_cmd == "set":
            args.policy_file = load_policy(args.file)  # a bad file is refused before etcd is touched
        code = asyncio.run(_run(args))
    except UnknownJob as err:
        print(f"recoverctl: {err.detail}", file=sys.stderr)
        code = 1
    except RecoverdError as err:
        print(f"recoverctl: error: {printable(str(err))}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    except Exception as err:  # an operator tool during an incident: one line, never a traceback
        print(f"recoverctl: internal error: {printable(repr(err))[:500]}", file=sys.stderr)
        code = 3
    sys.exit(code)


if __name__ == "__main__":
    main()
