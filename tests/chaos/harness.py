"""One chaos trial: a recoverd cluster of real processes, a fault injected, and what must hold after.

A :class:`Trial` owns a :class:`tests.integration.cluster.Cluster` (every service its own OS process:
``recoverd coordinator``, ``recoverd strategy``, ``recoverd agent ...``) in a trial-unique key prefix
and job name, against a real etcd. A scenario (scenarios.py) starts the cluster, injects its faults
with real signals or real etcd writes, and calls :meth:`Trial.expect_recovered`. Every trial is
judged the same way:

* **completed**: the recovery reached ``PHASE_DONE`` with the expected strategy;
* **nothing lost**: every rank of the world runs again (the rank table says RUNNING with a pid, and
  that process exists);
* **nothing doubled**: exactly one live process per rank, counted from the process table by the
  rank's own environment (``RECOVERD_PREFIX``, ``RECOVERD_JOB``, ``RANK``), not from what recoverd
  says;
* **nothing left behind**: after the cluster is shut down (SIGTERM to the agents, which stop their
  ranks), no process of the job is left; leftovers are counted, then killed and reaped.

Waiting polls etcd and the process table: the harness observes from outside, where there is no
event to wait on. No fixed sleep is an assertion; a sleep only ever shapes a fault (an outage's
length). The process running trials must be a child subreaper (pytest's conftest makes itself
one; run.py does too), so ranks orphaned by a killed agent stay visible to the census.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from recoverd.etcd_server import EmbeddedEtcd
from recoverd.jobview import JobView
from recoverd.records import pb, ts_to_s

from ..integration.cluster import WORKER, Cluster

__all__ = ["SLEEP_RANK", "WORKER_RANK", "Scenario", "Trial", "TrialFailed", "TrialResult", "run_trial"]

WORKER_RANK = (sys.executable, WORKER, "--steps", "1000000", "--step-time", "0.2")
"""A light Python rank (examples/worker.py) that runs until stopped."""
SLEEP_RANK = ("sleep", "1000000")
"""The lightest rank there is, for scenarios with tens of ranks on 2 cores."""

_POLL_S = 0.05
_LEFTOVER_GRACE_S = 5.0


class TrialFailed(AssertionError):
    """What a trial expected did not happen; the message says what, and what was seen instead."""


@dataclass
class TrialResult:
    """One trial's verdict: the table's columns, and why it failed."""

    scenario: str
    trial: int
    completed: bool = False
    duplicates: int = 0
    lost: int = 0
    leftovers: int = 0
    time_s: float | None = None
    error: str = ""
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.completed and not (self.duplicates or self.lost or self.leftovers or self.error)

    def describe(self) -> str:
        t = f"{self.time_s:.2f}s" if self.time_s is not None else "-"
        verdict = "ok" if self.ok else "FAILED"
        text = (
            f"{self.scenario} #{self.trial}: {verdict} completed={self.completed} duplicates={self.duplicates}"
            f" lost={self.lost} leftovers={self.leftovers} fault->DONE={t} (trial {self.wall_s:.1f}s)"
        )
        if self.notes:
            text += "; " + "; ".join(self.notes)
        if self.error:
            text += f"\n    error: {self.error}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


@dataclass(frozen=True)
class Scenario:
    """A named fault and what must follow it."""

    name: str
    summary: str
    run: Callable[[Trial], None]
    own_etcd: bool = False
    default_trials: int | None = None

    @property
    def trials(self) -> int:
        """``make chaos``'s trials: 10 unless the scenario says otherwise."""
        return self.default_trials if self.default_trials is not None else 10


