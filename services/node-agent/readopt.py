"""What a restarted agent does with the ranks its predecessor left running: a pure plan.

The ranks run in their own sessions and outlive the agent (losing the agent must not cost training
time). A new agent on the same node, joining the same live run, compares

* what etcd says this node ran (``ranks/<node>``: rank, pid, start time, state, generation), with
* what actually runs here for this run and node (processes whose environment names them),

and decides per rank: **adopt** the live incarnation the table names (same PID *and* start time:
a reused PID has another start time), report a rank that **died** while no agent watched it as a
fault, **keep** a rank that finished or is already being recovered as it is, **start** a rank that
has no incarnation, and **stop** every other process of this run and node (a duplicate, a rank
moved elsewhere meanwhile, a warm spare of the old agent). One process per rank, always.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from recoverd.agent.launcher import START_TIME_SLACK_S, FoundRank
from recoverd.records import LIVE_RANK_STATES, pb, ts_to_s

__all__ = ["AdoptionPlan", "plan_adoption"]


@dataclass(frozen=True, slots=True)
class AdoptionPlan:
    """Per rank of this node: what to do; plus the processes to stop."""

    #: rank -> (its recorded status, the live process found for it)
    adopt: dict[int, tuple[pb.RankStatus, FoundRank]] = field(default_factory=dict)
    #: rank -> its recorded status: it ran when the old agent died and is gone now (a fault)
    died: dict[int, pb.RankStatus] = field(default_factory=dict)
    #: rank -> its recorded status: succeeded, failed (a recovery has it) or stopped by a command
    keep: dict[int, pb.RankStatus] = field(default_factory=dict)
    #: ranks with no incarnation: started as on a first launch
    start: tuple[int, ...] = ()
    #: processes of this run and node that are no rank's current incarnation
    stop: tuple[FoundRank, ...] = ()


def plan_adoption(recorded: Sequence[pb.RankStatus], found: Iterable[FoundRank], mine: Iterable[int]) -> AdoptionPlan:
    """Decide what to do with each of ``mine`` (the ranks this node holds now) and with ``found``."""
    mine = set(mine)
    by_pid = {f.pid: f for f in found}
    plan = AdoptionPlan()
    adopted_pids: set[int] = set()
    start: list[int] = []
    table = {r.rank: r for r in recorded if r.rank in mine}
    for rank in sorted(mine):
        status = table.get(rank)
        if status is None:
            start.append(rank)
            continue
        if status.state in LIVE_RANK_STATES and status.pid > 0:
            proc = by_pid.get(status.pid)
            same = (
                proc is not None
                and proc.rank in (rank, -1)  # -1: a warm spare made this rank (its environment has no RANK)
                and abs(proc.started_at - ts_to_s(status.started_at)) <= START_TIME_SLACK_S
            )
            if same and proc is not None:
                plan.adopt[rank] = (status, proc)
                adopted_pids.add(proc.pid)
            else:
                plan.died[rank] = status
        elif status.state in (pb.RANK_SUCCEEDED, pb.RANK_FAILED):
            plan.keep[rank] = status
        else:
            # Stopped (by the old agent's end or a command it did not finish) or never started.
            start.append(rank)
    return AdoptionPlan(
        adopt=plan.adopt,
        died=plan.died,
        keep=plan.keep,
        start=tuple(start),
        stop=tuple(f for f in by_pid.values() if f.pid not in adopted_pids),
    )
