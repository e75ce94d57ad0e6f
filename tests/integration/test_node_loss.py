"""A node sent a command that dies before confirming it fails the strategy at its lease's expiry, not
at the recover deadline (docs/adr/0025).

First one coordinator pass at a time against the real etcd (tests/integration/untrusted.py: a
recovery record in RECOVERING, node records under real leases); then end to end, with real agents:
a spare told to start a faulty node's ranks dies before it starts them.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pytest

from recoverd.coordinator.codec import recovery_to_pb
from recoverd.coordinator.model import FaultInfo, Phase, Recovery
from recoverd.keys import Keyspace
from recoverd.records import decode, encode, pb
from recoverd.store import Store

from .cluster import Cluster
from .untrusted import Job, drain, events, leader, seed_job

pytestmark = pytest.mark.etcd

#: Far beyond anything a test waits for: a recovery that ends did not end by its deadline.
FAR_S = 600.0


async def _recovering(
    store: Store, keys: Keyspace, job: Job, *, strategy: str, command_nodes: set[str], faults: tuple[FaultInfo, ...]
) -> None:
    """Put the job's recovery in RECOVERING, awaiting ``command_nodes``, with a far deadline."""
    now = time.time()
    rec = Recovery(
        phase=Phase.RECOVERING,
        epoch=3,
        recovery_id=1,
        opened_at=now,
        deadline_at=now + FAR_S,
        faults=faults,
        participants=frozenset({"agent.n0", "agent.n1", "agent.s0"}),
        strategy=strategy,
        command_seq=2,
        command_nodes=frozenset(command_nodes),
        phase_log=((Phase.RECOVERING, now, 3),),
    )
    await store.put(keys.recovery(job.run), encode(recovery_to_pb(rec, "uuid-3")))


async def _read(store: Store, keys: Keyspace, job: Job) -> pb.Recovery:
    kv = await store.get(keys.recovery(job.run))
    assert kv is not None
    return decode(pb.Recovery, kv.value)


async def _spare(store: Store, keys: Keyspace, job: Job) -> int:
    """A spare node, s0, registered under its own lease (no rank table: it runs nothing yet)."""
    lease = await store._grant(60)
    record = pb.NodeRecord(node="s0", node_rank=-1, host="h", agent_pid=1, is_spare=True)
    await store.put(keys.node(job.run, "s0"), encode(record), lease=lease)
    return lease


RANK3_ON_N1 = (FaultInfo("n1.r3.g0.c0", 3, "n1", detected_at=1.0),)


async def test_a_spare_lost_before_it_confirmed_fails_the_recover_at_once(store: Store, keys: Keyspace) -> None:
    lease = await store._grant(60)
    job = await seed_job(store, keys, "job-nl", nnodes=2, nproc=2, lease=lease, strategies=("recover", "exit"))
    spare = await _spare(store, keys, job)
    coordinator = await leader(store, keys)
    await _recovering(store, keys, job, strategy="recover", command_nodes={"s0", "n1"}, faults=RANK3_ON_N1)
    await drain(coordinator, job.name)
    assert (await _read(store, keys, job)).phase == pb.PHASE_RECOVERING  # s0 lives: nothing to do

    await store._revoke(spare)  # its lease ends (as at expiry): s0's node key is gone
    await drain(coordinator, job.name)
    rec = await _read(store, keys, job)
    assert (rec.phase, rec.epoch, rec.strategy) == (pb.PHASE_DECIDING, 4, "")
    assert [(f.strategy, f.reason) for f in rec.failed_strategies] == [
        ("recover", "commanded node(s) ['s0'] lost before confirming (lease expired)")
    ]
    assert len(await events(store, keys, job.run, "strategy_failed")) == 1


async def test_a_clobbered_commanded_spare_counts_as_live_for_its_grace(store: Store, keys: Keyspace) -> None:
    lease = await store._grant(60)
    job = await seed_job(store, keys, "job-nl", nnodes=2, nproc=2, lease=lease, strategies=("recover", "exit"))
    await _spare(store, keys, job)
    coordinator = await leader(store, keys)
    await _recovering(store, keys, job, strategy="recover", command_nodes={"s0"}, faults=RANK3_ON_N1)
    # Overwritten without its lease (a plain `etcdctl put`): its agent rewrites it at once, so the
    # recovery must not take the spare for lost meanwhile (the grace of a clobbered node record).
    await store.put(keys.node(job.run, "s0"), b"garbage")
    await drain(coordinator, job.name)
    rec = await _read(store, keys, job)
    assert (rec.phase, rec.strategy, list(rec.failed_strategies)) == (pb.PHASE_RECOVERING, "recover", [])
    assert await store.get(keys.node(job.run, "s0")) is not None, "removed before its grace"


