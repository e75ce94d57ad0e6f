"""Helpers for driving one coordinator pass at a time against the real etcd (no processes).

The coordinator is built in this process and made leader by writing its leader key (no lease, no
campaign), so a test can write input, run :meth:`Coordinator.reconcile` and read back exactly what
one or more passes committed. Shared by the untrusted-input tests and the reconciler fuzz.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from recoverd.coordinator.reconciler import Coordinator
from recoverd.coordinator.settings import CoordinatorSettings
from recoverd.keys import Keyspace, RunRef
from recoverd.records import decode, encode, pb, ts_from_s
from recoverd.store import Put, Store

__all__ = ["Job", "drain", "events", "fault", "leader", "seed_job"]


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    run: RunRef
    nodes: tuple[str, ...]
    nproc: int
    lease: int


async def leader(store: Store, keys: Keyspace, settings: CoordinatorSettings | None = None) -> Coordinator:
    coordinator = Coordinator(store, keys, settings)
    coordinator.leadership.value = b"leader-under-test"
    await store.put(keys.leader(), coordinator.leadership.value)
    return coordinator


async def seed_job(
    store: Store, keys: Keyspace, name: str, *, nnodes: int, nproc: int, lease: int, strategies: tuple[str, ...]
) -> Job:
    """A running job: spec, one leased node record and one rank table per node, all ranks RUNNING."""
    run = RunRef(name, "run1")
    world = nnodes * nproc
    spec = pb.JobSpec(
        name=name,
        uid=run.uid,
        world_size=world,
        nnodes=nnodes,
        nproc_per_node=nproc,
        policy=pb.Policy(strategies=list(strategies)),
    )
    nodes = tuple(f"n{i}" for i in range(nnodes))
    ops: list[Put] = [Put(keys.job_spec(name), encode(spec))]
    for i, node in enumerate(nodes):
        ranks = list(range(i * nproc, (i + 1) * nproc))
        record = pb.NodeRecord(node=node, node_rank=i, host="h", agent_pid=1, ranks=ranks)
        ops.append(Put(keys.node(run, node), encode(record), lease))
        table = pb.NodeRanks(
            node=node,
            ranks=[
                pb.RankStatus(rank=r, local_rank=r - i * nproc, pid=1000 + r, state=pb.RANK_RUNNING, node=node)
                for r in ranks
            ],
        )
        ops.append(Put(keys.ranks(run, node), encode(table)))
    for start in range(0, len(ops), 100):
        await store.txn([], ops[start : start + 100])
    return Job(name, run, nodes, nproc, lease)


def fault(job: Job, rank: int, fault_id: str | None = None) -> tuple[str, bytes]:
    fault_id = fault_id or f"{job.nodes[rank // job.nproc]}.r{rank}.g0.c0"
    record = pb.Fault(
        fault_id=fault_id,
        rank=rank,
        node=job.nodes[rank // job.nproc],
        fault_type="1",
        source=pb.SOURCE_AGENT,
        exit_code=1,
        detected_at=ts_from_s(time.time()),
    )
    return fault_id, encode(record)


async def drain(coordinator: Coordinator, job: str, max_passes: int = 50) -> int:
    """Run passes until the job is no longer queued (a pass requeues it when work is left).

    No watch runs here: before each pass the coordinator's job cache is filled from etcd, as its
    watch would have by then (the pass then views exactly what is stored).
    """
    queue = coordinator._jobs.queue
    for done in range(1, max_passes + 1):
        await coordinator._jobs.enqueue_all()  # loads the cache (and queues every job: cleared below)
        queue._queued.discard(job)
        queue._queue.clear()
        queue._queued.clear()
        await coordinator.reconcile(job)
        if job not in queue._queued:
            return done
    raise AssertionError(f"job {job} still queued after {max_passes} passes")


async def events(store: Store, keys: Keyspace, run: RunRef, reason: str | None = None) -> list[pb.Event]:
    snap = await store.get_prefix(keys.events_prefix(run))
    out = [decode(pb.Event, kv.value, kv.key) for kv in snap.kvs]
    return [e for e in out if reason is None or e.reason == reason]
