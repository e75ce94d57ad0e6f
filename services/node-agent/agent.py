"""The node agent: runs this node's ranks and answers the recovery protocol for them.

Policy lives here; mechanism in ``launcher.py``. The agent

1. **joins the job**: creates the job record if absent (create-if-absent, with a per-run uid), or
   joins the live run whose spec matches, or refuses with the reason; a finished or abandoned run of
   the same name is replaced by a new run (new uid), whose keys never mix with the old one's;
2. **registers the node** under a lease, in the same transaction, so a run with no live node is
   recognisably abandoned, and node loss is lease expiry;
3. **starts the local ranks** with torchrun-style and MindCluster environment variables;
4. **records a fault at once** when a rank exits non-zero (pidfd, no polling), with the exit code or
   signal and the tail of its log; exits it caused itself (commands, shutdown) are never faults;
5. **executes commands** (restart some ranks, restart all) addressed to its node, idempotently by
   (epoch, seq), and acknowledges them;
6. **answers the protocol** for ranks that run no client: stop-complete, its supported strategies
   (`recover-in-place`, `recover`, `exit`) and the recover status;
7. **ends with the job**: exit 0 when the coordinator records success, 1 when it records failure.

A **spare** agent (``--spare``) joins a running job with no ranks; a `recover` gives it a faulty
node's ranks (START_RANKS) while that node's agent, if alive, gives them up (RELEASE_RANKS). Ranks
keep their global rank; GROUP_RANK and LOCAL_RANK follow from it (rank // and % nproc-per-node).

Losing etcd never hurts training: ranks keep running in their own sessions, writes are kept and
retried, watches resume, and a lost lease is re-acquired; the agent never kills ranks because it
lost etcd. SIGTERM/SIGINT stop the ranks (SIGTERM, grace, SIGKILL) and exit 143/130.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from recoverd import events, participants, resetjson
from recoverd.agent import resetfile
from recoverd.agent.launcher import ExitInfo, Launcher, RankLaunch, RankProcess, read_tail
from recoverd.agent.runtime import RankRuntime, RuntimeFactory
from recoverd.errors import BadRecord, ConfigError, EtcdUnavailable, JobSpecMismatch, LaunchFailed, RecoverdError
from recoverd.filewatch import watch_file
from recoverd.jobview import JobView, read_job
from recoverd.keys import Keyspace, RunRef
from recoverd.records import decode, encode, pb, ts_from_s
from recoverd.resetjson import ResetState
from recoverd.store import (
    Absent,
    Compare,
    DeletePrefix,
    LeaseKeeper,
    ModRevisionAtMost,
    Op,
    Put,
    Store,
)

__all__ = ["AgentSettings", "NodeAgent", "become_subreaper"]

log = logging.getLogger(__name__)

#: What an agent can do for ranks that run no client (`recover` only where its runtime can start
#: any rank: not under msrun or for adopted processes).
AGENT_STRATEGIES = ("recover-in-place", "recover", "exit")

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_REFUSED = 2
EXIT_SIGTERM = 143
EXIT_SIGINT = 130


def become_subreaper() -> bool:
    """PR_SET_CHILD_SUBREAPER: orphaned descendants re-parent to us, so we can see and reap them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(36, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """Everything an agent needs; the CLI fills it from flags and environment."""

    job: str
    node: str
    argv: tuple[str, ...]
    etcd: str
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    strategies: tuple[str, ...] = ("exit",)
    #: Whether the strategies were asked for (``--strategies`` / ``--policy``): only then must they
    #: match a live job's (whose policy ``recoverctl policy set`` may have changed since).
    strategies_given: bool = True
    max_rank_restarts: int = 3
    max_job_restarts: int = 3
    restart_window_s: float = 600.0
    #: The job's whole policy (from --policy); None: built from the four fields above.
    policy: pb.Policy | None = None
    log_dir: str | None = None
    cwd: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    prefix: str = ""
    lease_ttl_s: float = 5.0
    stop_grace_s: float = 5.0
    retry_s: float = 0.1
    retry_max_s: float = 2.0
    extra_env: Mapping[str, str] = field(default_factory=dict)
    #: A device plugin's reset.json to turn into faults (watched, never written).
    reset_json: str | None = None
    #: Where to mirror recoverd's state in reset.json form, for tools that read it.
    reset_json_mirror: str | None = None
    #: Signals that end the agent, and its exit code for each (ranks are stopped first).
    exit_signals: Mapping[int, int] = field(
        default_factory=lambda: {signal.SIGTERM: EXIT_SIGTERM, signal.SIGINT: EXIT_SIGINT}
    )
    #: Join a running job as a spare node: no ranks until a `recover` or an upgrade moves some here.
    spare: bool = False
    #: Warm spare processes kept ready (framework imported, waiting for a rank); 0 = none. Only for
    #: scripts that call ``taskd_client.pytorch.wait_for_rank()`` first (docs/pytorch.md).
    warm_spares: int = 0
    #: Seconds to wait after a warm spare is used before starting the next one (it would compete
    #: for CPU with the recovery it just sped up).
    warm_spare_refill_s: float = 1.0

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def local_ranks(self) -> range:
        if self.spare:
            return range(0)
        start = self.node_rank * self.nproc_per_node
        return range(start, start + self.nproc_per_node)


@dataclass(slots=True)
class RankSlot:
    """One local rank across its incarnations."""

    rank: int
    local_rank: int
    proc: RankProcess | None = None
    state: int = pb.RANK_PENDING
    generation: int = 0
    restart_count: int = 0
    exit_code: int = 0
    signal: int = 0
    #: Set while the agent itself is stopping this incarnation: its exit is not a fault.
    is_stopping: bool = False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class NodeAgent:
    """``exit_code = await NodeAgent(store, keys, settings).run()``."""

    def __init__(
        self,
        store: Store,
        keys: Keyspace,
        settings: AgentSettings,
        protected_pids: Callable[[], set[int]] = set,
        runtime: RuntimeFactory = Launcher,
    ) -> None:
        if not settings.spare and not 0 <= settings.node_rank < settings.nnodes:
            raise JobSpecMismatch(f"--node-rank {settings.node_rank} is outside 0..{settings.nnodes - 1}")
        self.store = store
        self.keys = keys
        self.settings = settings
        self._protected_pids = protected_pids
        self._runtime_factory = runtime
        self.participant = participants.of_node(settings.node)
        self.slots = {rank: RankSlot(rank, rank % settings.nproc_per_node) for rank in settings.local_ranks}
        #: A spare until a command gives it ranks (then it registers as a normal node).
        self.is_spare = settings.spare
        self.spec: pb.JobSpec | None = None
        self.run_ref: RunRef | None = None
        self._launcher: RankRuntime | None = None
        self._lease: LeaseKeeper | None = None
        self._dirty = asyncio.Event()
        self._wake = asyncio.Event()
        self._pending_faults: list[pb.Fault] = []
        self._pending_events: list[Put] = []
        self._last_applied: tuple[int, int] = (0, 0)
        self._answered: set[tuple[int, int]] = set()
        self._exit_code: asyncio.Future[int] | None = None
        self._mirrored: ResetState | None = None
        self._record_stale = False
        self._warm: list[RankProcess] = []
        self._refill: asyncio.TimerHandle | None = None
        self._spare_deaths = 0
        #: Set when the agent is ending: no warm spare is started any more.
        self._stopping = False
        #: epoch -> why this node could not carry out that epoch's command (reported as code 1).
        self._failed_commands: dict[int, str] = {}
        resetfile.check_paths(settings.reset_json, settings.reset_json_mirror)

    # ---------------------------------------------------------------- lifecycle
    async def run(self) -> int:
        """Join, start the ranks, serve until the job ends or a signal arrives; return the exit code."""
        loop = asyncio.get_running_loop()
        self._exit_code = loop.create_future()
        self._launcher = self._runtime_factory(self._on_rank_exit, self._protected_pids)
        lease = LeaseKeeper(self.store, self.settings.lease_ttl_s)
        await lease.__aenter__()
        self._lease = lease
        try:
            try:
                await self._join(lease.id)
            except JobSpecMismatch as err:
                log.error("refused to join job %s: %s", self.settings.job, err.detail)
                return EXIT_REFUSED
            for signum, code in self.settings.exit_signals.items():
                loop.add_signal_handler(signum, self._request_exit, code)
            loop.add_signal_handler(signal.SIGCHLD, self._launcher.reap_strays)
            self._start_all(generation=0, header="launch")
            self._fill_warm_spares()
            try:
                async with asyncio.TaskGroup() as group:
                    tasks = [
                        group.create_task(self._publisher(), name="agent-publisher"),
                        group.create_task(self._watch(), name="agent-watch"),
                        group.create_task(self._worker(), name="agent-worker"),
                        group.create_task(self._keep_registered(), name="agent-lease"),
                        group.create_task(self._launcher.watch(), name="agent-runtime"),
                    ]
                    if self.settings.reset_json:
                        tasks.append(group.create_task(self._watch_reset_json(), name="agent-reset-json"))
                    code = await self._exit_code
                    await self._finish(code)
                    for task in tasks:
                        task.cancel()
            finally:
                for signum in (*self.settings.exit_signals, signal.SIGCHLD):
                    loop.remove_signal_handler(signum)
            return code
        finally:
            if self._launcher is not None and self._launcher.processes:
                await self._stop_ranks(list(self.slots.values()))
                await self._stop_warm_spares()
            lease_now, self._lease = self._lease, None
            if lease_now is not None:
                await lease_now.aclose()

    def _request_exit(self, code: int) -> None:
        if self._exit_code is not None and not self._exit_code.done():
            log.info("agent %s: exiting with %d", self.settings.node, code)
            self._exit_code.set_result(code)

    async def _finish(self, code: int) -> None:
        """Stop what still runs and flush the final rank states (bounded: etcd may be down)."""
        await self._stop_ranks([s for s in self.slots.values() if s.proc is not None and s.proc.is_running])
        await self._stop_warm_spares()
        if self._launcher is not None:
            killed = self._launcher.kill_strays()
            if killed:
                log.warning(
                    "agent %s: killed %d process(es) left behind by ranks: %s", self.settings.node, len(killed), killed
                )
        with contextlib.suppress(RecoverdError, TimeoutError):
            async with asyncio.timeout(2.0):
                await self._flush()

    # ---------------------------------------------------------------- joining
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

    def _node_record(self) -> pb.NodeRecord:
        ranks = sorted(self.slots)
        return pb.NodeRecord(
            node=self.settings.node,
            node_rank=(self._group_rank(ranks[0]) if ranks else -1) if self.settings.spare else self.settings.node_rank,
            host=socket.gethostname(),
            agent_pid=os.getpid(),
            ranks=ranks,
            registered_at=ts_from_s(time.time()),
            is_spare=self.is_spare,
        )

    def _group_rank(self, rank: int) -> int:
        """The node rank a global rank belongs to (ranks are laid out node by node)."""
        return rank // self.settings.nproc_per_node

    async def _join(self, lease_id: int) -> None:
        """Create, join, or replace the job's run, registering this node in the same transaction."""
        job = self.settings.job
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
                    if self.settings.node in view.nodes:
                        raise JobSpecMismatch(f"node {self.settings.node} is already registered in job {job}")
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
                    ops.append(Put(self.keys.node(run, self.settings.node), encode(self._node_record()), lease_id))
                    compare: list[Compare] = [
                        Absent(self.keys.node(run, self.settings.node)),
                        ModRevisionAtMost(self.keys.job_spec(job), view.revision),
                    ]
                    if (await self.store.txn(compare, ops)).succeeded:
                        self.spec, self.run_ref = spec, run
                        self._drop_ranks_held_elsewhere(view)
                        await self._load_last_applied(run)
                        log.info("node %s joined job %s (run %s)", self.settings.node, job, run.uid)
                        return
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
                Put(self.keys.node(run, self.settings.node), encode(self._node_record()), lease_id),
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
                self.spec, self.run_ref = new, run
                log.info("node %s created job %s (run %s)", self.settings.node, job, run.uid)
                return

    def _drop_ranks_held_elsewhere(self, view: JobView) -> None:
        """A node joining a live run does not start ranks that a downgrade isolated or that another
        live node runs now (a `recover` moved them): they are not this node's any more."""
        isolated = {p.rank for p in view.recovery.isolated} if view.recovery is not None else set()
        elsewhere = {
            r.rank
            for node, table in view.ranks.items()
            if node != self.settings.node and node in view.nodes
            for r in table.ranks
            if r.state in (pb.RANK_RUNNING, pb.RANK_PENDING)
        }
        for rank in sorted(set(self.slots) & (isolated | elsewhere)):
            del self.slots[rank]
            log.warning(
                "node %s: rank %d is %s; not starting it",
                self.settings.node,
                rank,
                "isolated by a downgrade" if rank in isolated else "running on another node",
            )

    async def _load_last_applied(self, run: RunRef) -> None:
        """A restarted agent joining a live run must not apply its node's last command again."""
        ack = await self._get(self.keys.ack(run, self.settings.node), pb.CommandAck)
        if isinstance(ack, pb.CommandAck):
            self._last_applied = (ack.epoch, ack.seq)

    @property
    def source(self) -> str:
        return self.participant

    # ---------------------------------------------------------------- ranks
    def _rank_env(self, slot: RankSlot) -> dict[str, str]:
        assert self.spec is not None
        s = self.settings
        env = dict(os.environ)
        env.update(s.extra_env)
        env.update(
            {
                "RANK": str(slot.rank),
                "LOCAL_RANK": str(slot.local_rank),
                "WORLD_SIZE": str(self.spec.world_size),
                "LOCAL_WORLD_SIZE": str(s.nproc_per_node),
                "GROUP_RANK": str(self._group_rank(slot.rank)),
                "NODE_RANK": str(self._group_rank(slot.rank)),
                "MASTER_ADDR": self.spec.master_addr,
                "MASTER_PORT": str(self.spec.master_port),
                "RANK_ID": str(slot.rank),
                "DEVICE_ID": str(slot.local_rank),
                "RECOVERD_ETCD": s.etcd,
                "RECOVERD_JOB": s.job,
                "RECOVERD_RUN": self.spec.uid,
                "RECOVERD_NODE": s.node,
                "RECOVERD_PREFIX": self.keys.prefix,
                "RECOVERD_GENERATION": str(slot.generation),
                "RECOVERD_RESTART_COUNT": str(slot.restart_count),
                "TORCHELASTIC_RESTART_COUNT": str(slot.restart_count),
            }
        )
        return env

    def _log_path(self, rank: int) -> str | None:
        if not self.settings.log_dir:
            return None
        return os.path.join(self.settings.log_dir, f"rank{rank}.log")

    def _start(self, slot: RankSlot, generation: int, header: str) -> None:
        assert self._launcher is not None
        slot.generation = generation
        launch = RankLaunch(
            rank=slot.rank,
            argv=self.settings.argv,
            env=self._rank_env(slot),
            cwd=self.settings.cwd,
            log_path=self._log_path(slot.rank),
            header=f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} rank {slot.rank} {header}"
            f" generation {generation} restart {slot.restart_count}",
        )
        try:
            slot.proc = self._take_warm_spare(launch) or self._launcher.start(launch)
        except LaunchFailed as err:
            log.error("%s", err)
            slot.proc = None
            slot.state, slot.exit_code, slot.signal = pb.RANK_FAILED, 127, 0
            self._record_fault(slot, ExitInfo(0, 127, None), detail=err.detail)
            return
        slot.state, slot.exit_code, slot.signal, slot.is_stopping = pb.RANK_RUNNING, 0, 0, False
        self._dirty.set()

    # ---------------------------------------------------------------- warm spares
    def _spare_launch(self) -> RankLaunch:
        assert self.spec is not None
        env = dict(os.environ)
        env.update(self.settings.extra_env)
        env.update(
            {
                "RECOVERD_ETCD": self.settings.etcd,
                "RECOVERD_JOB": self.settings.job,
                "RECOVERD_RUN": self.spec.uid,
                "RECOVERD_NODE": self.settings.node,
                "RECOVERD_PREFIX": self.keys.prefix,
            }
        )
        log_path = os.path.join(self.settings.log_dir, "warm-spares.log") if self.settings.log_dir else None
        return RankLaunch(-1, self.settings.argv, env, self.settings.cwd, log_path, "warm spare")

    def _fill_warm_spares(self) -> None:
        """Start warm spares until ``warm_spares`` are waiting (only the process launcher has them)."""
        self._refill = None
        if self._stopping or not isinstance(self._launcher, Launcher) or not type(self._launcher).starts_any_rank:
            return
        self._warm = [p for p in self._warm if p.is_spare and p.is_running]
        while len(self._warm) < self.settings.warm_spares:
            try:
                spare = self._launcher.start(self._spare_launch(), spare=True)
            except LaunchFailed as err:
                log.error("agent %s: cannot start a warm spare: %s", self.settings.node, err)
                return
            log.info("agent %s: warm spare pid %d started", self.settings.node, spare.pid)
            self._warm.append(spare)
            self._dirty.set()

    def _take_warm_spare(self, launch: RankLaunch) -> RankProcess | None:
        """A warm spare made into this rank, or None (none waiting: start a process as usual)."""
        while self._warm:
            spare = self._warm.pop(0)
            if not (spare.is_spare and spare.is_running) or not isinstance(self._launcher, Launcher):
                continue
            try:
                proc = self._launcher.assign(spare, launch)
            except LaunchFailed as err:
                log.warning("agent %s: %s", self.settings.node, err)
                continue
            log.info("agent %s: rank %d is warm spare pid %d", self.settings.node, launch.rank, proc.pid)
            self._refill_later(self.settings.warm_spare_refill_s)
            return proc
        return None

    def _refill_later(self, delay_s: float) -> None:
        if self._refill is None and not self._stopping:
            self._refill = asyncio.get_running_loop().call_later(delay_s, self._fill_warm_spares)

    async def _stop_warm_spares(self) -> None:
        self._stopping = True
        if self._refill is not None:
            self._refill.cancel()
            self._refill = None
        spares, self._warm = [p for p in self._warm if p.is_running], []
        if spares and self._launcher is not None:
            await asyncio.gather(*(self._launcher.stop(p, self.settings.stop_grace_s) for p in spares))

    def _start_all(self, generation: int, header: str) -> None:
        for slot in self.slots.values():
            self._start(slot, generation, header)

    async def _stop_ranks(self, slots: Sequence[RankSlot]) -> None:
        assert self._launcher is not None
        running = [s for s in slots if s.proc is not None and s.proc.is_running]
        for slot in running:
            slot.is_stopping = True
        await asyncio.gather(*(self._launcher.stop(s.proc, self.settings.stop_grace_s) for s in running if s.proc))

    def _on_rank_exit(self, proc: RankProcess, info: ExitInfo) -> None:
        if proc in self._warm:
            self._warm.remove(proc)
            log.warning("agent %s: warm spare pid %d ended: %s", self.settings.node, proc.pid, info.describe())
            self._spare_deaths += 1
            # Replaced, more slowly each time (a script that cannot be a warm spare dies at once).
            self._refill_later(min(60.0, self.settings.warm_spare_refill_s * 2**self._spare_deaths))
            self._dirty.set()
            return
        slot = self.slots.get(proc.rank)
        if slot is None or slot.proc is not proc:
            return
        slot.exit_code = info.exit_code if info.exit_code is not None else 0
        slot.signal = info.signal or 0
        if slot.is_stopping:
            slot.state = pb.RANK_STOPPED
        elif info.ok:
            slot.state = pb.RANK_SUCCEEDED
            log.info("rank %d (pid %d) finished", slot.rank, proc.pid)
        else:
            slot.state = pb.RANK_FAILED
            log.warning("rank %d (pid %d) failed: %s", slot.rank, proc.pid, info.describe())
            self._record_fault(slot, info)
        self._dirty.set()

    def _record_fault(self, slot: RankSlot, info: ExitInfo, detail: str = "") -> None:
        """Queue a fault record; the publisher writes it (and retries while etcd is away)."""
        proc = slot.proc
        fault = pb.Fault(
            fault_id=f"{self.settings.node}.r{slot.rank}.g{slot.generation}.c{slot.restart_count}",
            rank=slot.rank,
            node=self.settings.node,
            fault_type="1",
            source=pb.SOURCE_AGENT,
            exit_code=info.exit_code or 0,
            signal=info.signal or 0,
            stderr_tail=read_tail(proc.log_path if proc else None),
            generation=slot.generation,
            detected_at=ts_from_s(time.time()),
            detail=detail or f"pid {info.pid} {info.describe()}",
        )
        self._pending_faults.append(fault)
        self._dirty.set()

    def _node_ranks(self) -> pb.NodeRanks:
        return pb.NodeRanks(
            node=self.settings.node,
            updated_at=ts_from_s(time.time()),
            ranks=[
                pb.RankStatus(
                    rank=s.rank,
                    local_rank=s.local_rank,
                    pid=s.proc.pid if s.proc else 0,
                    state=s.state,  # type: ignore[arg-type]
                    generation=s.generation,
                    restart_count=s.restart_count,
                    exit_code=s.exit_code,
                    signal=s.signal,
                    started_at=ts_from_s(s.proc.started_at) if s.proc else None,
                    node=self.settings.node,
                )
                for s in self.slots.values()
            ],
            warm_spare_pids=[p.pid for p in self._warm if p.is_running],
        )

    # ---------------------------------------------------------------- etcd writes
    async def _flush(self) -> None:
        """Write the rank table, pending faults and events in one transaction."""
        assert self.run_ref is not None
        faults, evs = list(self._pending_faults), list(self._pending_events)
        ops: list[Op] = [Put(self.keys.ranks(self.run_ref, self.settings.node), encode(self._node_ranks()))]
        for fault in faults:
            ops.append(Put(self.keys.fault(self.run_ref, fault.fault_id), encode(fault)))
            ops.append(
                events.event_put(
                    self.keys,
                    self.run_ref,
                    self.source,
                    "fault_detected",
                    f"rank {fault.rank} {fault.detail}",
                    rank=fault.rank,
                    node=self.settings.node,
                )
            )
        await self.store.txn([], [*ops, *evs])
        del self._pending_faults[: len(faults)]
        del self._pending_events[: len(evs)]

    async def _publisher(self) -> None:
        """Keep etcd's view of this node's ranks current; keep every fault until it is written."""
        delay = self.settings.retry_s
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self._flush()
                delay = self.settings.retry_s
            except EtcdUnavailable as err:
                log.info("agent %s: cannot publish (%s); retrying in %.2fs", self.settings.node, err, delay)
                self._dirty.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.retry_max_s)

    async def _keep_registered(self) -> None:
        """Re-register under a new lease whenever the old one is lost (etcd was away too long)."""
        assert self.run_ref is not None
        while True:
            lease = self._lease
            assert lease is not None
            await lease.lost.wait()
            log.warning("agent %s: lease lost; registering again", self.settings.node)
            delay = self.settings.retry_s
            while True:
                try:
                    fresh = LeaseKeeper(self.store, self.settings.lease_ttl_s)
                    await fresh.__aenter__()
                    await self.store.put(
                        self.keys.node(self.run_ref, self.settings.node), encode(self._node_record()), lease=fresh.id
                    )
                    self._lease = fresh
                    self._wake.set()
                    break
                except EtcdUnavailable:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.settings.retry_max_s)

    async def _wait_released_elsewhere(self, ranks: Sequence[int]) -> str:
        """Before starting ranks moved here, wait until no other live node still runs them (the
        faulty node releases them in parallel); "" when free, else why not (the move fails)."""
        assert self.run_ref is not None
        deadline = time.monotonic() + 2 * self.settings.stop_grace_s + 5.0
        while True:
            view = await read_job(self.store, self.keys, self.settings.job)
            busy = sorted(
                {
                    r.rank
                    for node, table in view.ranks.items()
                    if node != self.settings.node and node in view.nodes
                    for r in table.ranks
                    if r.rank in ranks and r.state in (pb.RANK_RUNNING, pb.RANK_PENDING)
                }
            )
            if not busy:
                return ""
            if time.monotonic() >= deadline:
                return f"ranks {busy} still run on another node"
            await asyncio.sleep(0.02)

    async def _register_again(self) -> None:
        """Rewrite this node's record (its ranks changed) under the current lease; a failed write
        is retried by the next reconcile (``_record_stale`` stays set)."""
        assert self.run_ref is not None and self._lease is not None
        if self._lease.lost.is_set():
            return  # _keep_registered writes the current record under the new lease
        await self.store.put(
            self.keys.node(self.run_ref, self.settings.node), encode(self._node_record()), lease=self._lease.id
        )
        self._record_stale = False

    # ---------------------------------------------------------------- reacting
    async def _watch(self) -> None:
        """Wake the reconcile on any change of the three keys this node acts on.

        Exact-key watches, not the run prefix: an agent must not receive every other node's rank
        table writes (that would grow with nodes squared).
        """
        assert self.run_ref is not None
        run = self.run_ref
        keys = (self.keys.recovery(run), self.keys.status(run), self.keys.command(run, self.settings.node))
        delay = self.settings.retry_s
        while True:
            try:
                start = await self.store.revision()
                break
            except EtcdUnavailable:
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.retry_max_s)
        self._wake.set()
        async with asyncio.TaskGroup() as group:
            for key in keys:
                group.create_task(self._wake_on(key, start + 1), name=f"agent-watch-{key.rsplit('/', 1)[1]}")

    async def _wake_on(self, key: str, start: int) -> None:
        async for _ in self.store.watch_key(key, start):
            self._wake.set()

    async def _worker(self) -> None:
        delay = self.settings.retry_s
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.reconcile()
                delay = self.settings.retry_s
            except RecoverdError as err:
                log.info("agent %s: %s; retrying in %.2fs", self.settings.node, err, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.retry_max_s)
                self._wake.set()

    async def _get(self, key: str, cls: type) -> object | None:
        kv = await self.store.get(key)
        if kv is None:
            return None
        try:
            return decode(cls, kv.value, key)
        except BadRecord as err:
            log.warning("agent %s: ignoring %s", self.settings.node, err)
            return None

    async def reconcile(self) -> None:
        """Compare what etcd asks of this node with what it has done, and close the gap."""
        assert self.run_ref is not None
        run = self.run_ref
        status = await self._get(self.keys.status(run), pb.JobStatus)
        if isinstance(status, pb.JobStatus) and status.state in (pb.JOB_SUCCEEDED, pb.JOB_FAILED):
            code = EXIT_SUCCEEDED if status.state == pb.JOB_SUCCEEDED else EXIT_FAILED
            log.info("job %s %s: %s", self.settings.job, pb.JobState.Name(status.state), status.reason)
            self._request_exit(code)
            return
        command = await self._get(self.keys.command(run, self.settings.node), pb.Command)
        if isinstance(command, pb.Command) and (command.epoch, command.seq) > self._last_applied:
            await self._execute(command)
        elif self._record_stale:
            await self._register_again()
        recovery = await self._get(self.keys.recovery(run), pb.Recovery)
        if self.settings.reset_json_mirror:
            await self._mirror_reset_json(recovery if isinstance(recovery, pb.Recovery) else None)
        if isinstance(recovery, pb.Recovery):
            await self._answer(recovery, command if isinstance(command, pb.Command) else None)

    async def _watch_reset_json(self, retry_s: float = 1.0) -> None:
        """Faults from a device plugin's reset.json, once per (rank, status, UpdateTime)."""
        assert self.settings.reset_json is not None and self.run_ref is not None
        path = self.settings.reset_json
        seen: set[tuple[int, str, int]] = set()
        while True:
            try:
                async with contextlib.aclosing(watch_file(path)) as updates:
                    async for content in updates:
                        if content is None:
                            continue
                        try:
                            state = resetjson.parse(content, source=path)
                        except BadRecord as err:
                            self._note("bad_record", f"{path}: {err.detail}; nothing applied")
                            continue
                        for rank, status in resetfile.faults_from(state, self.slots):
                            key = (rank, status, state.update_time)
                            if key in seen:
                                continue
                            seen.add(key)
                            self._record_reset_fault(self.slots[rank], status, state.update_time, path)
            except (BadRecord, ConfigError) as err:
                self._note("bad_record", f"{path}: {err.detail}; watching again in {retry_s:g}s")
                await asyncio.sleep(retry_s)

    def _note(self, reason: str, message: str) -> None:
        assert self.run_ref is not None
        log.warning("agent %s: %s", self.settings.node, message)
        self._pending_events.append(events.event_put(self.keys, self.run_ref, self.source, reason, message))
        self._dirty.set()

    def _record_reset_fault(self, slot: RankSlot, status: str, update_time: int, path: str) -> None:
        fault = pb.Fault(
            fault_id=f"{self.settings.node}.r{slot.rank}.reset.{update_time}",
            rank=slot.rank,
            node=self.settings.node,
            fault_type="1",
            source=pb.SOURCE_AGENT,
            generation=slot.generation,
            detected_at=ts_from_s(time.time()),
            detail=f"{path}: rank {slot.rank} is {status} (device fault)",
        )
        self._pending_faults.append(fault)
        self._dirty.set()

    async def _mirror_reset_json(self, recovery: pb.Recovery | None) -> None:
        assert self.settings.reset_json_mirror is not None and self.run_ref is not None
        history = await self._get(self.keys.history(self.run_ref), pb.History)
        restarts = sum(1 for o in history.outcomes if o.strategy == "exit") if isinstance(history, pb.History) else 0
        state = resetfile.mirror_state(recovery, restarts, self._mirrored)
        if state is not self._mirrored:
            await asyncio.to_thread(resetjson.write_file, self.settings.reset_json_mirror, state)
            self._mirrored = state

    async def _execute(self, command: pb.Command) -> None:
        """Apply one command exactly once: (epoch, seq) above the last applied one."""
        assert self.run_ref is not None
        action = command.action
        ranks = sorted({r for r in command.ranks if 0 <= r < self.settings.world_size})
        held_before = sorted(self.slots)
        problem = ""
        if action == pb.ACTION_START_RANKS:
            problem = await self._wait_released_elsewhere(ranks)
        if action == pb.ACTION_RESTART_RANKS and not set(ranks) <= set(self.slots):
            problem = f"ranks {sorted(set(ranks) - set(self.slots))} are not on this node"
        if action in (pb.ACTION_START_RANKS, pb.ACTION_RESTART_ALL) and not problem:
            # START_RANKS: ranks moved here; RESTART_ALL's ranks: ranks this node takes back.
            for rank in ranks:
                if rank not in self.slots:
                    self.slots[rank] = RankSlot(rank, rank % self.settings.nproc_per_node)
        if problem:
            targets: list[RankSlot] = []
        elif action == pb.ACTION_RESTART_ALL:
            targets = list(self.slots.values())
        else:
            targets = [self.slots[r] for r in ranks if r in self.slots]
        await self._stop_ranks(targets)
        if action == pb.ACTION_RELEASE_RANKS:
            for slot in targets:
                del self.slots[slot.rank]
        elif action != pb.ACTION_STOP_ALL:
            for slot in targets:
                slot.restart_count += 1
                self._start(slot, command.epoch, f"restart ({command.strategy})")
        if sorted(self.slots) != held_before:
            self.is_spare = self.is_spare and not self.slots
            self._record_stale = True
        self._last_applied = (command.epoch, command.seq)
        ok = not problem and (
            all(s.state == pb.RANK_RUNNING for s in targets) or action in (pb.ACTION_STOP_ALL, pb.ACTION_RELEASE_RANKS)
        )
        if problem:
            self._failed_commands[command.epoch] = problem
            log.error("agent %s: %s: %s", self.settings.node, pb.CommandAction.Name(action), problem)
        ack = pb.CommandAck(
            epoch=command.epoch,
            seq=command.seq,
            ok=ok,
            detail=problem or f"{pb.CommandAction.Name(command.action)} ranks {[s.rank for s in targets]}",
            done_at=ts_from_s(time.time()),
            pids=[s.proc.pid for s in targets if s.proc is not None] if action != pb.ACTION_RELEASE_RANKS else [],
        )
        self._pending_events.append(
            events.event_put(
                self.keys,
                self.run_ref,
                self.source,
                "command_executed",
                f"{pb.CommandAction.Name(command.action)} (epoch {command.epoch}, seq {command.seq}):"
                f" ranks {[s.rank for s in targets]} now pids {list(ack.pids)}",
                epoch=command.epoch,
                node=self.settings.node,
            )
        )
        await self.store.put(self.keys.ack(self.run_ref, self.settings.node), encode(ack))
        await self._flush()
        if self._record_stale:
            await self._register_again()

    async def _answer(self, recovery: pb.Recovery, command: pb.Command | None) -> None:
        """Answer the current phase for this node's ranks, once per (epoch, phase)."""
        assert self.run_ref is not None
        commanded = recovery.phase == pb.PHASE_RECOVERING and self.settings.node in recovery.command_nodes
        if (self.participant not in recovery.participants and not commanded) or (
            recovery.epoch,
            recovery.phase,
        ) in self._answered:
            return
        report = pb.Report(
            participant=self.participant,
            epoch=recovery.epoch,
            uuid=recovery.uuid,
            reported_at=ts_from_s(time.time()),
            fault_ranks=sorted({f.rank for f in recovery.faults}),
        )
        if recovery.phase == pb.PHASE_STOPPING:
            # The faulty ranks of this node must be down before we say "stopped" (a hung one may not be).
            local_faulty = [self.slots[f.rank] for f in recovery.faults if f.rank in self.slots]
            await self._stop_ranks(local_faulty)
            report.kind = pb.REPORT_STOP_COMPLETE
        elif recovery.phase == pb.PHASE_GLOBAL_FAULT:
            report.kind = pb.REPORT_STRATEGIES
            assert self._launcher is not None
            movable = self._launcher.starts_any_rank
            report.strategies.extend(s for s in AGENT_STRATEGIES if movable or s != "recover")
        elif recovery.phase == pb.PHASE_RECOVERING:
            mine = command is not None and command.epoch == recovery.epoch
            if mine and self._last_applied < (command.epoch, command.seq):  # type: ignore[union-attr]
                return  # the command is not applied yet; answered after it is
            report.kind = pb.REPORT_RECOVER_STATUS
            report.strategy = recovery.strategy
            failed = [s.rank for s in self.slots.values() if s.state == pb.RANK_FAILED]
            problem = self._failed_commands.get(recovery.epoch, "") if mine else ""
            report.code = 0 if not (mine and (failed or problem)) else 1
            report.message = "" if report.code == 0 else problem or f"ranks {failed} failed to restart"
        else:
            return
        kind = pb.ReportKind.Name(report.kind).removeprefix("REPORT_").lower()
        await self.store.put(self.keys.report(self.run_ref, self.participant, kind), encode(report))
        self._answered.add((recovery.epoch, recovery.phase))
