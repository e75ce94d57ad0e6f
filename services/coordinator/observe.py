"""What a job's read says, in the state machine's terms: pure functions of a ``JobView``.

The shell reads a job's whole prefix at one revision (``recoverd.jobview.read_job``); these
functions derive from that one read who answers a recovery, where the ranks run, which nodes are
lost, which deadlines apply and whether the job is over. No I/O, no clock (``now`` is an argument
where a fault needs a detection time), nothing written.
"""

from __future__ import annotations

import dataclasses

from recoverd import participants
from recoverd.coordinator.model import FaultInfo, Layout, Recovery, Timeouts
from recoverd.jobview import JobView, idle_spares
from recoverd.records import pb

__all__ = [
    "all_succeeded",
    "job_layout",
    "job_nodes",
    "job_timeouts",
    "live_participants",
    "lost_node_faults",
]


def job_timeouts(policy: pb.Policy, default: Timeouts) -> Timeouts:
    """The job policy's deadlines where it sets them (non-zero), else the coordinator's own."""
    set_ = {
        name: getattr(policy.deadlines, name)
        for name in ("fault_window_s", "stop_s", "strategies_s", "decide_s", "recover_s")
        if getattr(policy.deadlines, name) > 0
    }
    return dataclasses.replace(default, **set_) if set_ else default


def lost_node_faults(view: JobView, now: float) -> list[FaultInfo]:
    """Faults for the ranks of nodes that are gone (lease expired) while their ranks ran.

    The ids are deterministic per rank incarnation, so seeing the same lost node again on the next
    pass merges nothing new (the state machine ignores a fault id it already holds).
    """
    faults = []
    for node, table in sorted(view.ranks.items()):
        if node in view.nodes:
            continue
        for rank in table.ranks:
            if rank.state in (pb.RANK_RUNNING, pb.RANK_PENDING):
                faults.append(
                    FaultInfo(
                        fault_id=f"lost.{node}.r{rank.rank}.g{rank.generation}.c{rank.restart_count}",
                        rank=rank.rank,
                        node=node,
                        source="lease",
                        generation=rank.generation,
                        detected_at=now,
                        detail=f"node {node} lost: its agent's lease expired",
                    )
                )
    return faults


def job_layout(view: JobView) -> Layout:
    """Where the ranks run, which agents are alive, which spares are idle and which live node is
    the home of each node rank, as the view shows."""
    assert view.spec is not None
    return Layout(
        placement=tuple(
            (node, tuple(sorted(r.rank for r in table.ranks))) for node, table in sorted(view.ranks.items())
        ),
        live=frozenset(view.nodes),
        spares=idle_spares(view),
        homes=tuple(sorted((record.node_rank, node) for node, record in view.nodes.items() if record.node_rank >= 0)),
        world_size=view.spec.world_size,
        nproc_per_node=view.spec.nproc_per_node,
    )


def job_nodes(view: JobView) -> tuple[str, ...]:
    """The nodes an `exit` restarts: every live agent's, and every dead one's that still holds ranks
    (its command then goes unconfirmed, and the exit fails rather than lose those ranks)."""
    holding = {node for node, table in view.ranks.items() if table.ranks}
    return tuple(sorted(set(view.nodes) | holding))


def live_participants(view: JobView) -> frozenset[str]:
    """Who answers a recovery: the job's live clients if it has any (MindCluster style, one
    controller per job), otherwise each live node agent for its own ranks."""
    if view.clients:
        return frozenset(participants.of_client(c) for c in view.clients)
    return frozenset(participants.of_node(n) for n in view.nodes)


def all_succeeded(view: JobView, rec: Recovery) -> bool:
    """Every rank still in the job exited 0 (ranks isolated by a downgrade are out of it)."""
    assert view.spec is not None
    states = {r.rank: r.state for nr in view.ranks.values() for r in nr.ranks}
    wanted = set(range(view.spec.world_size)) - {rank for rank, _ in rec.isolated}
    return bool(wanted) and all(states.get(rank) == pb.RANK_SUCCEEDED for rank in wanted)
