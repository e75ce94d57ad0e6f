"""A 3-member etcd: a hung member or a leader election must not cost a job restart (docs/adr/0043).

Three real etcd processes on loopback (:class:`recoverd.etcd_server.EmbeddedEtcdCluster`) and real
recoverd processes (coordinator, strategy selector, two agents of four ranks each). The member a
service is connected to is found from the service's own TCP connections and SIGSTOPped: it keeps its
sockets and answers nothing, as a member with a stuck disk or a frozen VM does. Meanwhile a rank is
SIGKILLed: the recovery must restart that rank alone (``recover-in-place``), never the job, and no
node may be declared lost. Times (kill -> recovery DONE) are printed for the report, not asserted.

An agent whose lease runs out while etcd is in trouble (on a loaded machine its move off a hung
member can outlast the lease's stall margin) is held as live by the coordinator for a grace, not
declared lost (docs/adr/0045): ``test_an_agent_lease_lost_while_etcd_is_in_trouble_is_held`` makes
the lease run out for sure. The 30 s stalls are ``slow`` (``make test-slow``): they cost their 30 s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from recoverd.agent.outbox import Outbox
from recoverd.errors import EtcdUnavailable
from recoverd.etcd_health import EtcdHealth
from recoverd.etcd_server import EmbeddedEtcdCluster
from recoverd.keys import Keyspace, RunRef
from recoverd.records import decode, pb, ts_to_s
from recoverd.store import Resync, Store, TxnResult

from .cluster import Cluster, owned

pytestmark = pytest.mark.etcd

JOB = "job-etcd-stall"
RIP = "recover-in-place,exit"
#: The production defaults (the harness's FAST_* flags shorten them, which a stall would not survive
#: by design: a 1 s lease has a 0.5 s stall margin).
DEFAULT_LEASES = ("--agent-lease-ttl", "2")
COORDINATOR_LEASE = ("--coordinator-lease-ttl", "5")


@pytest.fixture
def etcd_cluster() -> Iterator[EmbeddedEtcdCluster]:
    with EmbeddedEtcdCluster(3) as etcd:
        yield etcd


class _Observer(Cluster):
    """The harness's reads retried: a read that lands on the paused member fails once its store's
    watchdog leaves it (each read is a fresh store, started on a random member)."""

    def _run(self, fn: Callable[[Store], Any]) -> Any:
        deadline = time.monotonic() + 20
        while True:
            try:
                return super()._run(fn)
            except EtcdUnavailable:
                if time.monotonic() > deadline:
                    raise


@pytest.fixture
def services(
    etcd_cluster: EmbeddedEtcdCluster, key_prefix: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    with owned(_Observer(etcd_cluster.endpoints, key_prefix, tmp_path), request) as c:
        yield c


def _start(c: Cluster) -> dict[int, pb.RankStatus]:
    c.coordinator(extra=COORDINATOR_LEASE)
    c.strategy()
    for i, node in enumerate(("node-a", "node-b")):
        c.agent(JOB, node, nproc=4, nnodes=2, node_rank=i, strategies=RIP, extra=DEFAULT_LEASES)
    return c.wait_running(JOB, 8, timeout=60)


def _members_of(etcd: EmbeddedEtcdCluster, pid: int) -> set[int]:
    """The indexes of the members process ``pid`` has an etcd connection to."""
    ports = {m.client_port: i for i, m in enumerate(etcd.members)}
    return {
        ports[conn.raddr.port]
        for conn in psutil.Process(pid).net_connections(kind="tcp")
        if conn.raddr and conn.raddr.port in ports and conn.status == psutil.CONN_ESTABLISHED
    }


def _member_of(c: Cluster, etcd: EmbeddedEtcdCluster, pid: int) -> int:
    """The member process ``pid`` is connected to, once it has exactly one connection."""
    used = c.wait_for(f"process {pid} on one member", lambda: (m := _members_of(etcd, pid)) and len(m) == 1 and m)
    return next(iter(used))


def _done(c: Cluster, min_id: int = 1) -> pb.Recovery | None:
    rec = c.view(JOB).recovery
    return rec if rec is not None and rec.recovery_id >= min_id and rec.phase == pb.PHASE_DONE else None


def _done_at(rec: pb.Recovery) -> float:
    return next(ts_to_s(e.at) for e in reversed(rec.phase_log) if e.phase == pb.PHASE_DONE)


def _expect_rank_recovered_alone(c: Cluster, before: dict[int, pb.RankStatus], rank: int, fault_at: float) -> float:
    """The rank's recovery DONE with recover-in-place, the only recovery, no node lost, every other
    rank's process untouched; returns kill -> DONE in seconds."""
    rec = c.wait_for("the recovery to be DONE", lambda: _done(c), timeout=60)
    assert (rec.recovery_id, rec.strategy) == (1, "recover-in-place"), rec
    assert [f.rank for f in rec.faults] == [rank], rec
    after = c.wait_running(JOB, 8, timeout=30)
    assert after[rank].pid != before[rank].pid
    assert {r: s.pid for r, s in after.items() if r != rank} == {r: s.pid for r, s in before.items() if r != rank}
    lost = [e for e in c.events(JOB) if "lost" in e.reason or "lease" in e.reason]
    assert not lost, lost
    assert "lease" not in {f.source for f in rec.faults}
    return _done_at(rec) - fault_at


