"""What a job's read says, in the state machine's terms: pure functions of a ``JobView``.

The shell reads a job's whole prefix at one revision (``recoverd.jobview.read_job``); these
functions derive from that one read the state machine's inputs (``inputs.py``): which fault keys
are real faults of this run, which nodes are lost, who answers a recovery, which reports and
decision answer the current round, where the ranks run, which deadlines apply and whether the job
is over. No I/O, no clock (``now`` is an argument where a fault needs a detection time), nothing
written: ``fold.py`` decides what is consumed and recorded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from recoverd import participants
from recoverd.coordinator.codec import fault_from_pb
from recoverd.coordinator.inputs import DecisionMade, Event, RecoverStatusReported, StopCompleted, StrategiesReported
from recoverd.coordinator.model import WAITING_PHASES, FaultInfo, Layout, Phase, Recovery, Timeouts
from recoverd.errors import Reason, UnknownRank
from recoverd.jobview import JobView, idle_spares
from recoverd.policy import replacement_wait_s
from recoverd.records import LIVE_RANK_STATES, pb, ts_to_s
from recoverd.strategies import ALL_STRATEGIES

__all__ = [
    "ANSWERS",
    "Rejection",
    "all_succeeded",
    "decision_input",
    "empty_rank_tables",
    "finished_at",
    "implied_answers",
    "job_layout",
    "job_nodes",
    "job_timeouts",
    "live_participants",
    "lost_node_faults",
    "pending_faults",
    "rank_generations",
    "report_input",
    "screen_fault",
]

#: The report kind that answers each waiting phase; any other kind is not for this phase.
ANSWERS: dict[Phase, int] = {
    Phase.STOPPING: pb.REPORT_STOP_COMPLETE,
    Phase.GLOBAL_FAULT: pb.REPORT_STRATEGIES,
    Phase.RECOVERING: pb.REPORT_RECOVER_STATUS,
}


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a fault key is not merged: recorded as an event with this reason (and the rank or node
    it names); the key is consumed all the same."""

    reason: str
    detail: str
    rank: int | None = None
    node: str = ""


def job_timeouts(policy: pb.Policy, default: Timeouts) -> Timeouts:
    """The job policy's deadlines where it sets them (non-zero), else the coordinator's own; the
    replacement wait always from the policy (the selector reads the same: policy.replacement_wait_s)."""
    set_: dict[str, float] = {
        name: getattr(policy.deadlines, name)
        for name in ("fault_window_s", "stop_s", "strategies_s", "decide_s", "recover_s")
        if getattr(policy.deadlines, name) > 0
    }
    wait = replacement_wait_s(policy)
    if wait != default.replacement_s:
        set_["replacement_s"] = wait
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
            if rank.state in LIVE_RANK_STATES:
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


def live_participants(view: JobView, rec: Recovery) -> frozenset[str]:
    """Who answers ``rec``: the job's live clients if it has any (MindCluster style, one controller
    per job); otherwise the node agents, each answering itself only where it alone can
    (``participants.agent_reports``): the live nodes that hold a fault rank of ``rec`` (they stop
    them), the agents whose records declare no strategies, and the agents that answer for their
    ranks' clients (docs/adr/0036: each speaks for its ranks, one report per phase); every other
    live agent is answered for by the coordinator, as :data:`~recoverd.participants.AGENTS`
    (docs/adr/0029). With no live agent at all, nobody answers, and the phase waits for its
    deadline or a node."""
    if view.clients:
        return frozenset(participants.of_client(c) for c in view.clients)
    if not view.nodes:
        return frozenset()
    holders = {f.node for f in rec.faults} & view.nodes.keys()
    undeclared = {name for name, record in view.nodes.items() if not record.strategies}
    speaking = {name for name, record in view.nodes.items() if record.answers_for_ranks}
    return frozenset({participants.AGENTS, *(participants.of_node(n) for n in holders | undeclared | speaking)})


def implied_answers(view: JobView, rec: Recovery) -> list[Event]:
    """The answers of the current waiting phase that no agent writes (docs/adr/0029).

    * For :data:`~recoverd.participants.AGENTS` and for any participating agent that does not
      report in this phase: stopped (nothing of theirs to stop), the strategies their node records
      declare (for AGENTS: what every live agent declares), or recovered (nothing to confirm).
    * In RECOVERING, a commanded node's answer is its ack of this epoch's command: ok, or code 1
      with the ack's detail. An agent that answers for its ranks reports a strategy carried out in
      the job (``participants.JOB_STRATEGIES``) itself.
    Answers already counted are not given again.
    """
    if rec.phase not in WAITING_PHASES:
        return []
    declared = {participants.of_node(n): tuple(r.strategies) for n, r in view.nodes.items() if r.strategies}
    speaking = {participants.of_node(n) for n, r in view.nodes.items() if r.answers_for_ranks}
    every = set(ALL_STRATEGIES)
    for offered in declared.values():
        every &= set(offered)
    commanded = {participants.of_node(n): n for n in rec.command_nodes}
    out: list[Event] = []
    for who in sorted((rec.participants | commanded.keys()) - rec.reported):
        if rec.phase is Phase.RECOVERING and who in commanded:
            ack = view.acks.get(commanded[who])
            if ack is not None and ack.epoch == rec.epoch:
                code = 0 if ack.ok else 1
                out.append(RecoverStatusReported(rec.epoch, who, code, rec.strategy, "" if ack.ok else ack.detail))
            continue
        if (
            rec.phase is Phase.STOPPING
            and participants.is_agent(who)
            and who not in speaking  # its other ranks acknowledge the stop first (ADR 0036)
            and _nothing_to_stop(view, rec, who)
        ):
            out.append(StopCompleted(rec.epoch, who))
            continue
        if who != participants.AGENTS and (
            not participants.is_agent(who)
            or participants.agent_reports(
                rec.phase.value, declared=who in declared, answers_for_ranks=who in speaking, strategy=rec.strategy
            )
        ):
            continue  # a client, or an agent that answers this phase itself
        if rec.phase is Phase.STOPPING:
            out.append(StopCompleted(rec.epoch, who))
        elif rec.phase is Phase.GLOBAL_FAULT:
            offered = declared.get(who) or tuple(s for s in ALL_STRATEGIES if s in every)
            out.append(StrategiesReported(rec.epoch, who, offered))
        else:
            out.append(RecoverStatusReported(rec.epoch, who, 0, rec.strategy))
    return out


