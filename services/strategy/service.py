"""The strategy selector service: answers every recovery that waits in DECIDING.

Level-triggered like the coordinator: a watch on ``jobs/`` enqueues jobs; a pass reads the job and,
if its recovery is in DECIDING with no decision for the current epoch, calls the pure
:func:`selector.choose` and records the decision with its inputs and reasons. The decision key is
create-if-absent per epoch, so several selector replicas are safe without an election (the first
answer wins) and a replayed pass writes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

from recoverd import events
from recoverd.aiotools import leaf_errors, supervised_group
from recoverd.controller import JobController
from recoverd.errors import RecoverdError
from recoverd.jobview import JobView, idle_spares, node_of_rank, read_job
from recoverd.keys import Keyspace, RunRef
from recoverd.policy import replacement_wait_s
from recoverd.records import encode, pb, ts_from_s, ts_to_s
from recoverd.store import Absent, Put, Store
from recoverd.strategies import DRAIN_KIND, STATE_LOST_EXIT_CODE
from recoverd.strategy.selector import Decision, Outcome, PolicyView, Request, choose

__all__ = ["StrategyService", "plain_nodes", "request_from_records"]

log = logging.getLogger(__name__)

SOURCE = "strategy"


def request_from_records(
    spec: pb.JobSpec,
    recovery: pb.Recovery,
    history: pb.History | None,
    now: float,
    rank0_node: str = "",
    spares: tuple[str, ...] = (),
    live_nodes: frozenset[str] | None = None,
    plain_nodes: tuple[str, ...] = (),
) -> Request:
    """The selector's input, from the stored records (``rank0_node``: where rank 0 runs, if known;
    ``spares``: the idle spare nodes; ``live_nodes``: nodes whose agent is alive, None if unknown;
    ``plain_nodes``: :func:`plain_nodes`)."""
    fault_nodes = tuple(sorted({f.node for f in recovery.faults if f.node}))
    lost_nodes = tuple(n for n in fault_nodes if live_nodes is not None and n not in live_nodes)
    policy = spec.policy
    window = policy.restart_window_s or 600.0
    view = PolicyView(
        strategies=tuple(policy.strategies) or ("exit",),
        max_rank_restarts=policy.max_rank_restarts or 3,
        max_job_restarts=policy.max_job_restarts or 3,
        restart_window_s=window,
        budgets=tuple((name, b.max, b.window_s or window) for name, b in sorted(policy.budgets.items()) if b.max > 0),
        allow_rank0_in_place=policy.allow_rank0_in_place if policy.HasField("allow_rank0_in_place") else True,
    )
    outcomes = tuple(
        Outcome(o.strategy, tuple(o.ranks), ts_to_s(o.closed_at), o.ok) for o in (history.outcomes if history else ())
    )
    return Request(
        fault_ranks=tuple(sorted({f.rank for f in recovery.faults})),
        fault_types=tuple(f.fault_type or "1" for f in recovery.faults),
        state_lost_ranks=tuple(sorted({f.rank for f in recovery.faults if f.exit_code == STATE_LOST_EXIT_CODE})),
        policy=view,
        supported=frozenset(recovery.supported) if recovery.has_supported else None,
        failed=tuple(f.strategy for f in recovery.failed_strategies),
        history=outcomes,
        now=now,
        fault_nodes=fault_nodes,
        rank0_node=rank0_node,
        spares=spares,
        lost_nodes=lost_nodes,
        replacement_wait_until=_replacement_wait_until(recovery, lost_nodes, replacement_wait_s(policy)),
        drained_nodes=tuple(sorted({f.node for f in recovery.faults if f.node and f.kind == DRAIN_KIND})),
        unplaced_ranks=tuple(sorted({f.rank for f in recovery.faults if not f.node})),
        plain_nodes=() if policy.independent_ranks else plain_nodes,
    )


def plain_nodes(view: JobView, *, forms_resilient_group: bool = False) -> tuple[str, ...]:
    """The nodes whose ranks run no recoverd client and cannot rejoin their group alone: a job with
    no client of its own whose ranks formed no ResilientGroup (``forms_resilient_group``: a
    ``ResilientTrainer`` with no protocol joins nothing, but its ranks rejoin their generations),
    and a node holding ranks whose declaration leaves recover-in-place out (its agent's rule,
    ADR 0041). A node that declares nothing (an older agent) is not counted."""
    if view.clients or forms_resilient_group:
        return ()
    return tuple(
        sorted(
            name
            for name, record in view.nodes.items()
            if record.ranks and record.strategies and "recover-in-place" not in record.strategies
        )
    )


def _replacement_wait_until(recovery: pb.Recovery, lost_nodes: tuple[str, ...], wait_s: float) -> float:
    """Until when a lost node may wait for its replacement: ``wait_s`` after the first of them was
    declared lost (their faults keep the time of the first pass that saw them, so every round of
    the recovery waits against the same bound); 0 when nothing waits."""
    if not lost_nodes or wait_s <= 0:
        return 0.0
    since = [ts_to_s(f.detected_at) for f in recovery.faults if f.node in lost_nodes and f.HasField("detected_at")]
    return (min(since) if since else 0.0) + wait_s


def ordered_spares(view: JobView) -> tuple[str, ...]:
    """The idle spares, an agent registered for a lost node's node rank (its replacement) first,
    paired in that order with the lost nodes, so the ranks go where the scheduler meant them."""
    spares = idle_spares(view)
    assert view.spec is not None
    nproc = view.spec.nproc_per_node or 1
    lost_ranks = {
        r.rank // nproc: node
        for node, table in sorted(view.ranks.items())
        if node not in view.nodes
        for r in table.ranks
    }
    wanted = sorted(lost_ranks)
    first = [s for rank in wanted for s in spares if view.nodes[s].node_rank == rank]
    return (*dict.fromkeys(first), *(s for s in spares if s not in first))


class StrategyService:
    """``await StrategyService(store, keys).run()`` until cancelled."""

    def __init__(self, store: Store, keys: Keyspace) -> None:
        self.store = store
        self.keys = keys
        self.identity = f"strategy@{socket.gethostname()}:{os.getpid()}"
        self._jobs: JobController | None = None
        #: (run uid, epoch) whose replacement wait was announced: one event per round, not per pass.
        self._announced: set[tuple[str, int]] = set()

    async def run(self, retry_s: float = 0.5) -> None:
        """Serve until cancelled; losing etcd restarts the watch and worker after ``retry_s``."""
        while True:
            try:
                jobs = JobController(self.store, self.keys, self.reconcile, name="strategy", cached=True)
                self._jobs = jobs
                async with supervised_group() as group:
                    start = await jobs.enqueue_all()
                    group.create_task(jobs.watch(start + 1), name="strategy-watch")
                    group.create_task(jobs.work(), name="strategy-worker")
            except RecoverdError as err:
                log.warning("strategy service: %s; starting again in %.1fs", err, retry_s)
            except BaseExceptionGroup as group:
                if not all(isinstance(e, RecoverdError) for e in leaf_errors(group)):
                    raise
                log.warning("strategy service: %s; starting again in %.1fs", leaf_errors(group)[0], retry_s)
            finally:
                jobs.close()
            await asyncio.sleep(retry_s)

    def _nothing_to_decide(self, job: str) -> bool:
        """A cheap look at the job's recovery record: most passes (every rank-table write of a
        512-node job wakes the selector) end here without building the job's view."""
        cache = self._jobs.cache if self._jobs is not None else None
        if cache is None:
            return False
        spec = cache.peek(job, self.keys.job_spec(job), pb.JobSpec)
        if spec is None:
            return False  # absent or bad: the view says which
        run = RunRef(job, spec.uid)
        recovery = cache.peek(job, self.keys.recovery(run), pb.Recovery)
        if recovery is None:
            return not cache.has(job, self.keys.recovery(run))  # a bad record: the view handles it
        return recovery.phase != pb.PHASE_DECIDING or cache.has(job, self.keys.decision(run, recovery.epoch))

    async def _announce_wait(self, run: RunRef, epoch: int, decision: Decision, now: float) -> None:
        """Record, once per round, that the decision waits for a lost node's replacement (a
        restarted selector says it once more: harmless). A new agent registering wakes the next pass."""
        if (run.uid, epoch) in self._announced:
            return
        why = decision.reasons[-1].removeprefix("wait: ")
        note = events.event_put(
            self.keys, run, SOURCE, "replacement_wait", f"epoch {epoch}: {why}", epoch=epoch, at=now
        )
        await self.store.txn([], [note])
        self._announced.add((run.uid, epoch))
        log.info("job %s epoch %d: %s", run.job, epoch, why)

    async def reconcile(self, job: str) -> None:
        if self._nothing_to_decide(job):
            return
        view = await self._jobs.view(job) if self._jobs is not None else await read_job(self.store, self.keys, job)
        if view.spec is None or view.run is None or view.recovery is None:
            return
        recovery = view.recovery
        if recovery.phase != pb.PHASE_DECIDING or recovery.epoch in view.decisions:
            return
        now = time.time()
        rank0_node = node_of_rank(view).get(0, "")
        plain = plain_nodes(view)
        if plain and await self.store.get(self.keys.rendezvous_generation(view.run)) is not None:
            plain = plain_nodes(view, forms_resilient_group=True)  # read only when it decides
        request = request_from_records(
            view.spec,
            recovery,
            view.history,
            now,
            rank0_node,
            ordered_spares(view),
            # A node the coordinator holds (its lease expired while etcd was in trouble: ADR 0045)
            # is live: its agent is registering again.
            frozenset(view.nodes) | frozenset(recovery.held_nodes),
            plain,
        )
        decision = choose(request)
        if decision.is_waiting:
            await self._announce_wait(view.run, recovery.epoch, decision, now)
            return
        record = pb.Decision(
            epoch=recovery.epoch,
            strategy=decision.strategy,
            reasons=list(decision.reasons),
            give_up=decision.give_up,
            allowed=list(request.policy.strategies),
            candidates=list(decision.candidates),
            fault_ranks=list(request.fault_ranks),
            failed_strategies=list(request.failed),
            decided_at=ts_from_s(now),
            decided_by=self.identity,
            expected_cost_s=decision.expected_cost_s,
            moves=[pb.NodeMove(from_node=a, to_node=b) for a, b in decision.moves],
            spares=list(request.spares),
        )
        key = self.keys.decision(view.run, recovery.epoch)
        summary = decision.strategy or "give up"
        note = events.event_put(
            self.keys,
            view.run,
            SOURCE,
            "decision",
            f"epoch {recovery.epoch}: {summary} ({'; '.join(decision.reasons)})",
            epoch=recovery.epoch,
            at=now,
        )
        result = await self.store.txn([Absent(key)], [Put(key, encode(record)), note])
        if result.succeeded:
            # What the operator of `recoverd run` sees: the choice, and why the strategies the
            # policy allowed before it were not taken (the full list: `recoverctl decisions`).
            allowed = set(request.policy.strategies)
            refused = [r for r in decision.reasons if r.split(":", 1)[0] in allowed and ": no, " in r]
            log.info("job %s epoch %d: %s%s", job, recovery.epoch, summary, "".join(f"; {r}" for r in refused))
