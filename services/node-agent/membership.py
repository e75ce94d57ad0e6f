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
from collections.abc import Awaitable, Callable

import psutil

from recoverd import events
from recoverd.agent.launcher import START_TIME_SLACK_S
from recoverd.agent.ranktable import LIVE_STATES, RankTable
from recoverd.agent.settings import AgentSettings
from recoverd.errors import BadRecord, EtcdRefused, EtcdUnavailable, FenceLost, JobSpecMismatch, RecoverdError
from recoverd.jobview import JobView, ranks_running_elsewhere, read_node_view
from recoverd.keys import Keyspace, RunRef
from recoverd.records import decode, encode, pb, ts_from_s, ts_to_s
from recoverd.store import Absent, Compare, DeletePrefix, LeaseKeeper, ModRevisionAtMost, Op, Put, Store, ValueIs
from recoverd.validate import check_spec

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
        #: What this node's agent can carry out, declared in its node record (the agent sets it once
        #: its runtime exists): its answer to every GLOBAL_FAULT (participants.agent_reports).
        self.strategies: tuple[str, ...] = ()
        #: This agent answers for its ranks' recovery clients (docs/adr/0036; ``strategies`` is
        #: then what it and every joined rank can do).
        self.answers_for_ranks = False
        self.spec: pb.JobSpec | None = None
        self.run: RunRef | None = None
        self.lease: LeaseKeeper | None = None
        #: The node record this agent last wrote: its writes are fenced on it (see fence()).
        self.registration = b""
        #: The earlier run of this job name that joining replaced (its processes must not survive).
        self.replaced_run: RunRef | None = None
        #: The node record no longer says which ranks this node holds: rewrite it.
        self.is_record_stale = False
        #: The lease was lost and ``keep_registered`` is rejoining: nothing else may register the
        #: node meanwhile (its ranks may run elsewhere now; the rejoin stops those first).
        self.rejoining = False

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
            # A --spare takes the node rank of the ranks it is given; a replacement keeps its own.
            node_rank=(s.group_rank(ranks[0]) if ranks else -1) if s.spare else s.node_rank,
            host=socket.gethostname(),
            agent_pid=os.getpid(),
            ranks=ranks,
            registered_at=ts_from_s(time.time()),
            is_spare=self.is_spare,
            strategies=self.strategies,
            answers_for_ranks=self.answers_for_ranks,
        )

    # ---------------------------------------------------------------- joining
    async def join(self) -> JobView | None:
        """Create, join, or replace the job's run, registering this node in the same transaction.

        Returns the view of the live run joined, or None when this agent created a new run.
        """
        assert self.lease is not None
        job = self.settings.job
        node = self.settings.node
        spec_wait_until = time.monotonic() + 2 * self.settings.lease_ttl_s
        while True:
            if self.lease.lost.is_set():
                # Joining took longer than the lease (an overloaded etcd): join under a fresh one,
                # or the registration is refused ("lease not found") and the agent would give up.
                log.warning("agent %s: its lease expired while joining; taking a new one", node)
                await self.lease.aclose(revoke=False)
                await self.open_lease()
            lease_id = self.lease.id
            view = await read_node_view(self.store, self.keys, job, node, self.table.slots)
            spec = view.spec
            if spec is None and view.spec_error:
                # Never replace a run because its spec was clobbered: its live agents write it
                # again (repair_spec); if none does, an operator must look.
                if time.monotonic() < spec_wait_until:
                    await asyncio.sleep(0.2)
                    continue
                raise JobSpecMismatch(
                    f"job {job}'s spec is unreadable ({view.spec_error}) and no running agent repaired it;"
                    f" inspect it with etcdctl get {self.keys.job_spec(job)}"
                )
            ops: list[Op] = []
            if spec is not None and view.run is not None:
                finished = view.status is not None and view.status.state in (pb.JOB_SUCCEEDED, pb.JOB_FAILED)
                # A run with no live node is abandoned, unless this node's ranks of it still run
                # here: then its agent is back (it was away longer than its lease) and rejoins it.
                if not finished and (view.nodes or self._ranks_still_run_here(view)):
                    why = self._mismatch(spec)
                    if why:
                        raise JobSpecMismatch(f"job {job} (run {spec.uid}) is running with another spec: {why}")
                    if node in view.nodes:
                        if await self._take_over(view):
                            return view
                        continue
                    taken = [
                        n
                        for n, rec in view.nodes.items()
                        if rec.node_rank == self.settings.node_rank and not self.settings.spare and not rec.is_spare
                    ]
                    if taken:
                        raise JobSpecMismatch(
                            f"node rank {self.settings.node_rank} of job {job} is already taken by node {taken[0]}"
                        )
                    if self._is_replacement(view):
                        self._join_as_replacement()
                    run = view.run
                    registration = self._register_op(run, lease_id)
                    ops.append(registration)
                    compare: list[Compare] = [
                        Absent(self.keys.node(run, node)),
                        ModRevisionAtMost(self.keys.job_spec(job), view.revision),
                    ]
                    if await self._join_txn(compare, ops):
                        self.spec, self.run, self.registration = spec, run, registration.value
                        self._drop_ranks_held_elsewhere(view)
                        log.info("node %s joined job %s (run %s)", node, job, run.uid)
                        return view
                    continue
                # A finished or abandoned run of this name: replaced, its keys removed (and any of
                # its processes still on this node stopped by the agent: see replaced_run).
                self.replaced_run = view.run
                if self.settings.spare:
                    raise JobSpecMismatch(f"a spare joins a running job, and job {job} has no live run")
                ops += [
                    DeletePrefix(self.keys.run_prefix(view.run)),
                    DeletePrefix(self.keys.run_inbox_prefix(view.run)),
                    DeletePrefix(self.keys.events_prefix(view.run)),
                    DeletePrefix(self.keys.rendezvous_prefix(view.run)),
                ]
            if self.settings.spare:
                raise JobSpecMismatch(f"a spare joins a running job, and job {job} has no live run")
            new = self._desired_spec()
            run = RunRef(job, new.uid)
            registration = self._register_op(run, lease_id)
            ops += [
                Put(self.keys.job_spec(job), encode(new)),
                registration,
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
            if await self._join_txn(compare, ops):
                self.spec, self.run, self.registration = new, run, registration.value
                log.info("node %s created job %s (run %s)", node, job, run.uid)
                return None

    def _is_replacement(self, view: JobView) -> bool:
        """Whether this agent, new to a live run, arrives for ranks that a recovery in progress
        names as faulty (their node was lost: a rescheduled pod, under a new node name). Its own
        name has no rank table in the run (a returning agent's has: it rejoins, docs/adr/0023)."""
        rec = view.recovery
        if self.settings.spare or rec is None or self.settings.node in view.ranks:
            return False
        if rec.phase in (pb.PHASE_DONE, pb.PHASE_FAILED, pb.PHASE_UNSPECIFIED):
            return False
        return bool({f.rank for f in rec.faults} & set(self.table.slots))

    def _join_as_replacement(self) -> None:
        """Join as a spare for this node rank and start nothing: the recovery decides where the lost
        node's ranks run (here, by START_RANKS) and whether the survivors restart, so a rank never
        runs twice and never starts outside a recovery round."""
        ranks = sorted(self.table.slots)
        for rank in ranks:
            self.table.remove(rank)
        self.is_spare = True
        log.warning(
            "node %s: joins job %s as the replacement of a lost node (node rank %d, ranks %s): a spare until"
            " the recovery starts the ranks here",
            self.settings.node,
            self.settings.job,
            self.settings.node_rank,
            ranks,
        )

    async def _join_txn(self, compare: list[Compare], ops: list[Op]) -> bool:
        """The join's transaction; False (join again) when it failed its compare, or when etcd no
        longer knows the lease (it expired while joining: the next attempt takes a new one)."""
        assert self.lease is not None
        try:
            return (await self.store.txn(compare, ops)).succeeded
        except EtcdRefused as err:
            if "lease not found" not in err.detail:
                raise
            self.lease.lost.set()
            return False

    def _register_op(self, run: RunRef, lease_id: int) -> Put:
        """The write of this node's record (remember its value once written: see fence())."""
        return Put(self.keys.node(run, self.settings.node), encode(self.node_record()), lease_id)

    def fence(self) -> list[Compare]:
        """The compare that fences every write of this agent: the node key still holds the record
        this agent wrote. It fails once the lease expired (the node was declared lost) or another
        agent took the node over, so a returning zombie can overwrite nothing."""
        assert self.run is not None
        return [ValueIs(self.keys.node(self.run, self.settings.node), self.registration)]

    async def holder(self) -> str:
        """Who holds this node's key now: "me", "nobody", or a description of the other agent."""
        assert self.run is not None
        kv = await self.store.get(self.keys.node(self.run, self.settings.node))
        if kv is None:
            return "nobody"
        if kv.value == self.registration:
            return "me"
        try:
            record = decode(pb.NodeRecord, kv.value, kv.key)
        except BadRecord:
            return "nobody"  # a clobbered record: re-registering rewrites it from our own state
        if record.node != self.settings.node or record.agent_pid <= 0 or not record.host:
            return "nobody"  # parses, but is no agent's record (e.g. `[]` or `{}`): clobbered too
        if record.host == socket.gethostname() and record.agent_pid == os.getpid():
            # Our own write whose answer was lost (an ambiguous commit): it is the registration.
            self.registration = kv.value
            return "me"
        return f"agent pid {record.agent_pid} on {record.host or '?'}"

    def _why_not_take_over(self, record: pb.NodeRecord) -> str:
        """ "" when this agent may take over the node's registration from ``record``'s agent (it ran
        on this host and is dead: a restarted agent), else why not."""
        host = socket.gethostname()
        if record.host != host:
            return f"it is registered from host {record.host or '?'}, and this is {host}"
        pid = record.agent_pid
        if pid == os.getpid():
            return ""
        try:
            started = psutil.Process(pid).create_time()
        except psutil.NoSuchProcess:
            return ""
        except psutil.Error as err:
            return f"its agent (pid {pid}) cannot be inspected: {err}"
        if started <= ts_to_s(record.registered_at) + START_TIME_SLACK_S:
            return f"its agent (pid {pid}) is alive"
        return ""  # that PID is another process now: the agent that registered is gone

    async def _take_over(self, view: JobView) -> bool:
        """A restarted agent replaces its dead predecessor's registration (still under the old
        lease) with its own, fenced on the old value; True if it did, False to read again."""
        assert self.lease is not None and view.run is not None and view.spec is not None
        node = self.settings.node
        why = self._why_not_take_over(view.nodes[node])
        if why:
            raise JobSpecMismatch(f"node {node} is already registered in job {self.settings.job}: {why}")
        key = self.keys.node(view.run, node)
        current = await self.store.get(key)
        if current is None:
            return False  # the old lease expired meanwhile: join as a returning node
        compare: list[Compare] = [
            ValueIs(key, current.value),
            ModRevisionAtMost(self.keys.job_spec(view.spec.name), view.revision),
        ]
        registration = self._register_op(view.run, self.lease.id)
        if not (await self.store.txn(compare, [registration])).succeeded:
            return False
        self.spec, self.run, self.registration = view.spec, view.run, registration.value
        self._drop_ranks_held_elsewhere(view)
        log.warning(
            "node %s took over its registration in job %s from agent pid %d (dead)",
            node,
            self.settings.job,
            view.nodes[node].agent_pid,
        )
        return True

    async def repair_spec(self) -> None:
        """The job's spec is the run's identity: if someone overwrote it with something that is no
        spec (or deleted it) while this run lives, write this agent's copy back, fenced on exactly
        what was read. A valid spec of another run means the job was replaced: nothing to repair."""
        assert self.spec is not None
        key = self.keys.job_spec(self.settings.job)
        kv = await self.store.get(key)
        if kv is not None:
            try:
                check_spec(decode(pb.JobSpec, kv.value, key), self.settings.job)
                return
            except BadRecord as err:
                why = err.detail
        else:
            why = "it was deleted"
        compare: list[Compare] = [Absent(key)] if kv is None else [ValueIs(key, kv.value)]
        if (await self.store.txn([*compare, *self.fence()], [Put(key, encode(self.spec))])).succeeded:
            log.warning("agent %s: the job's spec was unusable (%s); wrote it again", self.settings.node, why)

    def _ranks_still_run_here(self, view: JobView) -> bool:
        """Whether a rank this node ran in ``view``'s run is still alive here (same PID, same start
        time, the run's environment): the run is not abandoned, its agent is back."""
        table = view.ranks.get(self.settings.node)
        if table is None or view.run is None:
            return False
        for status in table.ranks:
            if status.state not in LIVE_STATES or status.pid <= 0:
                continue
            try:
                proc = psutil.Process(status.pid)
                if abs(proc.create_time() - ts_to_s(status.started_at)) > START_TIME_SLACK_S:
                    continue
                if proc.environ().get("RECOVERD_RUN") == view.run.uid:
                    return True
            except (psutil.Error, OSError):
                continue
        return False

    def _drop_ranks_held_elsewhere(self, view: JobView) -> None:
        """A node joining a live run does not start ranks that a downgrade isolated or that another
        live node runs now (a `recover` moved them): they are not this node's any more."""
        isolated = {p.rank for p in view.recovery.isolated} if view.recovery is not None else set()
        elsewhere = ranks_running_elsewhere(view, self.settings.node)
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
    async def keep_registered(self, rejoin: Callable[[], Awaitable[None]]) -> None:
        """Whenever the lease is lost (etcd was away longer than its TTL, or this node was
        partitioned), take a new one and let ``rejoin`` decide what this node still runs before it
        registers again (its ranks may have been moved or restarted elsewhere meanwhile)."""
        assert self.run is not None
        while True:
            lease = self.lease
            assert lease is not None
            await lease.lost.wait()
            log.warning("agent %s: lease lost; registering again", self.settings.node)
            self.rejoining = True
            await lease.aclose(revoke=False)
            delay = self.settings.retry_s
            while True:
                try:
                    if self.lease is lease:
                        fresh = LeaseKeeper(self.store, self.settings.lease_ttl_s)
                        await fresh.__aenter__()
                        self.lease = fresh
                    await rejoin()
                    self.rejoining = False
                    break
                except RecoverdError as err:
                    if not isinstance(err, EtcdUnavailable) and self.lease is not lease:
                        # Refused (e.g. the fresh lease expired while etcd was away): a new one.
                        await self.lease.aclose(revoke=False)  # type: ignore[union-attr]
                        self.lease = lease
                    log.info("agent %s: registering again failed (%s); retrying", self.settings.node, err)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.settings.retry_max_s)

    async def register(self) -> None:
        """Write this node's record under the current lease: over our own registration, or where
        there is none (the lease expired); raise FenceLost if another agent holds the node now."""
        assert self.run is not None and self.lease is not None
        key = self.keys.node(self.run, self.settings.node)
        current = await self.store.get(key)
        compare: list[Compare] = [Absent(key)] if current is None else [ValueIs(key, current.value)]
        if current is not None and current.value != self.registration:
            holder = await self.holder()
            if holder not in ("nobody", "me"):
                raise FenceLost(f"node {self.settings.node} is registered by {holder}")
            # "nobody": a clobbered value; our record is rewritten over exactly what was read.
        registration = self._register_op(self.run, self.lease.id)
        if not (await self.store.txn(compare, [registration])).succeeded:
            raise EtcdUnavailable(f"node {self.settings.node}: its key changed while registering; trying again")
        self.registration, self.is_record_stale = registration.value, False

    async def register_again(self) -> None:
        """Rewrite this node's record (its ranks changed) under the current lease, fenced on our own
        registration; a failed write is retried by the next reconcile (``is_record_stale`` stays set)."""
        assert self.run is not None and self.lease is not None
        if self.lease.lost.is_set():
            return  # keep_registered writes the current record under the new lease
        registration = self._register_op(self.run, self.lease.id)
        if not (await self.store.txn(self.fence(), [registration])).succeeded:
            raise FenceLost(f"node {self.settings.node}: its registration is gone or not this agent's")
        self.registration, self.is_record_stale = registration.value, False