#: Rank states with no process behind them.
_ENDED = frozenset({pb.RANK_SUCCEEDED, pb.RANK_FAILED, pb.RANK_STOPPED})


def _nothing_to_stop(view: JobView, rec: Recovery, agent: str) -> bool:
    """Whether every fault rank of ``rec`` that ``agent``'s node holds has ended in the life the
    fault is about, as its rank table says: its stop is complete before it could say so (a rank
    that exited is written to the table with, or before, its fault). Saves a round trip on the
    usual fault, a process that died; a hung rank is still running, and its agent answers once
    it has stopped it."""
    node = participants.node_of(agent)
    table = view.ranks.get(node)
    if table is None:
        return False
    rows = {r.rank: r for r in table.ranks}
    held = [f for f in rec.faults if f.node == node]
    # The same life of the rank as the fault's: one restarted since (a later round) runs again.
    return bool(held) and all(
        (row := rows.get(f.rank)) is not None and row.state in _ENDED and row.generation == f.generation for f in held
    )


def all_succeeded(view: JobView, rec: Recovery) -> bool:
    """Every rank still in the job exited 0 (ranks isolated by a downgrade are out of it)."""
    assert view.spec is not None
    states = {r.rank: r.state for nr in view.ranks.values() for r in nr.ranks}
    wanted = set(range(view.spec.world_size)) - {rank for rank, _ in rec.isolated}
    return bool(wanted) and all(states.get(rank) == pb.RANK_SUCCEEDED for rank in wanted)


def finished_at(view: JobView) -> float | None:
    """When the job finished (its status is final), or None while it runs."""
    if view.status is not None and view.status.state in (pb.JOB_SUCCEEDED, pb.JOB_FAILED):
        return ts_to_s(view.status.finished_at)
    return None


def pending_faults(view: JobView) -> list[tuple[str, pb.Fault]]:
    """The fault keys of the run and their records, oldest first (ties by key)."""
    return sorted(view.faults.items(), key=lambda item: (ts_to_s(item[1].detected_at), item[0]))


def rank_generations(view: JobView) -> dict[int, int]:
    """rank -> the generation its rank table says it runs."""
    return {r.rank: r.generation for nr in view.ranks.values() for r in nr.ranks}


def screen_fault(fault: pb.Fault, view: JobView, generations: Mapping[int, int]) -> FaultInfo | Rejection:
    """The fault a fault record reports, or why it is not one of this run's: a rank outside the
    world, or a generation the rank has already left behind (a late report of an earlier life).

    A client reports ranks, not nodes: a fault without a node gets the node whose rank table
    holds the rank ("" if none does).
    """
    assert view.spec is not None
    world = view.spec.world_size
    if not 0 <= fault.rank < world:
        err = UnknownRank(f"fault {fault.fault_id} names rank {fault.rank}; the job has ranks 0..{world - 1}")
        return Rejection(err.reason, err.detail, node=fault.node)
    if fault.generation < generations.get(fault.rank, 0):
        return Rejection(
            Reason.STALE_EPOCH,
            f"fault {fault.fault_id} is for generation {fault.generation} of rank {fault.rank},"
            f" which already runs generation {generations[fault.rank]}",
            rank=fault.rank,
        )
    info = fault_from_pb(fault)
    if not fault.node:
        node = next((n for n, t in view.ranks.items() if any(r.rank == fault.rank for r in t.ranks)), "")
        info = dataclasses.replace(info, node=node)
    return info


def report_input(report: pb.Report, phase: Phase) -> StopCompleted | StrategiesReported | RecoverStatusReported | None:
    """The input a report for the current epoch is, or None when it does not answer ``phase``."""
    if ANSWERS.get(phase) != report.kind:
        return None
    if report.kind == pb.REPORT_STOP_COMPLETE:
        return StopCompleted(report.epoch, report.participant, report.code)
    if report.kind == pb.REPORT_STRATEGIES:
        return StrategiesReported(report.epoch, report.participant, tuple(report.strategies))
    return RecoverStatusReported(report.epoch, report.participant, report.code, report.strategy, report.message)


def decision_input(view: JobView, rec: Recovery, nodes: tuple[str, ...], layout: Layout) -> DecisionMade | None:
    """The selector's decision for the current epoch, while the recovery waits for one."""
    if rec.phase is not Phase.DECIDING or rec.epoch not in view.decisions:
        return None
    decision = view.decisions[rec.epoch]
    moves = tuple((m.from_node, m.to_node) for m in decision.moves)
    return DecisionMade(rec.epoch, decision.strategy, tuple(decision.reasons), decision.give_up, nodes, moves, layout)


def empty_rank_tables(view: JobView) -> list[str]:
    """Nodes whose agent is gone and whose rank table holds nothing: the tables can go."""
    return [node for node, table in sorted(view.ranks.items()) if node not in view.nodes and not table.ranks]
