"""``recoverctl inject`` and ``recoverctl drain``: faults made on purpose, for drills and maintenance.

``inject JOB --rank R --kind kill|exit|hang`` writes a drill for the agent of the node that runs
rank R (``drills/<node>``, docs/keyspace.md) and waits for the agent to take it: the agent records
it as an event and signals the rank (kill: SIGKILL, exit: SIGTERM, hang: SIGSTOP, only for a rank
that reports progress, so that the hang detector finds it); recoverd then
recovers the job as it would from the real fault. It is authorised by etcd: only a user allowed to
write the job's keys (its agent role, or the control plane's; docs/security.md) can ask, and who
asked is recorded. One drill per node at a time.

``drain JOB NODE`` asks recoverd to move the node's ranks off it before maintenance: one fault of
kind ``drain`` per rank on the node, which rules out restarting them in place, so the strategy
selector moves them to an idle spare node (``recover``). It refuses when the job has no idle
spare, which would otherwise restart the ranks where they are.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import secrets
import socket
import time

from recoverd import events
from recoverd.errors import ConfigError
from recoverd.jobview import JobView, idle_spares, read_job
from recoverd.keys import Keyspace, RunRef
from recoverd.records import decode, encode, pb, ts_from_s
from recoverd.store import Absent, Put, Store, WatchEvent
from recoverd.strategies import DRAIN_KIND
from recoverd.validate import DRILL_KINDS

__all__ = ["add_parsers", "drain", "inject", "run"]

SOURCE = "recoverctl"


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    inject_p = sub.add_parser(
        "inject",
        help="inject a fault for a drill: the rank's agent kills, stops or hangs it (recorded)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    inject_p.add_argument("job")
    inject_p.add_argument("--rank", type=int, required=True, help="the rank to fault")
    inject_p.add_argument("--kind", choices=DRILL_KINDS, default="kill", help="kill, exit or hang (%(default)s)")
    inject_p.add_argument("--reason", default="", help="why, for the record")
    inject_p.add_argument("--timeout", type=float, default=30.0, help="wait this long for the agent (%(default)s s)")
    inject_p.add_argument("--json", action="store_true", help="machine-readable output")
    drain_p = sub.add_parser(
        "drain",
        help="move a node's ranks to an idle spare node (through `recover`) before maintenance",
        description=__doc__.split("\n\n")[2] if __doc__ else None,
    )
    drain_p.add_argument("job")
    drain_p.add_argument("node")
    drain_p.add_argument("--reason", default="", help="why, for the record")
    drain_p.add_argument("--json", action="store_true", help="machine-readable output")


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _node_of(view: JobView, rank: int) -> str:
    for node, table in view.ranks.items():
        if any(status.rank == rank for status in table.ranks):
            return node
    raise ConfigError(f"rank {rank} is on no node of job {view.spec.name if view.spec else '?'} (recoverctl status)")


async def inject(store: Store, keys: Keyspace, view: JobView, args: argparse.Namespace) -> dict[str, object]:
    """Write the drill, wait for its agent to take it; the drill's event is the answer."""
    assert view.spec is not None and view.run is not None
    if not 0 <= args.rank < view.spec.world_size:
        raise ConfigError(f"job {view.spec.name} has ranks 0..{view.spec.world_size - 1}, not {args.rank}")
    node = _node_of(view, args.rank)
    drill = pb.Drill(
        drill_id=f"d{int(time.time())}-{secrets.token_hex(3)}", rank=args.rank, kind=args.kind,
        requested_by=_who(), requested_at=ts_from_s(time.time()), reason=args.reason,
    )  # fmt: skip
    key = keys.drill(view.run, node)
    note = events.event_put(
        keys, view.run, SOURCE, "drill_requested", f"drill {drill.drill_id} by {drill.requested_by}:"
        f" {args.kind} rank {args.rank} on node {node}" + (f" ({args.reason})" if args.reason else ""),
        rank=args.rank, node=node, data={"drill": drill.drill_id, "kind": args.kind},
    )  # fmt: skip
    start = await store.revision()
    if not (await store.txn([Absent(key)], [Put(key, encode(drill)), note])).succeeded:
        raise ConfigError(f"a drill is already pending on node {node}: its agent has not taken it (is it running?)")
    outcome = await _wait_taken(store, keys, view.run, drill.drill_id, start + 1, args.timeout)
    return {"drill": drill.drill_id, "job": view.spec.name, "rank": args.rank, "node": node, "kind": args.kind,
            "requested_by": drill.requested_by, **outcome}  # fmt: skip


