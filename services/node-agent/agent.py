"""The node agent: runs this node's ranks and answers the recovery protocol for them.

Policy lives here; the parts it is made of each own their state:

* ``settings.py``: what the agent is asked to do (checked once);
* ``membership.py``: joining the job and staying registered under a lease;
* ``ranktable.py``: the local ranks across their incarnations (what ``ranks/<node>`` says);
* ``outbox.py``: faults and events, kept until etcd has them;
* ``warm.py``: warm spare processes;
* ``launcher.py`` / ``runtime.py``: the mechanism (start, stop, reap; or msrun, or adopted processes).

The agent

1. **joins the job** and **registers the node** (membership);
2. **starts the local ranks** with torchrun-style and MindCluster environment variables;
3. **records a fault at once** when a rank exits non-zero (pidfd, no polling), with the exit code or
   signal and the tail of its log; exits it caused itself (commands, shutdown) are never faults;
4. **executes commands** (restart some ranks, restart all) addressed to its node, idempotently by
   (epoch, seq), and acknowledges them;
5. **answers the protocol** for ranks that run no client: stop-complete, its supported strategies
   (`recover-in-place`, `recover`, `exit`) and the recover status; and for the ranks whose clients
   joined through its socket (``rankclients.py``, docs/adr/0036), one report per phase for all;
6. **ends with the job**: exit 0 when the coordinator records success, 1 when it records failure.

A **spare** agent (``--spare``) joins a running job with no ranks; a `recover` gives it a faulty
node's ranks (START_RANKS) while that node's agent, if alive, gives them up (RELEASE_RANKS). Ranks
keep their global rank; GROUP_RANK and LOCAL_RANK follow from it (rank // and % nproc-per-node).

Losing etcd does not stop training: ranks keep running in their own sessions, writes are kept and
retried, watches resume, and a lost lease is re-acquired; the agent never kills ranks because it
lost etcd. SIGTERM/SIGINT stop the ranks (SIGTERM, grace, SIGKILL) and exit 143/130.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence

import psutil

from recoverd import events, metrics, participants, rankwire, resetjson
from recoverd.agent import resetfile
from recoverd.agent.aggregate import declaration
from recoverd.agent.crashloop import CrashLoop
from recoverd.agent.detectors import (
    DETECTORS,
    Detected,
    Detector,
    ExitDetector,
    FaultKind,
    fault_id,
    mindcluster_fault_type,
)
from recoverd.agent.detectors.hang import HangDetector
from recoverd.agent.detectors.progress_socket import address_for
from recoverd.agent.detectors.runner import DetectorSet
from recoverd.agent.launcher import (
    SPARE_RANK,
    START_TIME_SLACK_S,
    ExitInfo,
    FoundRank,
    Launcher,
    RankLaunch,
    RankProcess,
    find_rank_processes,
    process_start_time,
)
from recoverd.agent.membership import Membership
from recoverd.agent.outbox import Outbox
from recoverd.agent.rankclients import RankClients
from recoverd.agent.ranktable import LIVE_STATES, RankSlot, RankTable
from recoverd.agent.readopt import plan_adoption
from recoverd.agent.runtime import RankRuntime, RuntimeFactory
from recoverd.agent.settings import (
    EXIT_FAILED,
    EXIT_REFUSED,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    EXIT_SUCCEEDED,
    AgentSettings,
)
from recoverd.agent.warm import WarmSpares
from recoverd.agent.warmstart import WarmStart
from recoverd.agent.watched import WatchedKeys
from recoverd.codes import Code
from recoverd.errors import (
    BadRecord,
    EtcdUnavailable,
    FenceLost,
    JobSpecMismatch,
    LaunchFailed,
    Reason,
    RecoverdError,
)
from recoverd.etcd_security import SECRET_ENV
from recoverd.jobview import JobView, ranks_running_elsewhere, read_node_view
from recoverd.keys import Keyspace, RunRef
from recoverd.records import decode, encode, pb, ts_from_s
from recoverd.resetjson import ResetState
from recoverd.store import Delete, Put, Store
from recoverd.strategies import AGENT_STRATEGIES, RETRYABLE_FAULT_TYPES
from recoverd.validate import report_kind_name

__all__ = [
    "EXIT_FAILED",
    "EXIT_REFUSED",
    "EXIT_SIGINT",
    "EXIT_SIGTERM",
    "EXIT_SUCCEEDED",
    "AgentSettings",
    "NodeAgent",
    "RankSlot",
    "become_subreaper",
]

log = logging.getLogger(__name__)
#: The lines of a failed rank's output shown in the agent's log (the whole tail is in its fault record).
LAST_LINES_SHOWN = 10


def become_subreaper() -> bool:
    """PR_SET_CHILD_SUBREAPER: orphaned descendants re-parent to us, so we can see and reap them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(36, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _same_process(proc: RankProcess) -> bool:
    """``proc``'s pid still names the process the agent started (pid plus start time)."""
    try:
        return abs(process_start_time(proc.pid) - proc.started_at) <= START_TIME_SLACK_S
    except psutil.Error:
        return False


def _export_rank_gauges(job: str, node: str, record: pb.NodeRanks) -> None:
    """``recoverd_agent_ranks{state}`` and ``recoverd_agent_warm_spares`` from the table it writes."""
    counts = dict.fromkeys(pb.RankState.keys(), 0)
    for status in record.ranks:
        counts[pb.RankState.Name(status.state)] += 1
    for state, count in counts.items():
        if state == "RANK_STATE_UNSPECIFIED":
            continue
        metrics.RANKS.labels(job, node, state.removeprefix("RANK_").lower()).set(count)
    metrics.WARM_SPARES.labels(job, node).set(len(record.warm_spare_pids))


class NodeAgent:
    """``exit_code = await NodeAgent(store, keys, settings).run()``."""

    def __init__(
        self,
        store: Store,
        keys: Keyspace,
        settings: AgentSettings,
        protected_pids: Callable[[], set[int]] = set,
        runtime: RuntimeFactory = Launcher,
        detectors: Sequence[type[Detector]] = DETECTORS,
    ) -> None:
        self.store = store
        self.keys = keys
        self.settings = settings
        self._protected_pids = lambda: protected_pids() | self._warm_start_pids()
        self._runtime_factory = runtime
        self.participant = participants.of_node(settings.node)
        self.table = RankTable(settings.node, settings.nproc_per_node, settings.local_ranks)
        self.membership = Membership(store, keys, settings, self.table, self.source)
        self.outbox = Outbox(
            store,
            keys,
            settings.node,
            self.source,
            self._rank_table_record,
            self.membership.fence,
            self._on_fence_lost,
            retry_s=settings.retry_s,
            retry_max_s=settings.retry_max_s,
        )
        self._launcher: RankRuntime | None = None
        self._warm: WarmSpares | None = None
        self._warm_start: WarmStart | None = None
        #: Held while a command is carried out and while the first start starts the ranks after its
        #: wait: the two never interleave (a command's stop grace is an await), so no rank gets two.
        self._starting = asyncio.Lock()
        self._wake = asyncio.Event()
        #: The keys this agent watches, as its watches last delivered them (its reconcile's reads).
        self._watched = WatchedKeys(store)
        self._last_applied: tuple[int, int] = (0, 0)
        self._answered: set[tuple[int, str, int]] = set()
        self._exit_code: asyncio.Future[int] | None = None
        self._mirrored: ResetState | None = None
        #: The ranks are left running on the way out: another agent took this node over (this one
        #: was presumed dead: they are that agent's now), or this agent's machinery broke (the next
        #: agent adopts them).
        self._leaves_ranks = False
        #: This node's key changed: make sure it still holds this agent's record.
        self._check_registration = False
        #: The job's spec changed: a clobbered one is written again from this agent's copy.
        self._check_spec = False
        #: Commands recorded as forged (epoch ahead of the recovery's), so each is noted once.
        self._ignored_commands: set[tuple[int, int]] = set()
        #: Ids of the faults queued so far: a detector reporting one fault twice queues it once.
        self._reported: set[str] = set()
        #: Whether the job's recovery was in progress at the last reconcile (told to the detectors).
        self._recovery_active = False
        resetfile.check_paths(settings.reset_json, settings.reset_json_mirror)
        self.detectors = DetectorSet(self, settings, detectors)
        exits = self.detectors.get(ExitDetector)
        assert exits is not None, "the exit detector is always registered"
        self._exits = exits
        #: The ranks' recovery clients that joined through this node's socket (None: not serving).
        self.rank_clients: RankClients | None = None
        #: Ranks failing right after their start are started later each time (docs/adr/0046).
        self._crash_loop = CrashLoop(max_s=settings.crash_backoff_max_s)

    @property
    def slots(self) -> dict[int, RankSlot]:
        return self.table.slots

    @property
    def source(self) -> str:
        return self.participant

    # ---------------------------------------------------------------- the detectors' host
    @property
    def node(self) -> str:
        return self.settings.node

    def ranks(self) -> Mapping[int, RankSlot]:
        return self.slots

    def spec(self) -> pb.JobSpec | None:
        return self.membership.spec

    def report(self, found: Detected) -> None:
        """Queue a detector's fault (once per fault id); the publisher writes it, retrying while
        etcd is away."""
        slot = self.slots.get(found.rank)
        if slot is None:
            return  # the rank moved away since the observation: not this node's fault any more
        if found.incarnation is not None and found.incarnation != slot.incarnation:
            log.info("agent %s: %s fault of rank %d dropped: restarted since", self.node, found.kind, slot.rank)
            return  # the incarnation observed is gone: the new one is not at fault
        fid = fault_id(self.settings.node, slot.rank, slot.generation, slot.restart_count, found.kind, found.instance)
        if fid in self._reported:
            return
        self._reported.add(fid)
        if found.kind is not FaultKind.EXIT:  # an exit has its own line (_on_rank_exit)
            log.warning("rank %d %s fault: %s", slot.rank, found.kind.value, found.detail)
        elif tail := found.stderr_tail.strip().splitlines()[-LAST_LINES_SHOWN:]:
            # The script's own error where the operator is looking, not only in the rank's log.
            where = f" ({slot.proc.log_path})" if slot.proc is not None and slot.proc.log_path else ""
            log.warning("rank %d's last lines%s:\n%s", slot.rank, where, "\n".join(f"  | {line}" for line in tail))
        self.outbox.add_fault(
            pb.Fault(
                fault_id=fid,
                rank=slot.rank,
                node=self.settings.node,
                fault_type=mindcluster_fault_type(found.kind),
                kind=found.kind.value,
                source=pb.SOURCE_AGENT,
                generation=slot.generation,
                detected_at=ts_from_s(found.detected_at if found.detected_at is not None else time.time()),
                detail=found.detail,
                exit_code=found.exit_code,
                signal=found.signal,
                stderr_tail=found.stderr_tail,
                stacks=found.stacks,
            )
        )

    def note(
        self, reason: str, message: str, *, rank: int | None = None, data: Mapping[str, str] | None = None
    ) -> None:
        """Record an event of this node (logged as a warning)."""
        run = self.membership.run
        log.warning("agent %s: %s", self.settings.node, message)
        if run is None:
            return  # not joined yet: the log line is all there is
        self.outbox.add_event(
            events.event_put(
                self.keys, run, self.source, reason, message, rank=rank, node=self.settings.node, data=dict(data or {})
            )
        )

    # ---------------------------------------------------------------- lifecycle
    async def run(self) -> int:
        """Join, start the ranks, serve until the job ends or a signal arrives; return the exit code."""
        loop = asyncio.get_running_loop()
        self._exit_code = loop.create_future()
        self._launcher = self._runtime_factory(self._on_rank_exit, self._protected_pids)
        self.membership.strategies, _ = declaration(
            self._offered_strategies(), {}, self.slots.keys(), rejoins_alone=self._rejoins_alone()
        )
        self._warm = WarmSpares(
            self._launcher,
            self._spare_launch,
            self.settings.node,
            self.settings.warm_spares,
            self.settings.warm_spare_refill_s,
            self.outbox.mark_dirty,
        )
        await self.membership.open_lease()
        try:
            try:
                joined = await self.membership.join()
            except JobSpecMismatch as err:
                log.error("refused to join job %s: %s", self.settings.job, err.detail)
                return EXIT_REFUSED
            self.outbox.run = self.membership.run
            if joined is not None:
                # An ack from a later epoch than the recovery's is not ours (forged): ignored.
                epoch = joined.recovery.epoch if joined.recovery is not None else 0
                self._last_applied = min(await self.membership.last_applied(), (epoch, 2**62))
                await self._adopt_ranks(joined)
            elif self.membership.replaced_run is not None:
                await self._stop_leftovers(self.membership.replaced_run)
            for signum, code in self.settings.exit_signals.items():
                loop.add_signal_handler(signum, self._request_exit, code)
            # Only a runtime whose ranks are our children has zombies to reap (msrun reaps its own;
            # simulated ranks have none), and signal handlers exist only on the main thread.
            reaps = isinstance(self._launcher, Launcher)
            if reaps:
                loop.add_signal_handler(signal.SIGCHLD, self._launcher.reap_strays)
            self._open_rank_clients()
            self._start_warm_start()
            first_start_waits = (
                self._warm_start is not None and self._warm_start.starting and self.settings.warm_start_wait_s > 0
            )
            if first_start_waits:
                # A warm spare imports the framework itself: it starts now, beside the server, so
                # that it is ready as early as it was when the first start did not wait.
                self._warm.fill()
                # The ranks, pending, are in etcd during the wait: a node lost now is recovered.
                self.outbox.mark_dirty()
            else:
                self._launch()
            try:
                async with asyncio.TaskGroup() as group:
                    tasks = [
                        group.create_task(self.outbox.publish(), name="agent-publisher"),
                        group.create_task(self._watch(), name="agent-watch"),
                        group.create_task(self._worker(), name="agent-worker"),
                        group.create_task(self.membership.keep_registered(self._rejoin), name="agent-lease"),
                        group.create_task(self._launcher.watch(), name="agent-runtime"),
                    ]
                    tasks.append(group.create_task(self.detectors.run(), name="agent-detectors"))
                    if self.rank_clients is not None:
                        tasks.append(group.create_task(self.rank_clients.serve(), name="agent-rank-clients"))
                    for task in tasks:
                        if task.get_name() != "agent-runtime":  # the process launcher has nothing to watch
                            task.add_done_callback(self._machinery_ended)
                    first_start = (  # ends once the ranks are started: not machinery
                        group.create_task(self._launch_when_warm(), name="agent-first-start")
                        if first_start_waits
                        else None
                    )
                    code = await self._exit_code
                    if first_start is not None:
                        first_start.cancel()  # ending: start nothing (the server is stopped next)
                    await self._finish(code)
                    for task in tasks:
                        task.cancel()
            finally:
                for signum in (*self.settings.exit_signals, *((signal.SIGCHLD,) if reaps else ())):
                    loop.remove_signal_handler(signum)
            return code
        finally:
            if self._warm_start is not None:
                self._warm_start.stop()
            if self._launcher is not None and self._launcher.processes and not self._leaves_ranks:
                await self._stop_ranks(list(self.table))
                await self._warm.stop(self.settings.stop_grace_s)
            await self.membership.close()

    def _launch(self) -> None:
        """The job's first start on this node: its ranks, then its warm spares."""
        assert self._warm is not None
        self._start_all(generation=0, header="launch", spares=False)
        self._warm.fill()

    async def _launch_when_warm(self) -> None:
        """The first start waits (at most ``warm_start_wait_s``) for the warm-start server that is
        importing the framework, so that every rank is forked from it (docs/adr/0039): one import per
        node instead of one per rank, the first start done the way every restart is, and ranks that
        share the server's frozen objects end in a tenth of the time. A server that dies or is given
        up ends the wait at once: the ranks start plainly, as they do without warm starts."""
        assert self._warm_start is not None and self._exit_code is not None
        waited = time.monotonic()
        ready = await self._warm_start.wait_ready(self.settings.warm_start_wait_s)
        async with self._starting:  # a command being carried out finishes first
            if self._exit_code.done():
                return  # ending (the server was stopped for it): start nothing
            if ready:
                log.info("agent %s: first start forked from the warm-start server (waited %.1fs)", self.settings.node,
                         time.monotonic() - waited)  # fmt: skip
            else:
                why = self._warm_start.unavailable or f"not ready within {self.settings.warm_start_wait_s:g}s"
                log.warning("agent %s: first start without the warm-start server (%s)", self.settings.node, why)
            # The warm spares were started before the wait; they are kept for restarts.
            self._start_all(generation=0, header="launch", spares=False)

    def _machinery_ended(self, task: asyncio.Task[None]) -> None:
        """A task that must run for the agent's whole life ended (a bug, or a cancellation nobody
        asked for): without it the agent would hold its lease and act on nothing. It ends non-zero
        and leaves the ranks running: the same command started again adopts them (ADR 0023)."""
        if self._exit_code is None or self._exit_code.done():
            return  # ending anyway
        why = "was cancelled" if task.cancelled() else f"failed: {task.exception()!r}" if task.exception() else "ended"
        log.error(
            "agent %s: its task %s %s; ending, leaving the ranks running for the next agent to adopt",
            self.settings.node,
            task.get_name(),
            why,
        )
        self._leaves_ranks = True  # the ranks are the next agent's: not stopped on the way out
        self._request_exit(EXIT_FAILED)

    def _request_exit(self, code: int) -> None:
        if self._exit_code is not None and not self._exit_code.done():
            log.info("agent %s: exiting with %d", self.settings.node, code)
            self._exit_code.set_result(code)

    async def _finish(self, code: int) -> None:
        """Stop what still runs and flush the final rank states (bounded: etcd may be down)."""
        if self._leaves_ranks:
            log.error("agent %s: ending; its ranks are the new agent's and keep running", self.settings.node)
            return
        await self._stop_ranks(self.table.running())
        for slot in self.table:
            if slot.proc is None and slot.state == pb.RANK_PENDING:
                slot.state = pb.RANK_STOPPED  # never started (it ended during the first start's wait)
        assert self._warm is not None
        await self._warm.stop(self.settings.stop_grace_s)
        standbys: set[int] = set()
        if self._warm_start is not None:
            standbys = self._warm_start.standby_pids()
            self._warm_start.stop()
        if self._launcher is not None:
            # A standby still ending with its server is recoverd's own: swept quietly.
            killed = [pid for pid in self._launcher.kill_strays() if pid not in standbys]
            if killed:
                log.warning(
                    "agent %s: killed %d process(es) left behind by ranks: %s", self.settings.node, len(killed), killed
                )
        with contextlib.suppress(RecoverdError, TimeoutError):
            async with asyncio.timeout(2.0):
                await self.outbox.flush()

    # ---------------------------------------------------------------- re-adoption and fencing
    async def _adopt_ranks(self, view: JobView) -> None:
        """A restarted agent takes over the ranks its predecessor left running (readopt.py): the
        live ones are adopted with their PIDs, the ones that died meanwhile are faults, and any
        other process of this run and node is stopped, so no rank ever runs twice."""
        launcher = self._launcher
        run = self.membership.run
        assert run is not None
        if not (isinstance(launcher, Launcher) and launcher.starts_any_rank):
            return  # msrun and `recoverd adopt` own their processes' lifecycle themselves
        table = view.ranks.get(self.settings.node)
        found = await asyncio.to_thread(find_rank_processes, run.uid, self.settings.node)
        if table is None and not found:
            return
        # Ranks moved here (a spare's, START_RANKS) are this node's although its settings do not
        # name them: the rank table in etcd does, unless another live node runs them now.
        elsewhere = ranks_running_elsewhere(view, self.settings.node)
        gained = [r.rank for r in (table.ranks if table is not None else []) if r.state in LIVE_STATES]
        for rank in sorted(set(gained) - set(self.slots) - elsewhere):
            self.table.add(rank)
        if set(gained) - elsewhere - set(self.settings.local_ranks):
            self.membership.is_spare = False
            self.membership.is_record_stale = True
        plan = plan_adoption(list(table.ranks) if table is not None else [], found, self.table.slots)
        for rank, (status, proc) in plan.adopt.items():
            slot = self.slots[rank]
            slot.generation, slot.restart_count = status.generation, status.restart_count
            try:
                slot.proc = launcher.adopt(rank, proc.pid, proc.started_at, self._log_path(rank))
            except LaunchFailed as err:
                plan.died[rank] = status
                log.warning("agent %s: %s", self.settings.node, err.detail)
                continue
            slot.state = pb.RANK_RUNNING
            self.detectors.rank_started(slot)
        for rank, status in plan.died.items():
            slot = self.slots[rank]
            slot.generation, slot.restart_count = status.generation, status.restart_count
            slot.state = pb.RANK_FAILED
            self._exits.exited(
                slot,
                ExitInfo(status.pid, None, None),
                detail=f"pid {status.pid} ended while no agent watched it (exit status unknown)",
            )
        recorded = {r.rank: r for r in table.ranks} if table is not None else {}
        for rank in plan.start:
            if rank in recorded:  # stopped, not finished: started again, counted as a restart
                slot = self.slots[rank]
                slot.generation = recorded[rank].generation
                slot.restart_count = recorded[rank].restart_count + 1
        for rank, status in plan.keep.items():
            slot = self.slots[rank]
            slot.generation, slot.restart_count = status.generation, status.restart_count
            slot.state, slot.exit_code, slot.signal = status.state, status.exit_code, status.signal
        stale = await self._stop_found(launcher, plan.stop)
        message = (
            f"agent restarted: adopted ranks {sorted(plan.adopt)} (pids {[p.pid for _, p in plan.adopt.values()]}),"
            f" died meanwhile {sorted(plan.died)}, left as they were {sorted(plan.keep)},"
            f" stopped {stale} other process(es) of this node"
        )
        log.warning("agent %s: %s", self.settings.node, message)
        self.outbox.add_event(
            events.event_put(self.keys, run, self.source, "ranks_adopted", message, node=self.settings.node)
        )

    async def _stop_leftovers(self, run: RunRef) -> None:
        """Stop what an abandoned run (replaced by a new one) left running on this node: a rank
        must never run twice, once per run."""
        launcher = self._launcher
        if not (isinstance(launcher, Launcher) and launcher.starts_any_rank):
            return
        found = await asyncio.to_thread(find_rank_processes, run.uid, self.settings.node)
        stopped = await self._stop_found(launcher, found)
        if stopped:
            log.warning("agent %s: stopped %d process(es) left by run %s", self.settings.node, stopped, run.uid)

    async def _stop_found(self, launcher: Launcher, found: Sequence[FoundRank]) -> int:
        """Stop processes of this node that no rank slot holds (adopted just to be stopped, as a
        group, gracefully); return how many were still there."""
        procs = []
        for other in found:
            with contextlib.suppress(LaunchFailed):  # gone already
                procs.append(launcher.adopt(SPARE_RANK, other.pid, other.started_at, None))
        await asyncio.gather(*(launcher.stop(p, self.settings.stop_grace_s) for p in procs))
        return len(procs)

    async def _rejoin(self) -> None:
        """Register again after the lease was lost. Meanwhile the node may have been declared lost
        and its ranks moved to a spare: those are stopped here first (they run elsewhere now), and
        only then is the node registered (and its writes accepted) again."""
        view = await read_node_view(self.store, self.keys, self.settings.job, self.settings.node, self.table.slots)
        run = self.membership.run
        if view.run != run:
            log.error("agent %s: run %s is over (the job now has another run)", self.settings.node, run)
            self._request_exit(EXIT_FAILED)
            return
        if view.status is not None and view.status.state in (pb.JOB_SUCCEEDED, pb.JOB_FAILED):
            self._wake.set()  # reconcile ends the agent with the job's outcome
            return
        elsewhere = ranks_running_elsewhere(view, self.settings.node)
        moved = [self.slots[r] for r in sorted(elsewhere & set(self.slots))]
        if moved:
            log.warning(
                "agent %s: ranks %s run on another node now; stopping them here",
                self.settings.node,
                [s.rank for s in moved],
            )
            await self._stop_ranks(moved)
            for slot in moved:
                self.table.remove(slot.rank)
        try:
            await self.membership.register()
        except FenceLost as err:
            self._supersede(err.detail)
            return
        self.outbox.mark_dirty()
        self._wake.set()

    async def _on_fence_lost(self) -> None:
        """A write was refused by the fence: find out why and act (never guess)."""
        holder = await self.membership.holder()
        if holder == "me":
            return
        lease = self.membership.lease
        if holder == "nobody":
            if lease is not None and not lease.lost.is_set():
                log.warning("agent %s: its registration is gone; registering again", self.settings.node)
                lease.lost.set()
            return
        self._supersede(f"node {self.settings.node} is registered by {holder}")

    async def _still_holds_node(self) -> bool:
        """Whether this agent still holds its node's registration, read from etcd before it carries
        out a command: an agent that was frozen or cut off while a successor took the node over
        may see the successor's command before it sees the node key change, and must not start a
        second process for a rank (one etcd read per command)."""
        lease = self.membership.lease
        if lease is None or lease.lost.is_set() or self.membership.rejoining:
            return False  # keep_registered registers again first; the command waits for that
        holder = await self.membership.holder()
        if holder == "me":
            return True
        if holder == "nobody":
            await self._keep_registration()
        else:
            self._supersede(f"node {self.settings.node} is registered by {holder}")
        return False

    def _supersede(self, why: str) -> None:
        log.error("agent %s: superseded (%s); ending without touching its ranks", self.settings.node, why)
        self._leaves_ranks = True
        self._request_exit(EXIT_REFUSED)

    async def _fenced_put(self, key: str, value: bytes) -> None:
        """A put that only lands while this agent holds its node's registration."""
        if not (await self.store.txn(self.membership.fence(), [Put(key, value)])).succeeded:
            raise FenceLost(f"node {self.settings.node}: a write was refused, its registration is not this agent's")

    # ---------------------------------------------------------------- ranks
    def _base_env(self) -> dict[str, str]:
        """The agent's environment for a rank, less its etcd secrets, plus the paths a rank's
        client needs to connect as the agent does (docs/security.md: paths, never a password)."""
        env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
        env.update(self.settings.extra_env)
        env.update((self.settings.rank_etcd or self.store.security).rank_env())
        return env

    def _rank_env(self, slot: RankSlot) -> dict[str, str]:
        spec = self.membership.spec
        assert spec is not None
        s = self.settings
        env = self._base_env()
        env.update(
            {
                "RANK": str(slot.rank),
                "LOCAL_RANK": str(slot.local_rank),
                "WORLD_SIZE": str(spec.world_size),
                "LOCAL_WORLD_SIZE": str(s.nproc_per_node),
                "GROUP_RANK": str(s.group_rank(slot.rank)),
                "NODE_RANK": str(s.group_rank(slot.rank)),
                "MASTER_ADDR": spec.master_addr,
                "MASTER_PORT": str(spec.master_port),
                "RANK_ID": str(slot.rank),
                "DEVICE_ID": str(slot.local_rank),
                "RECOVERD_ETCD": s.etcd,
                "RECOVERD_JOB": s.job,
                "RECOVERD_RUN": spec.uid,
                "RECOVERD_NODE": s.node,
                "RECOVERD_PREFIX": self.keys.prefix,
                "RECOVERD_GENERATION": str(slot.generation),
                "RECOVERD_RESTART_COUNT": str(slot.restart_count),
                "RECOVERD_PROGRESS_SOCKET": address_for(spec.uid, s.node) if s.hang_detection else "",
                rankwire.ADDRESS_ENV: self.rank_clients.address if self.rank_clients is not None else "",
                # Where the client's faulthandler writes its stacks for the agent (beside the logs).
                **({"RECOVERD_STACK_DIR": os.path.join(s.log_dir, "stacks")} if s.log_dir else {}),
                # torchrun's count is the whole group's, the same in every rank; the recovery round
                # that started a rank is too (its own restart count is not: a rank moved to a new
                # node, or restarted in place, counts apart), so scripts that key their rendezvous
                # on it (PrefixStore(f"attempt{N}")) meet after an exit that moved ranks.
                "TORCHELASTIC_RESTART_COUNT": str(slot.generation),
            }
        )
        return env

    def _log_path(self, rank: int) -> str | None:
        if not self.settings.log_dir:
            return None
        return os.path.join(self.settings.log_dir, f"rank{rank}.log")

    def _start(self, slot: RankSlot, generation: int, header: str, *, spares: bool = True) -> None:
        """Start ``slot``'s rank: a waiting warm spare (unless ``spares`` is False: the first start
        keeps them for restarts), else forked from the warm-start server, else a new process."""
        assert self._launcher is not None and self._warm is not None
        if slot.is_running:  # never two processes for one rank, whatever raced to start it
            assert slot.proc is not None
            log.error("agent %s: rank %d still runs as pid %d: not starting another", self.settings.node, slot.rank,
                      slot.proc.pid)  # fmt: skip
            return
        slot.generation = generation
        wait = self._crash_loop.starting(slot.rank)
        launch = RankLaunch(
            rank=slot.rank,
            argv=self.settings.argv,
            env=self._rank_env(slot),
            cwd=self.settings.cwd,
            log_path=self._log_path(slot.rank),
            header=f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} rank {slot.rank} {header}"
            f" generation {generation} restart {slot.restart_count}",
            start_delay_s=wait,
        )
        if wait:
            self.note(
                "crash_loop_backoff",
                f"rank {slot.rank} failed within {self._crash_loop.early_s:g}s of its start"
                f" {self._crash_loop.streak(slot.rank)} times in a row: its command runs in {wait:g}s",
                rank=slot.rank,
            )
        try:
            # A waiting start is a plain one: a warm spare or a fork would run at once.
            spare = self._warm.take(launch) if spares and not wait else None
            slot.proc = spare or (None if wait else self._warm_started(launch)) or self._launcher.start(launch)
        except LaunchFailed as err:
            log.error("%s", err)
            slot.proc = None
            slot.state, slot.exit_code, slot.signal = pb.RANK_FAILED, 127, 0
            self._exits.exited(slot, ExitInfo(0, 127, None), detail=err.detail)
            return
        slot.state, slot.exit_code, slot.signal, slot.is_stopping = pb.RANK_RUNNING, 0, 0, False
        self.detectors.rank_started(slot)
        self.outbox.mark_dirty()

    def _warm_started(self, launch: RankLaunch) -> RankProcess | None:
        return self._warm_start.spawn(launch) if self._warm_start is not None else None

    def _warm_start_pids(self) -> set[int]:
        pid = self._warm_start.pid if self._warm_start is not None else None
        return {pid} if pid else set()

    def _start_warm_start(self) -> None:
        """The warm-start server (docs/pytorch.md): only where this agent starts the processes."""
        if not self.settings.warm_start or not isinstance(self._launcher, Launcher):
            return
        spare = self._spare_launch()
        log_path = os.path.join(self.settings.log_dir, "warm-start.log") if self.settings.log_dir else None
        self._warm_start = WarmStart(
            self._launcher, self.settings.argv, spare.env, self.settings.cwd, self.settings.warm_start_modules, log_path
        )
        self._warm_start.start()

    def _spare_launch(self) -> RankLaunch:
        spec = self.membership.spec
        assert spec is not None
        env = self._base_env()
        env.update(
            {
                "RECOVERD_ETCD": self.settings.etcd,
                "RECOVERD_JOB": self.settings.job,
                "RECOVERD_RUN": spec.uid,
                "RECOVERD_NODE": self.settings.node,
                "RECOVERD_PREFIX": self.keys.prefix,
            }
        )
        log_path = os.path.join(self.settings.log_dir, "warm-spares.log") if self.settings.log_dir else None
        return RankLaunch(-1, self.settings.argv, env, self.settings.cwd, log_path, "warm spare")

    def _start_all(self, generation: int, header: str, *, spares: bool = True) -> None:
        """Start every rank that has no incarnation yet (adopted and finished ones are left alone)."""
        for slot in self.table:
            if slot.proc is None and slot.state == pb.RANK_PENDING:
                self._start(slot, max(generation, slot.generation), header, spares=spares)

    async def _stop_ranks(self, slots: Sequence[RankSlot]) -> None:
        assert self._launcher is not None
        running = [s for s in slots if s.is_running]
        for slot in running:
            slot.is_stopping = True
        await asyncio.gather(*(self._launcher.stop(s.proc, self.settings.stop_grace_s) for s in running if s.proc))

    def _on_rank_exit(self, proc: RankProcess, info: ExitInfo) -> None:
        if self._warm is not None and self._warm.owns(proc):
            self._warm.ended(proc, info)
            return
        slot = self.slots.get(proc.rank)
        if slot is None or slot.proc is not proc:
            return
        slot.exit_code = info.exit_code if info.exit_code is not None else 0
        slot.signal = info.signal or 0
        self.detectors.rank_ended(slot)
        self._crash_loop.ended(slot.rank, time.time() - proc.started_at, failed=not (slot.is_stopping or info.ok))
        if slot.is_stopping:
            slot.state = pb.RANK_STOPPED
        elif info.ok:
            slot.state = pb.RANK_SUCCEEDED
            log.info("rank %d (pid %d) finished", slot.rank, proc.pid)
        else:
            slot.state = pb.RANK_FAILED
            log.warning("rank %d (pid %d) failed: %s", slot.rank, proc.pid, info.describe(), extra={"rank": slot.rank})
            self._exits.exited(slot, info)
        self.outbox.mark_dirty()

    def _open_rank_clients(self) -> None:
        """Serve the ranks' recovery clients (docs/adr/0036). A name still held (a predecessor of
        this agent that has not died yet) leaves this agent answering as one without clients."""
        spec = self.membership.spec
        assert spec is not None
        clients = RankClients(
            rankwire.address_for(spec.uid, self.settings.node),
            slots=lambda: self.slots,
            wake=self._wake.set,
            note=lambda reason, message: self.note(reason, message),
            on_fault=self._rank_reported_fault,
        )
        try:
            clients.open()
        except OSError as err:
            self.note("rank_clients_unavailable", f"the ranks' protocol socket {clients.address}: {err}")
            return
        self.rank_clients = clients

    def _rank_reported_fault(self, rank: int, fault: rankwire.RankFault) -> None:
        """A joined rank's own retryable fault (its trainer caught a RetryableFault): reported as
        that rank's fault, once per id; recoverd decides what to do (ADR 0036)."""
        kind = FaultKind.UCE if fault.fault_type == "0" else FaultKind.LINK
        detail = f"rank {rank} reported a retryable fault: {fault.detail or kind.value}"
        self.report(Detected(rank=rank, kind=kind, detail=detail, instance=f"rank-{fault.fault_id}"))

    def _retrying(self, recovery: pb.Recovery) -> set[int]:
        """The fault ranks of this node that stay up for the job to re-run their step: every fault
        of theirs is retryable, and they run and joined through this agent (they acknowledge the
        stop, and take part in a `retry`). The agent stops the others in STOPPING; should recoverd
        choose a costlier strategy, its command restarts these as well."""
        if (
            self.rank_clients is None
            or not self.membership.answers_for_ranks
            or "retry" not in self.membership.strategies
        ):
            return set()  # recoverd will not choose retry for these ranks: stop them as any other
        types: dict[int, set[str]] = {}
        for fault in recovery.faults:
            types.setdefault(fault.rank, set()).add(fault.fault_type)
        joined = self.rank_clients.joined
        return {
            rank
            for rank, seen in types.items()
            if seen <= RETRYABLE_FAULT_TYPES
            and rank in joined
            and (slot := self.slots.get(rank)) is not None
            and slot.is_running
        }

    def _declare(self) -> None:
        """Keep the node record's declaration in step with the ranks that joined: rewritten only
        when it changes (once per node as its ranks join, not once per rank in the usual case)."""
        if self._launcher is None:
            return
        offered = self._offered_strategies()
        alone = self._rejoins_alone()
        if self.rank_clients is not None:
            strategies, answers = self.rank_clients.declaration(offered, rejoins_alone=alone)
        else:
            strategies, answers = declaration(offered, {}, self.slots.keys(), rejoins_alone=alone)
        if (strategies, answers) != (self.membership.strategies, self.membership.answers_for_ranks):
            self.membership.strategies, self.membership.answers_for_ranks = strategies, answers
            self.membership.is_record_stale = True

    def _rank_table_record(self) -> pb.NodeRanks:
        record = self.table.to_pb(self._warm.pids if self._warm is not None else ())
        _export_rank_gauges(self.settings.job, self.settings.node, record)
        return record

    # ---------------------------------------------------------------- reacting
    async def _watch(self) -> None:
        """Wake the reconcile on any change of the four keys this node acts on (its own node key
        too: a record removed or overwritten by anyone else is written again at once).

        Exact-key watches, not the run prefix: an agent must not receive every other node's rank
        table writes (that would grow with nodes squared).
        """
        run = self.membership.run
        assert run is not None
        keys = (
            self.keys.recovery(run),
            self.keys.status(run),
            self.keys.command(run, self.settings.node),
            self.keys.node(run, self.settings.node),
            self.keys.job_spec(self.settings.job),
            self.keys.drill(run, self.settings.node),
        )
        delay = self.settings.retry_s
        while True:
            try:
                start = await self.store.revision()
                break
            except EtcdUnavailable:
                await asyncio.sleep(self.settings.retry_s)
                await self.store.wait_retry(delay - self.settings.retry_s)
                delay = min(delay * 2, self.settings.retry_max_s)
        self._wake.set()
        async with asyncio.TaskGroup() as group:
            for key in keys:
                group.create_task(self._wake_on(key, start + 1), name=f"agent-watch-{key.rsplit('/', 1)[1]}")

    async def _wake_on(self, key: str, start: int) -> None:
        is_node_key = key == self.keys.node(self.membership.run, self.settings.node)  # type: ignore[arg-type]
        is_spec_key = key == self.keys.job_spec(self.settings.job)
        async for item in self.store.watch_key(key, start):
            self._watched.apply(key, item)
            if is_node_key:
                self._check_registration = True
            if is_spec_key:
                self._check_spec = True
            self._wake.set()

    async def _worker(self) -> None:
        delay = self.settings.retry_s
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.reconcile()
                delay = self.settings.retry_s
            except FenceLost as err:
                log.warning("agent %s: %s", self.settings.node, err.detail)
                with contextlib.suppress(RecoverdError):  # etcd may be flaky right now: next pass
                    await self._on_fence_lost()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.retry_max_s)
                self._wake.set()
            except RecoverdError as err:
                log.info("agent %s: %s; retrying within %.2fs", self.settings.node, err, delay)
                await asyncio.sleep(self.settings.retry_s)  # never spin; then as soon as etcd answers again
                await self.store.wait_retry(delay - self.settings.retry_s)
                delay = min(delay * 2, self.settings.retry_max_s)
                self._wake.set()

    async def _get(self, key: str, cls: type) -> object | None:
        """A watched key's current record, as the watch delivered it (None: absent or bad)."""
        try:
            return await self._watched.record(key, cls)
        except BadRecord as err:
            log.warning("agent %s: ignoring %s", self.settings.node, err)
            return None

    async def reconcile(self) -> None:
        """Compare what etcd asks of this node with what it has done, and close the gap."""
        run = self.membership.run
        assert run is not None
        status = await self._get(self.keys.status(run), pb.JobStatus)
        if isinstance(status, pb.JobStatus) and status.state in (pb.JOB_SUCCEEDED, pb.JOB_FAILED):
            code = EXIT_SUCCEEDED if status.state == pb.JOB_SUCCEEDED else EXIT_FAILED
            log.info("job %s %s: %s", self.settings.job, pb.JobState.Name(status.state), status.reason)
            self._request_exit(code)
            return
        if self._check_registration:
            self._check_registration = False
            await self._keep_registration()
        if self._check_spec:
            self._check_spec = False
            await self.membership.repair_spec()
        drill = await self._get(self.keys.drill(run, self.settings.node), pb.Drill)
        if isinstance(drill, pb.Drill):
            await self._drill(run, drill)
        # The command first: the coordinator writes it with its recovery record in one transaction,
        # so the recovery read after it is at least as new (never "a command ahead of its recovery").
        found = await self._get(self.keys.command(run, self.settings.node), pb.Command)
        recovery = await self._get(self.keys.recovery(run), pb.Recovery)
        if isinstance(found, pb.Command) and isinstance(recovery, pb.Recovery) and found.epoch > recovery.epoch:
            # Both come from one transaction, but through two watches: the command's event may be
            # here before the recovery's. Ask etcd before taking the command for a forged one.
            self._watched.forget(self.keys.recovery(run))
            recovery = await self._get(self.keys.recovery(run), pb.Recovery)
        if isinstance(recovery, pb.Recovery) and (recovery.epoch <= 0 or not recovery.uuid):
            recovery = None  # parses, but no recovery the coordinator wrote (e.g. `{}`): it rebuilds it
        command = found if isinstance(found, pb.Command) and self._is_current(found, recovery) else None
        self._declare()
        if command is not None and (command.epoch, command.seq) > self._last_applied:
            if await self._still_holds_node():
                await self._execute(command)
        elif self.membership.is_record_stale:
            await self.membership.register_again()
        if self.settings.reset_json_mirror:
            await self._mirror_reset_json(recovery if isinstance(recovery, pb.Recovery) else None)
        active = isinstance(recovery, pb.Recovery) and recovery.phase not in (pb.PHASE_DONE, pb.PHASE_FAILED)
        if active != self._recovery_active:
            self._recovery_active = active
            self.detectors.recovery_changed(active)
        if isinstance(recovery, pb.Recovery):
            await self._answer(recovery)

    async def _drill(self, run: RunRef, drill: pb.Drill) -> None:
        """Carry out ``recoverctl inject``: the drill is consumed first (deleted, with an event, in
        one fenced transaction), then the rank is signalled, so it happens at most once even if
        this agent dies in between. Only a running rank this agent started is ever signalled; what
        cannot be done is recorded as ``drill_refused`` and changes nothing."""
        slot = self.table.slots.get(drill.rank)
        proc = slot.proc if slot is not None else None
        why = ""
        if slot is None or proc is None or not slot.is_running:
            why = f"rank {drill.rank} is not running on node {self.settings.node}"
        elif drill.kind == "hang" and (hang := self.detectors.get(HangDetector)) is None:
            why = "a hang drill needs hang detection on this agent (it runs with --no-hang-detection)"
        elif drill.kind == "hang" and hang is not None and not hang.watches(drill.rank):
            why = (
                f"rank {drill.rank} has shown no progress (no taskd_client.heartbeat, no output or no line"
                " matching the policy's hang.log_pattern), so its hang would not be found: stopping it would"
                " wedge the job unseen"
            )
        elif not _same_process(proc):
            why = f"rank {drill.rank}'s pid {proc.pid} is another process now"
        who = f" by {drill.requested_by}" if drill.requested_by else ""
        text = f"drill {drill.drill_id}{who}: {drill.kind} rank {drill.rank}" + (f": refused, {why}" if why else "")
        note = events.event_put(
            self.keys, run, self.source, "drill_refused" if why else "drill", text, rank=drill.rank,
            node=self.settings.node, data={"drill": drill.drill_id, "kind": drill.kind, "reason": drill.reason},
        )  # fmt: skip
        consumed = await self.store.txn(
            self.membership.fence(), [Delete(self.keys.drill(run, self.settings.node)), note]
        )
        if not consumed.succeeded:
            raise FenceLost(f"node {self.settings.node}: drill {drill.drill_id} not consumed: registration lost")
        log.warning("agent %s: %s", self.settings.node, text, extra={"rank": drill.rank})
        if why or proc is None:
            return
        sig = {"kill": signal.SIGKILL, "exit": signal.SIGTERM, "hang": signal.SIGSTOP}[drill.kind]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if proc.pgid == proc.pid:  # its own group (ranks the agent started): the whole tree
                os.killpg(proc.pgid, sig)
            else:
                os.kill(proc.pid, sig)

    def _is_current(self, command: pb.Command, recovery: object) -> bool:
        """A command is carried out only while the recovery record it belongs to awaits it: the
        coordinator writes both in one transaction (phase RECOVERING, the command's epoch, this node
        among ``command_nodes``). An older command is obsolete; one from a later epoch than the
        recovery's was written by someone else: recorded once and ignored (applying it would also
        make this agent ignore every real command after it)."""
        if not isinstance(recovery, pb.Recovery):
            return False  # nothing to check it against (none yet, or clobbered): wait for the coordinator
        epoch = recovery.epoch
        if command.epoch <= epoch:
            return (
                recovery.phase == pb.PHASE_RECOVERING
                and command.epoch == recovery.epoch
                and self.settings.node in recovery.command_nodes
            )
        forged = (command.epoch, command.seq)
        if forged not in self._ignored_commands:
            self._ignored_commands.add(forged)
            self.outbox.note(
                Reason.BAD_RECORD,
                f"command for epoch {command.epoch} (seq {command.seq}) is ahead of the recovery's epoch {epoch}:"
                " ignored",
            )
        return False

    async def _keep_registration(self) -> None:
        """This node's key changed: if it is not our record any more (deleted, clobbered), write it
        again; if another agent holds the node now, this one is superseded."""
        lease = self.membership.lease
        if self.membership.rejoining or lease is None or lease.lost.is_set():
            return  # its lease expired: keep_registered rejoins, stopping what runs elsewhere first
        holder = await self.membership.holder()
        if holder == "me":
            return
        if holder == "nobody":
            # Removed or overwritten: the node may have been declared lost meanwhile and its ranks
            # moved, so it registers the way a node back from a lost lease does (_rejoin).
            log.warning("agent %s: its node record was removed or overwritten; registering again", self.settings.node)
            await self._rejoin()
            return
        self._supersede(f"node {self.settings.node} is registered by {holder}")

    async def _mirror_reset_json(self, recovery: pb.Recovery | None) -> None:
        run = self.membership.run
        assert self.settings.reset_json_mirror is not None and run is not None
        kv = await self.store.get(self.keys.history(run))  # not watched: read when mirroring
        try:
            history = decode(pb.History, kv.value, kv.key) if kv is not None else None
        except BadRecord:
            history = None
        restarts = sum(1 for o in history.outcomes if o.strategy == "exit") if isinstance(history, pb.History) else 0
        state = resetfile.mirror_state(recovery, restarts, self._mirrored)
        if state is not self._mirrored:
            await asyncio.to_thread(resetjson.write_file, self.settings.reset_json_mirror, state)
            self._mirrored = state

    # ---------------------------------------------------------------- commands
    async def _wait_released_elsewhere(self, ranks: Sequence[int]) -> str:
        """Before starting ranks moved here, wait until no other live node still runs them (the
        faulty node releases them in parallel); "" when free, else why not (the move fails).

        It reads the live nodes' records (which ranks each holds) and only the rank tables of the
        nodes that hold some of these ranks, then waits on a watch of exactly those keys: the cost
        follows the nodes involved, not the job's size (docs/scale.md).
        """
        run = self.membership.run
        assert run is not None
        wanted = set(ranks)
        deadline = time.monotonic() + 2 * self.settings.stop_grace_s + 5.0
        while True:
            busy, holders, revision = await self._running_elsewhere(run, wanted)
            if not busy:
                return ""
            left = deadline - time.monotonic()
            if left <= 0:
                return f"ranks {sorted(busy)} still run on another node"
            watched = [self.keys.ranks(run, n) for n in holders] + [self.keys.node(run, n) for n in holders]
            changes = [asyncio.create_task(self._next_change(key, revision + 1)) for key in watched]
            try:
                await asyncio.wait(changes, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in changes:
                    task.cancel()
                await asyncio.gather(*changes, return_exceptions=True)

    async def _running_elsewhere(self, run: RunRef, wanted: set[int]) -> tuple[set[int], list[str], int]:
        """(ranks of ``wanted`` that another live node runs or starts, those nodes, the read revision)."""
        records = await self.store.get_prefix(self.keys.nodes_prefix(run))
        holders = []
        for kv in records.kvs:
            name = kv.key.rsplit("/", 1)[1]
            try:
                record = decode(pb.NodeRecord, kv.value, kv.key)
            except BadRecord:
                record = None  # unreadable: its table decides
            # A spare's record names no ranks until it registers again after starting some.
            if name != self.settings.node and (record is None or record.is_spare or wanted & set(record.ranks)):
                holders.append(name)
        busy: set[int] = set()
        for name in holders:
            snap = await self.store.read(self.keys.ranks(run, name))
            if not snap.kvs:
                continue
            try:
                table = decode(pb.NodeRanks, snap.kvs[0].value, snap.kvs[0].key)
            except BadRecord:
                continue
            busy |= {r.rank for r in table.ranks if r.state in LIVE_STATES} & wanted
        return busy, holders, records.revision

    async def _next_change(self, key: str, start: int) -> None:
        async for _ in self.store.watch_key(key, start):
            return

    async def _execute(self, command: pb.Command) -> None:
        """Apply one command exactly once: (epoch, seq) above the last applied one. Its rank-table
        changes are published once, with its ack (``Outbox.holding``)."""
        async with self._starting:
            with self.outbox.holding():
                await self._carry_out(command)

    async def _carry_out(self, command: pb.Command) -> None:
        run = self.membership.run
        assert run is not None
        action = command.action
        ranks = sorted({r for r in command.ranks if 0 <= r < self.settings.world_size})
        held_before = self.table.ranks
        problem = ""
        if action == pb.ACTION_START_RANKS:
            problem = await self._wait_released_elsewhere(ranks)
        if action == pb.ACTION_RESTART_RANKS and not set(ranks) <= set(self.slots):
            problem = f"ranks {sorted(set(ranks) - set(self.slots))} are not on this node"
        if action in (pb.ACTION_START_RANKS, pb.ACTION_RESTART_ALL) and not problem:
            # START_RANKS: ranks moved here; RESTART_ALL's ranks: ranks this node takes back.
            for rank in ranks:
                self.table.add(rank)
        if problem:
            targets: list[RankSlot] = []
        elif action == pb.ACTION_RESTART_ALL:
            targets = list(self.table)
        else:
            targets = [self.slots[r] for r in ranks if r in self.slots]
        # Restarted already by this agent's predecessor, which died before acknowledging: done.
        done = {
            s.rank
            for s in targets
            if action in (pb.ACTION_RESTART_RANKS, pb.ACTION_RESTART_ALL, pb.ACTION_START_RANKS)
            and s.generation == command.epoch
            and s.is_running
        }
        await self._stop_ranks([s for s in targets if s.rank not in done])
        if action == pb.ACTION_RELEASE_RANKS:
            for slot in targets:
                self.table.remove(slot.rank)
        elif action != pb.ACTION_STOP_ALL:
            for slot in targets:
                if slot.rank in done:
                    continue
                slot.restart_count += 1
                self._start(slot, command.epoch, f"restart ({command.strategy})")
        if self.table.ranks != held_before:
            self.membership.is_spare = self.membership.is_spare and not self.slots
            self.membership.is_record_stale = True
        ok = not problem and (
            all(s.state == pb.RANK_RUNNING for s in targets) or action in (pb.ACTION_STOP_ALL, pb.ACTION_RELEASE_RANKS)
        )
        if problem:
            log.error("agent %s: %s: %s", self.settings.node, pb.CommandAction.Name(action), problem)
        ack = pb.CommandAck(
            epoch=command.epoch,
            seq=command.seq,
            ok=ok,
            detail=problem
            or (
                f"{pb.CommandAction.Name(command.action)} ranks {[s.rank for s in targets]}"
                if ok
                else f"ranks {[s.rank for s in targets if s.state != pb.RANK_RUNNING]} failed to restart"
            ),
            done_at=ts_from_s(time.time()),
            pids=[s.proc.pid for s in targets if s.proc is not None] if action != pb.ACTION_RELEASE_RANKS else [],
        )
        self.outbox.add_event(
            events.event_put(
                self.keys,
                run,
                self.source,
                "command_executed",
                f"{pb.CommandAction.Name(command.action)} (epoch {command.epoch}, seq {command.seq}):"
                f" ranks {[s.rank for s in targets]} now pids {list(ack.pids)}",
                epoch=command.epoch,
                node=self.settings.node,
            )
        )
        # The rank table and the ack in one transaction: a successor reads an ack that matches the
        # table (else it would adopt against the old pids), and the ack is this node's answer to
        # the recovery (participants.agent_reports), so confirming a command is one write.
        await self.outbox.flush(also=[Put(self.keys.ack(run, self.settings.node), encode(ack))])
        # Applied once its ack is written: an ack refused (the lease was lost and the node is
        # registering again) or not sent is written by the next pass, which finds the ranks
        # restarted already (generation == epoch) and restarts nothing again.
        self._last_applied = (command.epoch, command.seq)
        if self.membership.is_record_stale:
            await self.membership.register_again()

    # ---------------------------------------------------------------- answering
    def _offered_strategies(self) -> tuple[str, ...]:
        """What this agent can carry out: `recover` only where its runtime can start any rank."""
        assert self._launcher is not None
        movable = self._launcher.starts_any_rank
        return tuple(s for s in AGENT_STRATEGIES if movable or s != "recover")

    def _rejoins_alone(self) -> bool:
        """Whether a rank of this node that runs no recoverd client may be restarted alone: its
        runtime's framework rejoins by itself, or the job says its ranks never talk to each other
        (``independent_ranks``). Else its declaration leaves `recover-in-place` out (ADR 0041)."""
        assert self._launcher is not None
        spec = self.membership.spec
        independent = spec is not None and spec.policy.independent_ranks
        settings_policy = self.settings.policy
        independent = independent or (settings_policy is not None and settings_policy.independent_ranks)
        return self._launcher.rejoins_alone or independent

    async def _answer(self, recovery: pb.Recovery) -> None:
        """Answer the current phase for this node's ranks, once per (epoch, phase)."""
        run = self.membership.run
        assert run is not None
        # Keyed by the recovery's uuid too: a rebuilt recovery record may repeat an epoch.
        answer = (recovery.epoch, recovery.uuid, recovery.phase)
        phase = pb.Phase.Name(recovery.phase).removeprefix("PHASE_")
        speaks = self.membership.answers_for_ranks
        if (
            self.participant not in recovery.participants
            or not participants.agent_reports(
                phase, declared=bool(self.membership.strategies), answers_for_ranks=speaks, strategy=recovery.strategy
            )
            or answer in self._answered
        ):
            return  # nothing to say, or the coordinator answers for this node (its record, its ack)
        faulty = sorted({f.rank for f in recovery.faults})
        retrying = self._retrying(recovery)
        report = pb.Report(
            participant=self.participant,
            epoch=recovery.epoch,
            uuid=recovery.uuid,
            reported_at=ts_from_s(time.time()),
            fault_ranks=faulty,
        )
        if recovery.phase == pb.PHASE_STOPPING:
            # The faulty ranks of this node must be down before we say "stopped" (a hung one may not be).
            local_faulty = [self.slots[r] for r in faulty if r in self.slots and r not in retrying]
            await self._stop_ranks(local_faulty)
            report.kind = pb.REPORT_STOP_COMPLETE
        elif recovery.phase == pb.PHASE_GLOBAL_FAULT:
            report.kind = pb.REPORT_STRATEGIES
            report.strategies.extend(self.membership.strategies or self._offered_strategies())
        elif recovery.phase == pb.PHASE_RECOVERING:
            if self.settings.node in recovery.command_nodes:
                return  # its command's ack is this node's answer (a downgrade's RELEASE_RANKS)
            report.kind = pb.REPORT_RECOVER_STATUS
            report.strategy = recovery.strategy
        else:
            return
        stuck = [r for r in faulty if r in self.slots and r not in retrying]
        if speaks and recovery.phase == pb.PHASE_RECOVERING and recovery.strategy == "retry" and stuck:
            # A fault rank of this node is down (stopped before this agent restarted, or it never
            # joined): its step cannot be re-run here. Fail at once: the ladder's next strategy
            # restarts it.
            report.code, report.message = Code.CLIENT_ERROR, f"ranks {stuck} cannot retry: not running or not joined"
        elif speaks and self.rank_clients is not None and report.kind != pb.REPORT_STRATEGIES:
            # One answer for every joined rank: written once they all answered (they wake us).
            key = (recovery.epoch, recovery.uuid, phase)
            # A rank kept up for a retry acknowledges the stop and re-runs its step with the others;
            # in any other strategy it is left out, as a fault rank (its command deals with it).
            left_out = [
                r for r in faulty if r not in retrying or (phase == "RECOVERING" and recovery.strategy != "retry")
            ]
            ranks = self.rank_clients.answer(key, phase, recovery.strategy, recovery.uuid, left_out)
            if ranks is None:
                return
            report.code, report.message = ranks
        elif report.kind == pb.REPORT_RECOVER_STATUS:
            return  # answered by its command's ack (participants.agent_reports)
        kind = report_kind_name(report.kind)
        await self._fenced_put(self.keys.report(run, self.participant, kind), encode(report))
        self._answered.add(answer)