def _stall_then_kill(c: Cluster, etcd: EmbeddedEtcdCluster, stall_s: float, *, whose: str = "agent") -> None:
    """SIGSTOP a member for ``stall_s`` (``whose``: the one agent-node-a uses, or the leader; "none":
    no stall, the clean path's figure) and SIGKILL one of node-a's ranks at once."""
    before = _start(c)
    agent = c.procs["agent-node-a"]
    member = _member_of(c, etcd, agent.pid) if whose == "agent" else etcd.leader()
    sharing = [n for n, p in c.procs.items() if member in _members_of(etcd, p.pid)]
    rank = next(r for r, s in before.items() if s.node == "node-a")
    if whose != "none":
        etcd.members[member].pause()
    paused_at = time.monotonic()
    try:
        fault_at = time.time()
        os.kill(before[rank].pid, signal.SIGKILL)
        took = _expect_rank_recovered_alone(c, before, rank, fault_at)
        print(f"stall {stall_s:g}s of member {member} ({whose}; used by {sharing}): kill -> DONE {took:.3f}s")
        time.sleep(max(0.0, stall_s - (time.monotonic() - paused_at)))
    finally:
        etcd.members[member].resume()
    # The member is back: nothing more happens (no late lease expiry, no old write applied late,
    # no second recovery).
    time.sleep(3)
    assert c.view(JOB).recovery.recovery_id == 1  # type: ignore[union-attr]
    ranks = c.ranks(JOB)
    assert {r: pb.RankState.Name(s.state) for r, s in ranks.items()} == dict.fromkeys(range(8), "RANK_RUNNING")
    assert {r: s.pid for r, s in ranks.items() if r != rank} == {r: s.pid for r, s in before.items() if r != rank}


@pytest.mark.parametrize("whose", ["agent", "leader"])
def test_a_5s_member_stall_costs_no_restart(services: Cluster, etcd_cluster: EmbeddedEtcdCluster, whose: str) -> None:
    _stall_then_kill(services, etcd_cluster, 5.0, whose=whose)


@pytest.mark.slow
@pytest.mark.parametrize("whose", ["agent", "leader"])
def test_a_30s_member_stall_costs_no_restart(services: Cluster, etcd_cluster: EmbeddedEtcdCluster, whose: str) -> None:
    _stall_then_kill(services, etcd_cluster, 30.0, whose=whose)


@pytest.mark.slow
def test_a_rank_kill_on_a_healthy_3_member_etcd(services: Cluster, etcd_cluster: EmbeddedEtcdCluster) -> None:
    """The clean path's figure on the same cluster, for the report beside the stalls."""
    _stall_then_kill(services, etcd_cluster, 0.0, whose="none")


