"""Which agent does what once a strategy is decided: the pure command planning over the job's Layout.

`recover` and `elastic-training` act on whole nodes (upstream's node-wide expansion,
:func:`expand_to_nodes`): every rank of a faulty node becomes a fault rank. `recover` moves them to
a spare node (START_RANKS there, RELEASE_RANKS on the faulty node, which is forgotten if its agent is
gone); a downgrade releases them and records them as ``isolated``, and the job goes on with fewer
data-parallel replicas. An `exit` restarts every node of the job and takes isolated ranks back on
their own node when its agent is alive, and moves a lost node's ranks to the spare the selector
paired it with (its replacement: START_RANKS there), so it never waits for a dead agent. When
spares register while ranks are isolated, :func:`plan_upgrade` pairs each isolated node with a spare.

The recovery walk (``recovery.py``) numbers the commands and enters the phase; nothing here
changes a recovery except :func:`expand_to_nodes`, which adds faults.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from recoverd.coordinator.inputs import DecisionMade
from recoverd.coordinator.model import FaultInfo, Layout, Recovery

__all__ = ["Plan", "expand_to_nodes", "plan_commands", "plan_upgrade"]


@dataclass(frozen=True, slots=True)
class Plan:
    """What a decided strategy asks of the agents: (node, action, ranks) commands; lost nodes whose
    rank tables are forgotten (their RELEASE_RANKS is written but not awaited); the ranks isolated
    afterwards; and, when the strategy cannot be carried out at all, why (the job fails)."""

    commands: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
    forget: tuple[str, ...] = ()
    isolated: tuple[tuple[int, str], ...] = ()
    fail: str = ""


def plan_commands(rec: Recovery, event: DecisionMade, layout: Layout) -> Plan:
    """The commands that carry out ``event.strategy`` for ``rec``'s fault ranks."""
    # Fault ranks by the node that holds them now (a rank `recover` moved is on the spare), else
    # by the node the fault named.
    where = layout.where() if event.layout is not None else {}
    by_node: dict[str, set[int]] = {}
    for fault in rec.faults:
        by_node.setdefault(where.get(fault.rank, fault.node), set()).add(fault.rank)
    by_node.pop("", None)  # a rank on no known node: nothing to command
    # Without a layout (tests of the table, dump_exit's round) the nodes named are taken as alive;
    # an isolated node is not assumed back.
    live = layout.live if event.layout is not None else frozenset(by_node) | frozenset(event.nodes)
    strategy = event.strategy
    if strategy == "exit":
        return _plan_exit(rec, event, layout, where, by_node, live)
    if strategy == "recover-in-place":
        return Plan(
            commands=tuple((n, "RESTART_RANKS", tuple(sorted(by_node[n]))) for n in sorted(by_node)),
            isolated=rec.isolated,
        )
    if strategy == "recover":
        return _plan_recover(rec, event, layout, by_node, live)
    if strategy == "elastic-training":
        isolated_ranks = {r for r, _ in rec.isolated}
        commands = [(n, "RELEASE_RANKS", tuple(sorted(by_node[n]))) for n in sorted(by_node)]
        dropped = tuple((r, n) for n in sorted(by_node) for r in sorted(by_node[n]) if r not in isolated_ranks)
        forget = [n for n in sorted(by_node) if n not in live]
        return Plan(tuple(commands), tuple(forget), (*rec.isolated, *dropped))
    # retry and dump are carried out by the job itself: no command.
    return Plan(isolated=rec.isolated)


