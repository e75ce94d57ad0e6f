"""MindCluster's wire forms of what the coordinator signals (reference/mindcluster-contract.md).

Clients written for MindCluster read a signal's ``changeStrategy``, ``extraParams`` and fault ranks
exactly as ClusterD sends them; our strategy names are not always upstream's, so this module is the
one place that translates. Pure.
"""

from __future__ import annotations

from recoverd.coordinator.model import Recovery

__all__ = ["DUMP_EXIT", "UPGRADE_EXTRA", "fault_wire", "wire_strategy"]

#: upstream's extraParams of the `exit` that follows a saved `dump` (dump_exit).
DUMP_EXIT = "dump_exit"

#: upstream's extraParams of an upgrade (isolated ranks brought back on a spare).
UPGRADE_EXTRA = '{"scale-out-strategy": "DP"}'


def wire_strategy(strategy: str) -> tuple[str, str, tuple[str, ...]]:
    """MindCluster's wire form of a strategy: (changeStrategy, extraParams, extra actions)."""
    if strategy == "recover-in-place":
        return "recover", "recover-in-place", ("fault_nodes_restart",)
    if strategy == "elastic-training":
        return "downgrade", '{"scale-in-strategy": "DP"}', ()
    return strategy, "", ()


def fault_wire(rec: Recovery) -> tuple[tuple[int, str], ...]:
    """The fault ranks of a signal: (rank, fault type) once per rank, sorted by rank."""
    by_rank: dict[int, str] = {}
    for fault in rec.faults:
        # A non-retryable fault ("1") outweighs retryable ones on the same rank.
        if by_rank.get(fault.rank) != "1":
            by_rank[fault.rank] = fault.fault_type
    return tuple(sorted(by_rank.items()))