class Trial:
    """One run of a scenario: a cluster in its own prefix, its job, the census, the verdict."""

    def __init__(self, scenario: str, number: int, endpoint: str, workdir: Path, *, etcd: EmbeddedEtcd | None) -> None:
        self.number = number
        self.rng = random.Random(f"{scenario}/{number}")
        self.prefix = f"/chaos{uuid.uuid4().hex[:10]}/v1"
        self.job = f"{scenario}-{number}"
        self.etcd = etcd
        self.cluster = Cluster(endpoint, self.prefix, workdir)
        self.result = TrialResult(scenario, number)
        self.world = 0

    def note(self, text: str) -> None:
        self.result.notes.append(text)

    # ---------------------------------------------------------------- reading the world
    def view(self) -> JobView:
        return self.cluster.view(self.job)

    def census(self) -> dict[int, list[int]]:
        """Live (non-zombie) processes of this trial's job by rank, from the process table.

        A rank is recognised by the environment its agent gave it, so a process recoverd forgot
        about still counts. Only descendants of this process are looked at (it is a subreaper, so
        orphans of a killed agent are among them).
        """
        ranks: dict[int, list[int]] = {}
        for proc in psutil.Process().children(recursive=True):
            try:
                env = proc.environ()
                if env.get("RECOVERD_PREFIX") != self.prefix or env.get("RECOVERD_JOB") != self.job:
                    continue
                if "RANK" not in env or proc.status() == psutil.STATUS_ZOMBIE:
                    continue
            except (psutil.Error, OSError):
                continue
            ranks.setdefault(int(env["RANK"]), []).append(proc.pid)
        return ranks

    def table(self) -> dict[int, pb.RankStatus]:
        """The rank table as etcd has it: rank -> status, over every node's key."""
        return {r.rank: r for nr in self.view().ranks.values() for r in nr.ranks}

    def _count(self, census: dict[int, list[int]]) -> tuple[int, int]:
        duplicates = sum(len(pids) - 1 for pids in census.values() if len(pids) > 1)
        lost = sum(1 for rank in range(self.world) if not census.get(rank))
        return duplicates, lost

    def measure(self) -> None:
        """Record duplicates and lost ranks as the process table shows them now."""
        self.result.duplicates, self.result.lost = self._count(self.census())

    # ---------------------------------------------------------------- acting
    def start(
        self,
        *,
        nodes: int = 1,
        nproc: int = 4,
        strategies: str = "recover-in-place,exit",
        command: tuple[str, ...] = WORKER_RANK,
        coordinators: int = 1,
        strategy: bool = True,
        spare: bool = False,
        timeout: float = 60.0,
        agent_extra: tuple[str, ...] = (),
    ) -> dict[int, pb.RankStatus]:
        """Coordinator(s), the selector, one agent per node (node0, node1, ...; a spare ``spare0``
        with ``spare``), and wait until every rank runs."""
        for i in range(coordinators):
            self.cluster.coordinator(f"coordinator-{i}")
        if strategy:
            self.cluster.strategy()
        for i in range(nodes):
            self.cluster.agent(
                self.job,
                f"node{i}",
                nproc=nproc,
                nnodes=nodes,
                node_rank=i,
                strategies=strategies,
                command=command,
                extra=agent_extra,
            )
        self.world = nodes * nproc
        ranks = self.cluster.wait_running(self.job, self.world, timeout=timeout)
        if spare:
            self.cluster.agent(
                self.job, "spare0", nproc=nproc, nnodes=nodes, strategies=strategies, command=command, extra=["--spare"]
            )
            self.cluster.wait_for("the spare to register", lambda: "spare0" in self.view().nodes, timeout=timeout)
        return ranks

    def kill_ranks(self, pids: list[int]) -> float:
        """SIGKILL ``pids`` back to back; returns the wall time of the first kill (the fault time)."""
        started = time.time()
        first = time.monotonic()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        spread_ms = (time.monotonic() - first) * 1000
        if len(pids) > 1:
            self.note(f"{len(pids)} SIGKILLs within {spread_ms:.1f} ms")
        return started

    def leader_name(self) -> str:
        """The cluster name of the coordinator that holds the leader key."""

        def holder() -> str | None:
            raw = self.cluster.get(self.cluster.keys.leader())
            if not raw:
                return None
            from recoverd.records import decode

            pid = decode(pb.Leader, raw).pid
            return next((n for n, p in self.cluster.procs.items() if p.pid == pid and p.poll() is None), None)

        return self.cluster.wait_for("a leader", holder, timeout=30)

    def wait_phase(self, phase: int, timeout: float = 30.0) -> pb.Recovery:
        def reached() -> pb.Recovery | None:
            rec = self.view().recovery
            return rec if rec is not None and rec.phase == phase else None

        return self.cluster.wait_for(f"the recovery in {pb.Phase.Name(phase)}", reached, timeout=timeout)

    def wait_opened(self, timeout: float = 30.0) -> pb.Recovery:
        """The first recovery exists (whatever its phase by the time it is read)."""
        return self.cluster.wait_for("a recovery to open", lambda: self.view().recovery, timeout=timeout)

    # ---------------------------------------------------------------- verdict
    def wait_done(self, *, min_recovery_id: int = 1, timeout: float = 60.0) -> pb.Recovery:
        """The recovery numbered at least ``min_recovery_id`` reached DONE; a FAILED job fails the trial."""
        last: list[str] = ["no recovery record"]

        def done() -> pb.Recovery | None:
            view = self.view()
            rec = view.recovery
            if view.status is not None and view.status.state == pb.JOB_FAILED:
                raise TrialFailed(f"the job failed: {view.status.reason}")
            if rec is None:
                return None
            last[0] = f"recovery {rec.recovery_id} in {pb.Phase.Name(rec.phase)} (strategy {rec.strategy or '-'})"
            if rec.phase == pb.PHASE_FAILED:
                raise TrialFailed(f"recovery {rec.recovery_id} FAILED: {rec.outcome}")
            return rec if rec.recovery_id >= min_recovery_id and rec.phase == pb.PHASE_DONE else None

        deadline = time.monotonic() + timeout
        while True:
            try:
                found = done()
            except TrialFailed:
                raise
            except Exception as err:  # etcd restarting: keep waiting
                found = None
                last[0] = f"read failed: {err!r}"
            if found is not None:
                return found
            self._check_services()
            if time.monotonic() >= deadline:
                raise TrialFailed(f"no recovery DONE within {timeout:g}s; last seen: {last[0]}")
            time.sleep(_POLL_S)

    def _check_services(self) -> None:
        for name, proc in self.cluster.procs.items():
            if (
                name.startswith(("coordinator", "strategy"))
                and name not in self.cluster.killed
                and proc.poll() not in (None, 0)
            ):
                raise TrialFailed(f"{name} died (rc={proc.returncode})")

    def settle(self, timeout: float = 30.0) -> dict[int, list[int]]:
        """Wait until every rank runs exactly once and the rank table agrees with the process table.

        On timeout the counts are recorded as they are and the trial fails.
        """
        deadline = time.monotonic() + timeout
        census: dict[int, list[int]] = {}
        why = ""
        while True:
            census = self.census()
            duplicates, lost = self._count(census)
            why = f"{duplicates} duplicate(s), {lost} lost"
            if not duplicates and not lost:
                try:
                    table = self.table()
                except Exception as err:
                    table, why = {}, f"rank table unreadable: {err!r}"
                disagree = [
                    r
                    for r in range(self.world)
                    if r not in table or table[r].state != pb.RANK_RUNNING or table[r].pid != census[r][0]
                ]
                if not disagree and table:
                    self.result.duplicates = self.result.lost = 0
                    return census
                if table:
                    why = f"rank table disagrees with the processes for ranks {disagree[:8]}"
            if time.monotonic() >= deadline:
                self.result.duplicates, self.result.lost = duplicates, lost
                raise TrialFailed(f"ranks did not settle within {timeout:g}s: {why}")
            time.sleep(_POLL_S)

    def expect_recovered(
        self,
        fault_at: float,
        strategy: str,
        *,
        restarted: dict[int, int],
        survivors: dict[int, int],
        min_recovery_id: int = 1,
        timeout: float = 60.0,
        or_exit: bool = False,
    ) -> pb.Recovery:
        """The recovery is DONE with ``strategy``; every rank runs once; ``restarted`` (rank -> old
        pid) run new processes and ``survivors`` (rank -> pid) the same ones. Records the time from
        ``fault_at`` (wall clock) to the coordinator's DONE.

        ``or_exit``: an escalation to ``exit`` is a success too (then every rank is restarted).
        """
        rec = self.wait_done(min_recovery_id=min_recovery_id, timeout=timeout)
        done_at = next((ts_to_s(e.at) for e in reversed(rec.phase_log) if e.phase == pb.PHASE_DONE), None)
        if or_exit and rec.strategy == "exit" and strategy != "exit":
            self.note("escalated to exit")
            restarted, survivors, strategy = {**restarted, **survivors}, {}, "exit"
        if rec.strategy != strategy:
            raise TrialFailed(f"recovery {rec.recovery_id} DONE with {rec.strategy!r}, expected {strategy!r}")
        census = self.settle()
        self.result.completed = True
        if done_at is not None:
            self.result.time_s = max(0.0, done_at - fault_at)
        same = [r for r, pid in restarted.items() if pid in census.get(r, [])]
        moved = [r for r, pid in survivors.items() if pid not in census.get(r, [])]
        if same:
            raise TrialFailed(f"ranks {same} were not restarted")
        if moved:
            raise TrialFailed(f"surviving ranks {moved} were restarted (new pids)")
        return rec

    # ---------------------------------------------------------------- the end
    def finish(self) -> None:
        """Stop the cluster and count what is left of the job; kill and reap it."""
        self.cluster.close()
        deadline = time.monotonic() + _LEFTOVER_GRACE_S
        census = self.census()
        while census and time.monotonic() < deadline:
            time.sleep(_POLL_S)
            census = self.census()
        pids = [pid for ps in census.values() for pid in ps]
        self.result.leftovers = len(pids)
        if pids:
            self.note(f"left behind after shutdown: pids {pids[:10]}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # Ranks whose agent was SIGKILLed re-parented to us (a subreaper), where on a node they would
        # re-parent to init; once their new agent stopped them they are our zombies: reap them.
        zombies = [p.pid for p in psutil.Process().children() if _is_zombie(p)]
        _reap_orphans(pids + zombies)


def _is_zombie(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _reap_orphans(pids: list[int]) -> None:
    """Reap killed processes that re-parented to us (we are a subreaper); others are not ours."""
    deadline = time.monotonic() + 5.0
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break  # not our child: its parent reaps it
            if done:
                break
            time.sleep(0.01)


def _dump_stacks(cluster: Cluster) -> None:
    """SIGUSR1 to every live, unpaused service: each prints its asyncio tasks' stacks to its log,
    so a failed trial's logs say what a stuck service was waiting for."""
    alive = [p for n, p in cluster.procs.items() if p.poll() is None and n not in cluster.paused]
    for proc in alive:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGUSR1)
    if alive:
        time.sleep(0.5)  # diagnostics only: give them a moment to write


def run_trial(scenario: Scenario, number: int, endpoint: str | None, workdir: Path) -> TrialResult:
    """Run one trial of ``scenario`` and return its verdict; never raises for a failed trial.

    ``endpoint``: the shared etcd; scenarios with ``own_etcd`` start their own (they kill it).
    The full failure (with every service's log tail) goes to ``workdir/failure.txt``.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    etcd = EmbeddedEtcd(for_tests=True, log_path=str(workdir / "etcd.log")) if scenario.own_etcd else None
    if etcd is not None:
        etcd.start()
        endpoint = etcd.endpoint
    assert endpoint is not None
    trial = Trial(scenario.name, number, endpoint, workdir, etcd=etcd)
    try:
        scenario.run(trial)
    except Exception as err:
        with contextlib.suppress(Exception):
            trial.measure()
        first = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
        trial.result.error = f"{type(err).__name__}: {first}"[:400]
        _dump_stacks(trial.cluster)
        with contextlib.suppress(OSError):
            (workdir / "failure.txt").write_text(f"{traceback.format_exc()}\n{trial.cluster.logs()}")
    finally:
        try:
            trial.finish()
        finally:
            if etcd is not None:
                etcd.stop()
    trial.result.wall_s = time.monotonic() - started
    return trial.result