def test_an_agent_lease_lost_while_etcd_is_in_trouble_is_held(
    services: Cluster, etcd_cluster: EmbeddedEtcdCluster
) -> None:
    """A follower member is SIGSTOPped and, with it, agent node-a for longer than its 2 s lease:
    the lease certainly runs out, as it does when a loaded agent's move off a hung member is slow.
    The coordinator saw the trouble in etcd, so it holds node-a as live for its grace; the agent
    comes back, registers again, and nothing is restarted. Without the hold node-a is lost and its
    four ranks are restarted."""
    before = _start(services)
    agent = services.procs["agent-node-a"]
    leader = etcd_cluster.leader()
    member = next(i for i in range(len(etcd_cluster.members)) if i != leader)
    etcd_cluster.members[member].pause()
    try:
        os.kill(agent.pid, signal.SIGSTOP)
        time.sleep(3.0)  # > the 2 s lease: etcd ends it for sure
        os.kill(agent.pid, signal.SIGCONT)
        held = services.wait_for(
            "node-a held", lambda: [e for e in services.events(JOB) if e.reason == "node_held"], timeout=30
        )
        assert [e.node for e in held] == ["node-a"], held
        services.wait_for("node-a registered again", lambda: "node-a" in services.view(JOB).nodes, timeout=30)
    finally:
        os.kill(agent.pid, signal.SIGCONT)
        etcd_cluster.members[member].resume()
    time.sleep(6)  # past the grace: a node still missing would be lost by now
    view = services.view(JOB)
    assert view.recovery is None or not view.recovery.faults, view.recovery
    ranks = services.ranks(JOB)
    assert {r: s.pid for r, s in ranks.items()} == {r: s.pid for r, s in before.items()}
    assert {pb.RankState.Name(s.state) for s in ranks.values()} == {"RANK_RUNNING"}


async def test_etcd_health_sees_a_hung_member_and_a_leader_change(etcd_cluster: EmbeddedEtcdCluster) -> None:
    """The coordinator's view of etcd: nothing while the cluster is healthy; a hung member within
    a second, and again at every probe while it hangs; a new leader after the leader is killed."""
    async with Store(etcd_cluster.endpoints) as store:
        health = EtcdHealth(store)
        task = asyncio.create_task(health.run())
        try:
            await asyncio.sleep(1.5)
            assert health.last is None
            follower = next(i for i in range(3) if i != etcd_cluster.leader())
            etcd_cluster.members[follower].pause()
            paused = time.time()
            try:
                await _until_true(lambda: health.last is not None, 5.0)
                assert health.last is not None and "did not answer" in health.last.what
                print(f"hung member seen after {health.last.at - paused:.2f}s")
                first = health.last.at
                await asyncio.sleep(1.5)
                assert health.last.at > first  # still hung: still trouble
            finally:
                etcd_cluster.members[follower].resume()
            await asyncio.sleep(1.0)
            settled = health.last.at
            await asyncio.sleep(1.0)
            assert health.last.at == settled  # healthy again: nothing new
            etcd_cluster.members[etcd_cluster.leader()].kill9()
            await _until_true(lambda: health.last is not None and health.last.at > settled, 5.0)
            await _until_true(
                lambda: any(
                    "leader changed" in t.what or "no leader" in t.what for t in health.recent if t.at > settled
                ),
                5.0,
            )
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _until_true(check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not in time"
        await asyncio.sleep(0.05)


def test_a_leader_kill_during_a_rank_kill_costs_no_restart(
    services: Cluster, etcd_cluster: EmbeddedEtcdCluster
) -> None:
    before = _start(services)
    leader = etcd_cluster.leader()
    rank = next(r for r, s in before.items() if s.node == "node-b")
    fault_at = time.time()
    os.kill(before[rank].pid, signal.SIGKILL)
    etcd_cluster.members[leader].kill9()
    took = _expect_rank_recovered_alone(services, before, rank, fault_at)
    print(f"leader (member {leader}) killed with rank {rank}: kill -> DONE {took:.3f}s")


async def test_the_store_leaves_a_hung_member(etcd_cluster: EmbeddedEtcdCluster) -> None:
    """A call and a watch on a SIGSTOPped member move to a healthy one while it is still hung.

    The store allows a call 20 s (``op_timeout_s``): without the watchdog the put waits on the hung
    member for all of it and the watch never notices; with it both are served by another member
    long before (the time is printed, not asserted)."""
    async with Store(etcd_cluster.endpoints, op_timeout_s=20) as store:
        await store.put("/stall/a", b"0")
        member = store._current
        others = [m.endpoint for i, m in enumerate(etcd_cluster.members) if i != member]
        events = store.watch_prefix("/stall/", await store.revision() + 1)
        first = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.1)
        etcd_cluster.members[member].pause()
        try:
            started = time.monotonic()
            async with asyncio.timeout(15):
                await _until(lambda: store.put("/stall/b", b"1"))
            put_s = time.monotonic() - started
            assert store._current != member and store.stalls_detected >= 1
            async with Store(others) as writer:  # another process's write, through the healthy members
                await writer.put("/stall/c", b"2")
            seen: list[Any] = []
            async with asyncio.timeout(15):
                while "/stall/c" not in [getattr(e, "key", "") for e in seen]:
                    seen.append(await (first if not seen else anext(events)))
            assert [e.key for e in seen if not isinstance(e, Resync)] == ["/stall/b", "/stall/c"]
            print(f"put on a hung member: {put_s:.3f}s; watch resumed with {[type(e).__name__ for e in seen]}")
        finally:
            etcd_cluster.members[member].resume()
            first.cancel()
            await events.aclose()  # type: ignore[attr-defined]