async def test_a_node_lost_before_its_exit_command_is_awaited(store: Store, keys: Keyspace) -> None:
    """An `exit` commands a node that was lost before (its lease faults are in the recovery): its
    agent may still come back and carry the command out (docs/adr/0023), so only the deadline ends it."""
    lease = await store._grant(60)
    job = await seed_job(store, keys, "job-nl", nnodes=2, nproc=2, lease=lease, strategies=("exit",))
    coordinator = await leader(store, keys)
    lost = tuple(FaultInfo(f"lost.n1.r{r}.g0.c0", r, "n1", source="lease", detected_at=1.0) for r in (2, 3))
    await _recovering(store, keys, job, strategy="exit", command_nodes={"n0", "n1"}, faults=lost)
    await store.delete(keys.node(job.run, "n1"))  # n1's lease expired before the exit was decided
    await drain(coordinator, job.name)
    rec = await _read(store, keys, job)
    assert (rec.phase, rec.strategy) == (pb.PHASE_RECOVERING, "exit")
    assert sorted(rec.command_nodes) == ["n0", "n1"]


def test_a_spare_that_dies_before_starting_the_ranks_fails_the_recover_at_its_lease_expiry(cluster: Cluster) -> None:
    """End to end: node-b's rank crashes, `recover` is decided for spare-0, and spare-0 dies before it
    starts the ranks (no rank table, so no lost-node fault). With a 600 s recover deadline, the
    strategy must fail when spare-0's lease expires, and `exit` then brings the ranks back home."""
    job = "job-spare-dies"
    strategies = "recover,exit"
    cluster.coordinator(extra=("--recover-timeout", str(FAR_S)))
    cluster.strategy()
    for i, node in enumerate(("node-a", "node-b")):
        cluster.agent(job, node, nproc=2, nnodes=2, node_rank=i, strategies=strategies)
    before = cluster.wait_running(job, 4)
    # The spare's lease outlives the moments between its pause and the decision (8 s; the others' 1 s).
    spare_extra = ("--spare", "--agent-lease-ttl", "8")
    cluster.agent(job, "spare-0", nproc=2, nnodes=2, strategies=strategies, extra=spare_extra)
    cluster.wait_for("the spare to register", lambda: "spare-0" in cluster.view(job).nodes)

    # Hold the selector, so that the spare can be stopped before it is told anything.
    cluster.pause("strategy")
    os.kill(before[3].pid, signal.SIGKILL)
    cluster.wait_for("the recovery to wait for a decision", lambda: _phase(cluster, job) == pb.PHASE_DECIDING)
    cluster.pause("agent-spare-0")  # alive as far as etcd knows, until its lease runs out
    cluster.resume("strategy")
    recovering = cluster.wait_for(
        "recover to be sent to spare-0", lambda: _recovery_if(cluster, job, lambda r: "spare-0" in r.command_nodes)
    )
    assert recovering.strategy == "recover"
    cluster.kill("agent-spare-0")  # dies with the command unconfirmed (it holds no ranks)

    failed = cluster.wait_for(
        "recover to fail at the spare's lease expiry",
        lambda: _recovery_if(cluster, job, lambda r: bool(r.failed_strategies)),
        timeout=60,  # far below the 600 s recover deadline
    )
    assert [(f.strategy, f.reason) for f in failed.failed_strategies] == [
        ("recover", "commanded node(s) ['spare-0'] lost before confirming (lease expired)")
    ]
    # `exit` follows: ranks 2 and 3 go home to node-b, which released them.
    cluster.wait_for(
        "exit to bring every rank back",
        lambda: _recovery_if(cluster, job, lambda r: r.phase == pb.PHASE_DONE and r.strategy == "exit"),
        timeout=60,
    )
    after = cluster.wait_running(job, 4)
    assert {r: s.node for r, s in after.items()} == {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}


def _phase(cluster: Cluster, job: str) -> int | None:
    rec = cluster.view(job).recovery
    return rec.phase if rec is not None else None


def _recovery_if(cluster: Cluster, job: str, check: Callable[[pb.Recovery], bool]) -> pb.Recovery | None:
    rec = cluster.view(job).recovery
    return rec if rec is not None and check(rec) else None
