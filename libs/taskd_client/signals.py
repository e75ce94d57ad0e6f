"""The client's signal pipeline, pure: what a subscriber delivers, in MindCluster's wire form.

Upstream's legacy client (contract section 9) acts on ``killMaster`` before checking the job id and
loses the order of actions with ``set()``; here the job id is checked first (a signal for another
job is discarded, killMaster included), actions run in the order sent with duplicates removed,
keep-alives and empty action lists are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from recoverd.mindcluster import recover_pb2 as wire
from recoverd.records import pb

__all__ = ["KILL_MASTER", "Delivery", "fault_ranks_from_wire", "plan", "to_wire"]

KEEP_ALIVE = "keep-alive"
KILL_MASTER = "killMaster"


def to_wire(signal: pb.Signal, job_id: str) -> wire.ProcessManageSignal:
    """Our stored Signal as MindCluster's ProcessManageSignal."""
    return wire.ProcessManageSignal(
        uuid=signal.uuid,
        jobId=job_id,
        signalType=signal.signal_type,
        actions=list(signal.actions),
        faultRanks=[wire.FaultRank(rankId=f.rank_id, faultType=f.fault_type) for f in signal.fault_ranks],
        changeStrategy=signal.change_strategy,
        timeout=signal.timeout,
        nodeRankIds=list(signal.node_rank_ids),
        extraParams=signal.extra_params,
    )


def fault_ranks_from_wire(ranks: Iterable[wire.FaultRank]) -> dict[int, int]:
    """``{rank: faultType}`` as upstream's handlers receive it; malformed entries are skipped."""
    out: dict[int, int] = {}
    for item in ranks:
        try:
            out[int(item.rankId)] = int(item.faultType or "1")
        except ValueError:
            continue
    return out


@dataclass(frozen=True, slots=True)
class Delivery:
    """What to run for one signal: the actions in order (killMaster has none) and the fault ranks."""

    signal_type: str
    actions: tuple[str, ...]
    fault_ranks: dict[int, int]
    is_kill_master: bool = False


def plan(message: wire.ProcessManageSignal, job_id: str) -> Delivery | None:
    """Decide what a signal means for the subscriber of ``job_id``; None means "ignore it"."""
    if message.jobId and message.jobId != job_id:
        return None
    if message.signalType == KEEP_ALIVE:
        return None
    ranks = fault_ranks_from_wire(message.faultRanks)
    if message.signalType == KILL_MASTER:
        return Delivery(KILL_MASTER, (), ranks, is_kill_master=True)
    actions = tuple(dict.fromkeys(a for a in message.actions if a))
    if not actions:
        return None
    return Delivery(message.signalType, actions, ranks)