async def _until(call: object, timeout_s: float = 10.0) -> None:
    """Call until it succeeds (a call on the hung member fails once the watchdog leaves it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await call()  # type: ignore[operator]
            return
        except EtcdUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def test_a_failover_passes_a_hung_member_by() -> None:
    """A member left because it did not answer is not chosen by the next failovers (for AVOID_HUNG_S)
    while another is there: a store must not cycle back onto it (no etcd needed: the choice alone)."""
    async with Store("127.0.0.1:1,127.0.0.1:2,127.0.0.1:3") as store:
        store._current = 0
        store._client = object()  # stands for a connection to member 0 (closing it fails: ignored)
        await store._failover(at_once=True, avoid=True)
        assert store._current == 1
        for _ in range(4):  # failovers for other reasons: between 1 and 2 only
            store._client = object()
            await store._failover(at_once=True)
            assert store._current in (1, 2)
        store._avoid_until = {1: float("inf"), 2: float("inf")}
        store._client = object()
        await store._failover()
        assert store._current in (0, 1, 2)  # every member avoided: the next one all the same


async def test_an_old_rank_table_write_applied_late_changes_nothing(etcd_endpoint: str, key_prefix: str) -> None:
    """A write abandoned on a hung member is applied when it resumes, after newer ones (the 5 s stall
    test saw a restarted rank back at FAILED that way): the outbox's table write is fenced on its own
    last write, so the old transaction, replayed after a newer flush, fails and changes nothing."""
    keys = Keyspace(key_prefix)
    table = pb.NodeRanks(node="n0", ranks=[pb.RankStatus(rank=0, state=pb.RANK_RUNNING, pid=1)])
    sent: list[tuple[list[Any], list[Any]]] = []

    async def on_fence_lost() -> None:
        raise AssertionError("the fence is not lost here")

    async with Store(etcd_endpoint) as store:
        outbox = Outbox(store, keys, "n0", "agent.n0", lambda: table, lambda: [], on_fence_lost)
        outbox.run = RunRef("job-late", "run1")
        real_txn = store.txn

        async def recording_txn(compares: Any, success: Any, failure: Any = ()) -> TxnResult:
            sent.append((list(compares), list(success)))
            return await real_txn(compares, success, failure)

        store.txn = recording_txn  # type: ignore[method-assign]
        await outbox.flush()  # RUNNING, pid 1
        table.ranks[0].state = pb.RANK_FAILED
        await outbox.flush()  # FAILED: the write a hung member holds back
        late = sent[-1]
        table.ranks[0].state, table.ranks[0].pid = pb.RANK_RUNNING, 2
        await outbox.flush()  # RUNNING, pid 2: written through another member meanwhile
        store.txn = real_txn  # type: ignore[method-assign]

        assert not (await store.txn(*late)).succeeded, "the held-back write put an old table back"
        kv = await store.get(keys.ranks(outbox.run, "n0"))
        assert kv is not None
        assert decode(pb.NodeRanks, kv.value).ranks[0].pid == 2

        # Had the old write landed first, the next flush adopts the key's revision and writes again.
        await store.put(keys.ranks(outbox.run, "n0"), b"{}")
        table.ranks[0].pid = 3
        outbox.mark_dirty()
        await outbox.flush()
        kv = await store.get(keys.ranks(outbox.run, "n0"))
        assert kv is not None and decode(pb.NodeRanks, kv.value).ranks[0].pid == 3
