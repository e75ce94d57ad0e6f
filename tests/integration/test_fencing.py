"""Fencing, idempotency, failover and losing etcd: the control plane can fail without harming training.

* a coordinator that lost the leader key can no longer write (fenced transactions);
* a replayed command changes nothing (agents apply each (epoch, seq) once);
* a standby coordinator takes over a recovery in progress;
* etcd killed with SIGKILL and restarted: the ranks keep running meanwhile, and recovery works after.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from recoverd.coordinator.model import Timeouts
from recoverd.coordinator.reconciler import Coordinator
from recoverd.coordinator.settings import CoordinatorSettings
from recoverd.errors import FenceLost
from recoverd.etcd_server import EmbeddedEtcd
from recoverd.keys import Keyspace, RunRef
from recoverd.records import decode, encode, pb, ts_from_s
from recoverd.store import Store

from .cluster import Cluster

pytestmark = pytest.mark.etcd


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def _seed_job(store: Store, keys: Keyspace, job: str) -> RunRef:
    """A one-rank job record with one running rank and one unhandled fault."""
    run = RunRef(job, "run1")
    spec = pb.JobSpec(
        name=job, uid=run.uid, world_size=1, nnodes=1, nproc_per_node=1, policy=pb.Policy(strategies=["exit"])
    )
    await store.put(keys.job_spec(job), encode(spec))
    ranks = pb.NodeRanks(node="n0", ranks=[pb.RankStatus(rank=0, pid=1, state=pb.RANK_FAILED)])
    await store.put(keys.ranks(run, "n0"), encode(ranks))
    fault = pb.Fault(
        fault_id="n0.r0.g0.c0",
        rank=0,
        node="n0",
        fault_type="1",
        source=pb.SOURCE_AGENT,
        detected_at=ts_from_s(time.time()),
    )
    await store.put(keys.fault(run, fault.fault_id), encode(fault))
    return run


async def test_a_deposed_coordinator_cannot_write(etcd_endpoint: str, key_prefix: str) -> None:
    keys = Keyspace(key_prefix)
    # Short deadlines: whatever the successor did with the job first, the zombie's view soon has a
    # deadline behind it, and acting on it is a write.
    short = Timeouts(fault_window_s=0.2, stop_s=0.3, strategies_s=0.3, decide_s=0.3, recover_s=0.3)
    settings = CoordinatorSettings(lease_ttl_s=1, timeouts=short)
    async with Store(etcd_endpoint) as store:
        zombie = Coordinator(store, keys, settings)
        task = asyncio.create_task(zombie.run())
        await asyncio.wait_for(zombie.leadership.is_leader.wait(), 5)
        stale_value = zombie.leadership.value
        # Its leadership ends (the lease is revoked and the key deleted) ...
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert await store.get(keys.leader()) is None
        # ... and another coordinator takes over.
        successor = Coordinator(store, keys, settings)
        successor_task = asyncio.create_task(successor.run())
        try:
            await asyncio.wait_for(successor.leadership.is_leader.wait(), 5)
            # A zombie that still believes it leads tries to act on a new fault: rejected.
            run = await _seed_job(store, keys, "fenced")
            zombie.leadership.value = stale_value
            await zombie._jobs.enqueue_all()  # its job cache as its watch would have it: up to date

            async def act_until_it_writes() -> None:
                # A pass may have nothing to write: under load the successor can have opened the
                # recovery first, and it is still collecting. The zombie's next write must fail.
                while True:
                    await zombie.reconcile("fenced")
                    await asyncio.sleep(0.05)

            with pytest.raises(FenceLost):
                await asyncio.wait_for(act_until_it_writes(), 10)
            # The successor, holding the key, is the one whose writes land (once its watch has
            # brought it the job).
            assert successor._jobs.cache is not None
            await asyncio.wait_for(successor._jobs.cache.reached(await store.revision()), 5)
            await successor.reconcile("fenced")
            recovery = await store.get(keys.recovery(run))
            assert recovery is not None
            assert decode(pb.Recovery, recovery.value).recovery_id == 1
        finally:
            successor_task.cancel()
            await asyncio.gather(successor_task, return_exceptions=True)


def test_a_replayed_command_changes_nothing(cluster: Cluster) -> None:
    cluster.coordinator()
    cluster.strategy()
    cluster.agent("job-replay", nproc=2, strategies="recover-in-place,exit")
    before = cluster.wait_running("job-replay", 2)
    os.kill(before[1].pid, signal.SIGKILL)
    after = cluster.wait_for(
        "rank 1 restarted",
        lambda: (r := cluster.ranks("job-replay"))[1].restart_count == 1 and r[1].state == pb.RANK_RUNNING and r,
    )
    view = cluster.wait_for(
        "the recovery done",
        lambda: (v := cluster.view("job-replay")).recovery and v.recovery.phase == pb.PHASE_DONE and v,
    )
    assert view.run is not None
    command_key = cluster.keys.command(view.run, "node0")
    command_bytes = cluster.get(command_key)
    ack_before = cluster.get(cluster.keys.ack(view.run, "node0"))
    assert command_bytes is not None and ack_before is not None
    executed = [e.reason for e in cluster.events("job-replay")].count("command_executed")

    # Replay the very same command (a new revision of the key, same epoch and seq) ...
    cluster.put(command_key, command_bytes)
    # ... and an older one.
    older = decode(pb.Command, command_bytes)
    older.seq = 0
    cluster.put(command_key, encode(older))
    time.sleep(1.0)

    now = cluster.ranks("job-replay")
    assert {r: s.pid for r, s in now.items()} == {r: s.pid for r, s in after.items()}
    assert now[1].restart_count == 1
    assert cluster.get(cluster.keys.ack(view.run, "node0")) == ack_before
    assert [e.reason for e in cluster.events("job-replay")].count("command_executed") == executed


def _leader_pid(cluster: Cluster) -> int:
    raw = cluster.get(cluster.keys.leader())
    return decode(pb.Leader, raw).pid if raw else 0


def test_a_standby_coordinator_takes_over_a_recovery_in_progress(cluster: Cluster) -> None:
    first = cluster.coordinator("coordinator-a")
    leader = cluster.wait_for("a leader", lambda: _leader_pid(cluster))
    assert leader == first.pid
    cluster.coordinator("coordinator-b")
    cluster.agent("job-takeover", nproc=2, strategies="recover-in-place,exit")
    before = cluster.wait_running("job-takeover", 2)

    # The recovery starts under coordinator A and waits for a decision (no strategy service yet).
    os.kill(before[0].pid, signal.SIGKILL)
    cluster.wait_for(
        "the recovery waiting in DECIDING",
        lambda: (v := cluster.view("job-takeover")).recovery is not None and v.recovery.phase == pb.PHASE_DECIDING,
    )
    # A dies without cleaning up; B must take over from the records in etcd alone.
    cluster.kill("coordinator-a")
    successor = cluster.wait_for(
        "coordinator B to lead", lambda: (pid := _leader_pid(cluster)) and pid != first.pid and pid
    )
    assert successor == cluster.procs["coordinator-b"].pid

    cluster.strategy()
    after = cluster.wait_for(
        "rank 0 restarted under the new leader",
        lambda: (r := cluster.ranks("job-takeover"))[0].restart_count == 1 and r[0].state == pb.RANK_RUNNING and r,
    )
    assert after[1].pid == before[1].pid
    view = cluster.wait_for(
        "the recovery done",
        lambda: (v := cluster.view("job-takeover")).recovery and v.recovery.phase == pb.PHASE_DONE and v,
    )
    assert view.recovery is not None and view.recovery.recovery_id == 1


def test_ranks_survive_an_etcd_kill_and_recovery_works_after_restart(tmp_path: Path, key_prefix: str) -> None:
    etcd = EmbeddedEtcd(for_tests=True)
    etcd.start()
    cluster = Cluster(etcd.endpoint, key_prefix, tmp_path)
    try:
        cluster.coordinator()
        cluster.strategy()
        cluster.agent("job-etcd", nproc=3, strategies="recover-in-place,exit")
        before = cluster.wait_running("job-etcd", 3)

        etcd.kill9()
        time.sleep(2.0)  # longer than every lease TTL in play (1 s)
        # Losing the control plane's store never costs training: every rank still runs, same pid.
        assert all(_alive(r.pid) for r in before.values())
        for name, proc in cluster.procs.items():
            assert proc.poll() is None, f"{name} exited while etcd was down\n{cluster.logs()}"

        etcd.restart()
        cluster.wait_for("the agent to publish again", lambda: cluster.ranks("job-etcd"), timeout=20)
        os.kill(before[1].pid, signal.SIGKILL)
        after = cluster.wait_for(
            "rank 1 recovered after the etcd restart",
            lambda: (r := cluster.ranks("job-etcd"))[1].restart_count == 1 and r[1].state == pb.RANK_RUNNING and r,
            timeout=30,
        )
        assert after[0].pid == before[0].pid and after[2].pid == before[2].pid
    finally:
        cluster.close()
        etcd.stop()
