"""A command's ack that etcd refuses is written again; the command is not carried out twice.

The agent writes a command's ack with its rank table, fenced on its registration. When its lease
was lost meanwhile (an etcd restart outlasting it: the chaos scenario etcd-kill-restart-deciding
saw it), the fence refuses the write while the agent registers again. The command had counted as
applied before its ack was written, so the ack never came: the recovery waited for its deadline,
failed `recover-in-place` and restarted the whole job with `exit`.

Simulated nodes (the real agent code over in-memory ranks, simnodes.py) against the real etcd,
coordinator and strategy selector; node 0's etcd connection refuses the first ack, as a lost fence
does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from recoverd.records import pb
from recoverd.store import Op, Put, Store, TxnResult

from .cluster import Cluster
from .simnodes import SimNodes

pytestmark = pytest.mark.etcd

JOB = "job-ack-refused"


def _refuse_the_first_ack(store: Store) -> list[str]:
    """Make ``store`` answer its first transaction that writes an ack as a failed compare (what a
    lost registration fence answers); returns the refused keys."""
    real = store.txn
    refused: list[str] = []

    async def txn(compares: Sequence[Any], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        acks = [op.key for op in success if isinstance(op, Put) and "/acks/" in op.key]
        if acks and not refused:
            refused.extend(acks)
            return TxnResult(succeeded=False, revision=await store.revision())
        return await real(compares, success, failure)

    store.txn = txn  # type: ignore[method-assign]
    return refused


def test_a_refused_ack_is_written_again_and_the_rank_restarted_once(cluster: Cluster) -> None:
    cluster.coordinator()
    cluster.strategy()
    sim = SimNodes(cluster.endpoint, cluster.prefix, JOB, 2, 2, ("recover-in-place", "exit"))
    try:
        sim.start()
        before = cluster.wait_running(JOB, 4, timeout=60)
        refused = _refuse_the_first_ack(sim.host.nodes[sim.node_name(0)].store)
        sim.crash(0)
        rec = cluster.wait_for(
            "the recovery DONE",
            lambda: (r := cluster.view(JOB).recovery) is not None and r.phase == pb.PHASE_DONE and r,
            timeout=30,
        )
        assert refused, "the ack was never refused: the test did not test anything"
        assert (rec.recovery_id, rec.strategy) == (1, "recover-in-place"), rec
        after = cluster.wait_running(JOB, 4, timeout=30)
        assert after[0].pid != before[0].pid and after[0].restart_count == before[0].restart_count + 1
        assert {r: s.pid for r, s in after.items() if r} == {r: s.pid for r, s in before.items() if r}
    finally:
        sim.close()
