"""Registration and lease: how a node agent becomes, and stays, a member of its job's run.

The agent

1. **joins the job**: creates the job record if absent (create-if-absent, with a per-run uid), or
   joins the live run whose spec matches, or refuses with the reason; a finished or abandoned run of
   the same name is replaced by a new run (new uid), whose keys never mix with the old one's;
2. **registers the node** under a lease, in the same transaction, so a run with no live node is
   recognisably abandoned, and node loss is lease expiry;
3. **stays registered**: a lease lost while etcd was away is replaced by a new one, and the node
   record is rewritten whenever the ranks it holds change.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable

from recoverd import events
from recoverd.agent.ranktable import LIVE_STATES, RankTable
from recoverd.agent.settings import AgentSettings
from recoverd.errors import BadRecord, EtcdUnavailable, JobSpecMismatch
from recoverd.jobview import JobView, read_job
from recoverd.keys import Keyspace, RunRef
from recoverd.records import decode, encode, pb, ts_from_s
from recoverd.store import Absent, Compare, DeletePrefix, LeaseKeeper, ModRevisionAtMost, Op, Put, Store

__all__ = ["Membership"]

log = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class Membership:
    """This node's registration in its job's current run."""

    def __init__(self, store: Store, keys: Keyspace, settings: AgentSettings, table: RankTable, source: str) -> None:
        self.store = store
        self.keys = keys
        self.settings = settings
        self.table = table
        self.source = source
        #: A spare until a command gives it ranks (then it registers as a normal node).
        self.is_spare = settings.spare
        self.spec: pb.JobSpec | None = None
        self.run: RunRef | None = None
        self.lease: LeaseKeeper | None = None
        #: The node record no longer says which ranks this node holds: rewrite it.
        self.is_record_stale = False

    # ---------------------------------------------------------------- lease
    async def open_lease(self) -> LeaseKeeper:
        lease = LeaseKeeper(self.store, self.settings.lease_ttl_s)
        await lease.__aenter__()
        self.lease = lease
        return lease

    async def close(self) -> None:
        lease, self.lease = self.lease, None
        if lease is not None:
            await lease.aclose()

    # ---------------------------------------------------------------- records
    def _desired_spec(self) -> pb.JobSpec:
        s = self.settings
        return pb.JobSpec(
            name=s.job,
            uid=f"{time.strftime('%Y%m%d%H%M%S', time.gmtime())}-{secrets.token_hex(4)}",
            world_size=s.world_size,
            nnodes=s.nnodes,
            nproc_per_node=s.nproc_per_node,
            master_addr=s.master_addr or ("127.0.0.1" if s.nnodes == 1 else socket.getfqdn()),
            master_port=s.master_port or _free_port(),
            policy=s.policy
            if s.policy is not None
            else pb.Policy(
                strategies=list(s.strategies),
                max_rank_restarts=s.max_rank_restarts,
                max_job_restarts=s.max_job_restarts,
                restart_window_s=s.restart_window_s,
            ),
            created_at=ts_from_s(time.time()),
            created_by=f"{s.node}@{socket.gethostname()}:{os.getpid()}",
        )

    def _mismatch(self, spec: pb.JobSpec) -> str:
        s = self.settings
        wrong = []
        for name, mine, theirs in (
            ("world size", s.world_size, spec.world_size),
            ("nnodes", s.nnodes, spec.nnodes),
            ("nproc-per-node", s.nproc_per_node, spec.nproc_per_node),
        ):
            if mine != theirs:
                wrong.append(f"{name} {mine} != {theirs}")
        if s.strategies_given and tuple(spec.policy.strategies) != s.strategies:
            wrong.append(f"strategies {','.join(s.strategies)} != {','.join(spec.policy.strategies)}")
        return "; ".join(wrong)

    def node_record(self) -> pb.NodeRecord:
        ranks = self.table.ranks
        s = self.settings
        return pb.NodeRecord(
            node=s.node,
            node_rank=(s.group_rank(ranks[0]) if ranks else -1) if s.spare else s.node_rank,
            host=socket.gethostname(),
            agent_pid=os.getpid(),
            ranks=ranks,
            registered_at=ts_from_s(time.time()),
            is_spare=self.is_spare,
        )

    # ---------------------------------------------------------------- joining
    async def join(self) -> JobView | None:
        """Create, join, or replace the job's run, registering this node in the same transaction.

        Returns the view of the live run joined, or None when this agent created a new run.
        """
        assert self.lease is not None
        lease_id = self.lease.id
        job = self.settings.job
        node = self.settings.node
        while True:
            view = await read_job(self.store, self.keys, job)
            spec = view.spec
            ops: list[Op] = []
            if spec is not None and view.run is not None:
                finished = view.status is not None and view.status.state in (pb.JOB_SUCCEEDED, pb.JOB_FAILED)
                if not finished and view.nodes:
                    why = self._mismatch(spec)
                    if why:
                        raise JobSpecMismatch(f"job {job} (run {spec.uid}) is running with another spec: {why}")
                    if node in view.nodes:
                        raise JobSpecMismatch(f"node {node} is already registered in job {job}")
                    taken = [
                        n
                        for n, rec in view.nodes.items()
                        if rec.node_rank == self.settings.node_rank and not self.settings.spare and not rec.is_spare
                    ]
                    if taken:
                        raise JobSpecMismatch(
                            f"node rank {self.settings.node_rank} of job {job} is already taken by node {taken[0]}"
                        )
                    run = view.run
                    ops.append(Put(self.keys.node(run, node), encode(self.node_record()), lease_id))
                    compare: list[Compare] = [
                        Absent(self.keys.node(run, node)),
                        ModRevisionAtMost(self.keys.job_spec(job), view.revision),
                    ]
                    if (await self.store.txn(compare, ops)).succeeded:
                        self.spec, self.run = spec, run
                        self._drop_ranks_held_elsewhere(view)
                        log.info("node %s joined job %s (run %s)", node, job, run.uid)
                        return view
                    continue
                # A finished or abandoned run of this name: replaced, its keys removed.
                if self.settings.spare:
                    raise JobSpecMismatch(f"a spare joins a running job, and job {job} has no live run")
                ops += [
                    DeletePrefix(self.keys.run_prefix(view.run)),
                    DeletePrefix(self.keys.events_prefix(view.run)),
                    DeletePrefix(self.keys.rendezvous_prefix(view.run)),
                ]
            if self.settings.spare:
                raise JobSpecMismatch(f"a spare joins a running job, and job {job} has no live run")
            new = self._desired_spec()
            run = RunRef(job, new.uid)
            ops += [
                Put(self.keys.job_spec(job), encode(new)),
                Put(self.keys.node(run, node), encode(self.node_record()), lease_id),
                events.event_put(
                    self.keys,
                    run,
                    self.source,
                    "job_created",
                    f"job {job} run {new.uid}: {new.world_size} ranks on {new.nnodes} node(s),"
                    f" strategies {','.join(new.policy.strategies)}",
                ),
            ]
            compare = [ModRevisionAtMost(self.keys.job_prefix(job), view.revision, is_prefix=True)]
            if (await self.store.txn(compare, ops)).succeeded:
                self.spec, self.run = new, run
                log.info("node %s created job %s (run %s)", node, job, run.uid)
                return None

    def _drop_ranks_held_elsewhere(self, view: JobView) -> None:
        """A node joining a live run does not start ranks that a downgrade isolated or that another
        live node runs now (a `recover` moved them): they are not this node's any more."""
        isolated = {p.rank for p in view.recovery.isolated} if view.recovery is not None else set()
        elsewhere = {
            r.rank
            for node, table in view.ranks.items()
            if node != self.settings.node and node in view.nodes
            for r in table.ranks
            if r.state in LIVE_STATES
        }
        for rank in sorted(set(self.table.slots) & (isolated | elsewhere)):
            self.table.remove(rank)
            log.warning(
                "node %s: rank %d is %s; not starting it",
                self.settings.node,
                rank,
                "isolated by a downgrade" if rank in isolated else "running on another node",
            )

    async def last_applied(self) -> tuple[int, int]:
        """(epoch, seq) of the last command this node acknowledged: a restarted agent joining a live
        run must not apply it again."""
        assert self.run is not None
        kv = await self.store.get(self.keys.ack(self.run, self.settings.node))
        if kv is None:
            return (0, 0)
        try:
            ack = decode(pb.CommandAck, kv.value, kv.key)
        except BadRecord as err:
            log.warning("agent %s: ignoring %s", self.settings.node, err)
            return (0, 0)
        return (ack.epoch, ack.seq)

    # ---------------------------------------------------------------- staying registered
    async def keep_registered(self, on_registered: Callable[[], None]) -> None:
        """Re-register under a new lease whenever the old one is lost (etcd was away too long)."""
        assert self.run is not None
        while True:
            lease = self.lease
            assert lease is not None
            await lease.lost.wait()
            log.warning("agent %s: lease lost; registering again", self.settings.node)
            delay = self.settings.retry_s
            while True:
                try:
                    fresh = LeaseKeeper(self.store, self.settings.lease_ttl_s)
                    await fresh.__aenter__()
                    await self.store.put(
                        self.keys.node(self.run, self.settings.node), encode(self.node_record()), lease=fresh.id
                    )
                    self.lease = fresh
                    on_registered()
                    break
                except EtcdUnavailable:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.settings.retry_max_s)

    async def register_again(self) -> None:
        """Rewrite this node's record (its ranks changed) under the current lease; a failed write
        is retried by the next reconcile (``is_record_stale`` stays set)."""
        assert self.run is not None and self.lease is not None
        if self.lease.lost.is_set():
            return  # keep_registered writes the current record under the new lease
        await self.store.put(
            self.keys.node(self.run, self.settings.node), encode(self.node_record()), lease=self.lease.id
        )
        self.is_record_stale = False