def _plan_exit(
    rec: Recovery,
    event: DecisionMade,
    layout: Layout,
    where: dict[int, str],
    by_node: dict[str, set[int]],
    live: frozenset[str],
) -> Plan:
    """`exit`: RESTART_ALL to every node of the job, each told which ranks it takes back."""
    isolated_ranks = {r for r, _ in rec.isolated}
    back: dict[str, set[int]] = {}
    # Ranks isolated by a downgrade come back on their own node if its agent is still there.
    for rank, node in rec.isolated:
        if node in live:
            back.setdefault(node, set()).add(rank)
    # Ranks held by no rank table (their spare died before starting them) go home.
    homeless: list[int] = []
    if event.layout is not None and layout.world_size and layout.nproc_per_node:
        homes = dict(layout.homes)
        for rank in range(layout.world_size):
            if rank in where or rank in isolated_ranks:
                continue
            home = homes.get(rank // layout.nproc_per_node)
            if home is None:
                homeless.append(rank)
            else:
                back.setdefault(home, set()).add(rank)
    if homeless:
        return Plan(fail=f"exit cannot restart ranks {homeless}: no live node holds them or is their home")
    moved = _exit_moves(event, layout, by_node, live)
    nodes = sorted((set(event.nodes) | set(by_node) | set(back)) - set(moved) - {s for s, _ in moved.values()})
    return Plan(
        commands=(
            *((n, "RESTART_ALL", tuple(sorted(back.get(n, ())))) for n in nodes),
            *((spare, "START_RANKS", ranks) for spare, ranks in (moved[n] for n in sorted(moved))),
        ),
        forget=tuple(sorted(moved)),
        isolated=tuple((r, n) for r, n in rec.isolated if n not in back or r not in back[n]),
    )


def _exit_moves(
    event: DecisionMade, layout: Layout, by_node: dict[str, set[int]], live: frozenset[str]
) -> dict[str, tuple[str, tuple[int, ...]]]:
    """lost node -> (its spare, its ranks) for an `exit` the selector paired with spares: the spare
    starts the ranks (START_RANKS, once no live node runs them) while every other node restarts its
    own, and the lost node is forgotten instead of awaited. Only pairs whose node is lost and whose
    spare is alive, as this pass read them."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for node, spare in event.moves:
        if node in live or (event.layout is not None and spare not in layout.live):
            continue
        ranks = tuple(sorted(set(layout.ranks_on(node)) | by_node.get(node, set())))
        if ranks:
            out[node] = (spare, ranks)
    return out


def _plan_recover(
    rec: Recovery, event: DecisionMade, layout: Layout, by_node: dict[str, set[int]], live: frozenset[str]
) -> Plan:
    """`recover`: each faulty node's ranks start on the spare the selector chose for it."""
    targets = dict(event.moves)
    commands: list[tuple[str, str, tuple[int, ...]]] = []
    forget = []
    for node in sorted(by_node):
        ranks = tuple(sorted(by_node[node]))
        spare = targets.get(node)
        if not spare or (event.layout is not None and spare not in layout.live):
            return Plan(fail=f"recover has no live spare for node {node}")
        commands.append((spare, "START_RANKS", ranks))
        # The faulty node gives its ranks up; a lost one is told so should its agent come back.
        commands.append((node, "RELEASE_RANKS", ranks))
        if node not in live:
            forget.append(node)
    return Plan(tuple(commands), tuple(forget), rec.isolated)


def expand_to_nodes(rec: Recovery, layout: Layout, now: float) -> Recovery:
    """Upstream's node-wide expansion: every rank of a faulty node becomes a fault rank."""
    have = {f.rank for f in rec.faults}
    added = tuple(
        FaultInfo(
            fault_id=f"node-wide.{node}.r{rank}.e{rec.epoch}",
            rank=rank,
            node=node,
            detected_at=now,
            detail=f"on faulty node {node} (node-wide expansion)",
        )
        for node in sorted({f.node for f in rec.faults if f.node})
        for rank in layout.ranks_on(node)
        if rank not in have
    )
    return dataclasses.replace(rec, faults=rec.faults + added) if added else rec


def plan_upgrade(
    isolated: tuple[tuple[int, str], ...], spares: tuple[str, ...]
) -> list[tuple[str, str, tuple[int, ...]]]:
    """Upstream's upgrade after a DP scale-in: (isolated node, spare, its ranks), one spare per
    isolated node in name order, as far as the spares go."""
    groups: dict[str, list[int]] = {}
    for rank, node in isolated:
        groups.setdefault(node, []).append(rank)
    return [(node, spare, tuple(sorted(groups[node]))) for node, spare in zip(sorted(groups), spares, strict=False)]