async def _wait_taken(
    store: Store, keys: Keyspace, run: RunRef, drill_id: str, start: int, timeout_s: float
) -> dict[str, object]:
    """The agent's ``drill`` / ``drill_refused`` event for ``drill_id`` (watched, not polled)."""
    try:
        async with asyncio.timeout(timeout_s):
            async for item in store.watch_prefix(keys.events_prefix(run), start):
                if not isinstance(item, WatchEvent) or item.is_delete or not item.value:
                    continue
                event = decode(pb.Event, item.value, item.key)
                if event.data.get("drill") == drill_id and event.reason in ("drill", "drill_refused"):
                    return {"taken": event.reason == "drill", "message": event.message}
    except TimeoutError:
        pass
    return {"taken": False, "message": f"no agent took the drill within {timeout_s:g}s; it stays pending"}


async def drain(store: Store, keys: Keyspace, view: JobView, args: argparse.Namespace) -> dict[str, object]:
    """One ``drain`` fault per rank of the node, in one transaction, if an idle spare can take them."""
    assert view.spec is not None and view.run is not None
    table = view.ranks.get(args.node)
    ranks = sorted(status.rank for status in table.ranks) if table is not None else []
    if not ranks:
        raise ConfigError(f"node {args.node} runs no rank of job {view.spec.name}: nothing to drain")
    spares = idle_spares(view)
    if not spares:
        raise ConfigError(
            f"job {view.spec.name} has no idle spare node: draining {args.node} would restart its ranks where they"
            " are. Start one (recoverd agent --spare) and drain again"
        )
    who, now = _who(), time.time()
    detail = f"drained by {who}" + (f": {args.reason}" if args.reason else "")
    ops: list[Put] = []
    for rank in ranks:
        fault = pb.Fault(
            fault_id=f"drain-{args.node}-{rank}-{int(now)}",
            rank=rank,
            node=args.node,
            fault_type="1",
            source=pb.SOURCE_OPERATOR,
            kind=DRAIN_KIND,
            detail=detail,
            detected_at=ts_from_s(now),
        )
        ops.append(Put(keys.fault(view.run, fault.fault_id), encode(fault)))
    ops.append(
        events.event_put(
            keys,
            view.run,
            SOURCE,
            "drain_requested",
            f"node {args.node} drained by {who}: ranks {ranks} move to a spare ({', '.join(spares)} idle)",
            node=args.node,
        )
    )
    await store.txn([], ops)
    return {"job": view.spec.name, "node": args.node, "ranks": ranks, "spares": list(spares), "requested_by": who}


def describe(result: dict[str, object]) -> str:
    """One line for a person: what was asked and what the agent did."""
    if "drill" in result:
        message = str(result["message"])
        return message if message.startswith("drill ") else f"drill {result['drill']}: {message}"
    spares = ", ".join(str(s) for s in result["spares"])  # type: ignore[attr-defined]
    return (
        f"node {result['node']} of job {result['job']}: ranks {result['ranks']} move to a spare ({spares} idle);"
        f" follow it with: recoverctl status {result['job']}"
    )


async def run(store: Store, keys: Keyspace, args: argparse.Namespace) -> dict[str, object]:
    view = await read_job(store, keys, args.job)
    if view.spec is None or view.run is None:
        raise ConfigError(f"no job named {args.job!r} under {keys.prefix}")
    return await (inject if args.cmd == "inject" else drain)(store, keys, view, args)
