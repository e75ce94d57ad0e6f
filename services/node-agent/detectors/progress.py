"""Judging progress: when a rank's silence is a hang, and when a rank is a straggler. Pure: no I/O
and no clock (``now`` is an argument), so every rule here is tested with made-up times.

A rank is judged only once it has made progress at least once. Progress is a client's report
(``taskd_client.heartbeat``, the PyTorch trainer), a log line matching the job's ``log_pattern``,
or, with neither, any line of output: a plain script that prints as it trains has its cadence
learned with no configuration (docs/adr/0042). Output is a weaker sign than a report, so a rank
known only by its output gets the larger ``output_floor_s``, unless its process is stopped
(SIGSTOP: it certainly makes no progress); and once a rank's client reports, its output no longer
counts (a logging thread must not hide a hung training loop). A script that prints nothing is never
called hung. Its timeout is

* during **warm-up** (the first ``warmup_steps`` progress reports after it started, and again after
  each recovery of the job): ``startup_s``, or the learned timeout if longer — start-up, compiling
  and the first steps are slow;
* afterwards, **fixed** (``timeout_s``) or **learned**: ``multiplier`` x the longest time between
  progress reports within the last hour (so a periodic slow step seen in it is not a hang), and
  never less than ``floor_s``. Warm-up intervals are not learned from.

Progress is a step that changed (or, for a client that sends no step numbers, each report): a
heartbeat thread that keeps reporting the same step is not progress. A rank that said it **waits
in a collective** is likelier the victim of a hung peer than the culprit, so it is given
``victim_factor`` x its timeout, and at least the start-up allowance: the culprit's own node
reports it first, the recovery that follows releases the victims, and nobody restarts a healthy
rank that waits for a slow peer (a re-forming group on a loaded machine, a replacement still
importing its framework); a stall where every rank waits is still found, after the allowance.
A rank whose process is stopped
(SIGSTOP) is a culprit whatever it said last.

A **straggler** is a rank whose time per step (the work it reports, ``busy_s``, when it does, else the
time between reports) stays at least ``straggler_ratio`` x the median of its peers' for
``straggler_window_s``: an event, not a fault.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from recoverd.records import pb

__all__ = ["Hang", "HangRules", "ProgressTracker", "StragglerChange"]

#: The timeout follows the longest interval seen within this long (kept as one maximum per
#: minute), so a periodic long step (an evaluation, a checkpoint) seen within the last hour is not
#: taken for a hang; the first one is covered only by the floor, a fixed timeout or a heartbeat
#: from inside it.
HISTORY_S = 3600.0
_BUCKET_S = 60.0


@dataclass(frozen=True, slots=True)
class HangRules:
    """How a job's progress is judged: the built-in defaults, overridden by the policy's ``hang``."""

    enabled: bool = True
    timeout_s: float = 0.0
    multiplier: float = 3.0
    floor_s: float = 5.0
    startup_s: float = 300.0
    warmup_steps: int = 3
    log_pattern: str = ""
    straggler_ratio: float = 1.5
    straggler_window_s: float = 60.0
    #: A rank waiting in a collective is judged against this multiple of its timeout.
    victim_factor: float = 2.0
    #: The floor of a rank whose only progress is its output (no client, no log pattern), when its
    #: process is not stopped: a script may print each step and then compute quietly for a while
    #: (an evaluation); a silence this long is a hang. A fixed ``timeout_s`` replaces it.
    output_floor_s: float = 60.0

    @classmethod
    def from_pb(cls, policy: pb.HangPolicy | None) -> HangRules:
        """The policy's values where set (0 / empty = the default). The policy parser validated them."""
        base = cls()
        if policy is None:
            return base

        def pick(value: float, default: float) -> float:
            return value if value > 0 else default

        return cls(
            enabled=policy.enabled if policy.HasField("enabled") else base.enabled,
            timeout_s=pick(policy.timeout_s, base.timeout_s),
            multiplier=pick(policy.multiplier, base.multiplier),
            floor_s=pick(policy.floor_s, base.floor_s),
            startup_s=pick(policy.startup_s, base.startup_s),
            warmup_steps=policy.warmup_steps if policy.warmup_steps > 0 else base.warmup_steps,
            log_pattern=policy.log_pattern or base.log_pattern,
            straggler_ratio=pick(policy.straggler_ratio, base.straggler_ratio),
            straggler_window_s=pick(policy.straggler_window_s, base.straggler_window_s),
        )


@dataclass(frozen=True, slots=True)
class Hang:
    """A rank judged hung: say it once per incarnation."""

    rank: int
    pid: int
    silent_s: float
    timeout_s: float
    #: Why this timeout, in words (shown in the fault's detail).
    basis: str
    last_step: int | None
    waiting: bool
    stopped: bool

    def describe(self) -> str:
        step = f" after step {self.last_step}" if self.last_step is not None else ""
        state = " (process stopped)" if self.stopped else " (waiting in a collective)" if self.waiting else ""
        return (
            f"rank {self.rank} (pid {self.pid}) made no progress for {self.silent_s:.1f}s{step}{state};"
            f" its timeout is {self.timeout_s:.1f}s ({self.basis})"
        )


@dataclass(frozen=True, slots=True)
class StragglerChange:
    """A rank became a straggler (``ratio`` ≥ the threshold for the window) or stopped being one."""

    rank: int
    slow: bool
    ratio: float
    seconds_per_step: float
    peers_seconds_per_step: float


@dataclass(slots=True)
class _Rank:
    pid: int
    started_at: float
    last_progress_at: float | None = None
    last_step: int | None = None
    #: Progress reports since the incarnation started (or since the last recovery ended).
    reports_since_warmup: int = 0
    #: (minute bucket start, longest interval in it), the last :data:`HISTORY_S` of them.
    intervals: deque[tuple[float, float]] = field(default_factory=deque)
    #: (when, seconds per step) samples for stragglers.
    samples: deque[tuple[float, float]] = field(default_factory=deque)
    waiting: bool = False
    hang_reported: bool = False
    #: The client said its training loop is over: nothing more to judge (until it reports again).
    done: bool = False
    #: All its progress so far came from its output (no client report yet in this incarnation).
    by_output: bool = True
    slow_since: float | None = None
    is_straggler: bool = False


def _remember(buckets: deque[tuple[float, float]], now: float, interval: float) -> None:
    """Keep the longest interval per minute, for the last :data:`HISTORY_S` (bounded memory)."""
    start = now - now % _BUCKET_S
    if buckets and buckets[-1][0] == start:
        buckets[-1] = (start, max(buckets[-1][1], interval))
    else:
        buckets.append((start, interval))
    while buckets and buckets[0][0] < now - HISTORY_S:
        buckets.popleft()


class ProgressTracker:
    """What is known of the progress of one node's ranks."""

    def __init__(self, rules: HangRules | None = None) -> None:
        self.rules = rules or HangRules()
        self._ranks: dict[int, _Rank] = {}
        self._paused = False

    # ------------------------------------------------------------ what happens
    def started(self, rank: int, pid: int, now: float) -> None:
        """A new incarnation of ``rank``: nothing is known of it yet."""
        self._ranks[rank] = _Rank(pid=pid, started_at=now)

    def ended(self, rank: int) -> None:
        self._ranks.pop(rank, None)

    def progress(
        self,
        rank: int,
        pid: int,
        step: int | None,
        now: float,
        *,
        waiting: bool = False,
        busy_s: float | None = None,
        by_output: bool = False,
    ) -> bool:
        """A report from ``rank``'s process ``pid`` (``by_output``: new lines of its output, with
        no pattern); True if it counted as progress. Reports of another incarnation than the one
        tracked are ignored, and so is output once the rank's client has reported."""
        state = self._ranks.get(rank)
        if state is None or state.pid != pid:
            return False
        if by_output and not state.by_output:
            return False
        if not by_output:
            state.by_output = False
        # A client that only says "waiting" sends its step with it: a changed step is progress too.
        advanced = (step is None and not waiting) or (step is not None and step != state.last_step)
        if not advanced:
            state.waiting = state.waiting or waiting
            return False
        learn = not state.done  # the time a finished loop sat idle is no step time
        if learn and state.last_progress_at is not None and state.reports_since_warmup >= self.rules.warmup_steps:
            # Warm-up intervals (start-up, compiling, the first steps; a recovery) teach nothing
            # about the step time: learned from the steps after them only.
            interval = now - state.last_progress_at
            _remember(state.intervals, now, interval)
            steps = step - state.last_step if step is not None and state.last_step is not None else 1
            per_step = (busy_s if busy_s is not None else interval) / max(1, abs(steps))
            state.samples.append((now, per_step))
        state.last_progress_at = now
        state.last_step = step
        state.reports_since_warmup += 1
        state.waiting = waiting
        state.done = False
        state.hang_reported = False
        return True

    def finished(self, rank: int, pid: int) -> None:
        """``rank``'s training loop is over: saving and tearing down make no progress, and are not
        a hang."""
        state = self._ranks.get(rank)
        if state is not None and state.pid == pid:
            state.done = True

    def pause(self) -> None:
        """A recovery is in progress: ranks stop and restart on purpose; nobody is judged."""
        self._paused = True

    def resume(self, now: float) -> None:
        """The recovery ended: every rank gets its warm-up allowance again, from now."""
        self._paused = False
        for state in self._ranks.values():
            if state.last_progress_at is not None:
                # Waiting is kept: a survivor still waits for its replacement after the recovery.
                state.last_progress_at = now
                state.reports_since_warmup = 0
            state.samples.clear()
            state.slow_since = None

    # ------------------------------------------------------------ judging
    def timeout(self, rank: int, *, stopped: bool = False) -> tuple[float, str] | None:
        """``rank``'s timeout now and why; None when it is not judged (no progress seen yet).
        ``stopped``: its process is stopped (the ordinary floor applies, output or not)."""
        state = self._ranks.get(rank)
        if state is None or state.last_progress_at is None:
            return None
        rules = self.rules
        floor, what = rules.floor_s, "the floor"
        if state.by_output and not stopped and rules.output_floor_s > floor:
            floor, what = rules.output_floor_s, "the floor for a rank known only by its output"
        if rules.timeout_s > 0:
            timeout, basis = rules.timeout_s, "fixed by the job's policy"
        elif state.intervals:
            typical = max(longest for _, longest in state.intervals)
            learned = rules.multiplier * typical
            if learned >= floor:
                timeout, basis = learned, f"{rules.multiplier:g} x the observed step time {typical:.2f}s"
            else:
                timeout, basis = floor, f"{what}; {rules.multiplier:g} x step time {typical:.2f}s is less"
        else:
            timeout, basis = floor, what
        if state.reports_since_warmup <= rules.warmup_steps and rules.startup_s > timeout:
            timeout, basis = rules.startup_s, f"the start-up allowance, for the first {rules.warmup_steps} steps"
        return timeout, basis

    def next_deadline(self, now: float) -> float | None:
        """The earliest time after ``now`` a rank could be judged hung; None when nobody is judged.
        (A rank waiting in a collective has two: its own timeout, when it is judged hung if its
        process is stopped, and the longer one for a victim.)"""
        if self._paused or not self.rules.enabled:
            return None
        deadlines = []
        for rank, state in self._ranks.items():
            judged = self.timeout(rank, stopped=True)  # the earliest: a stopped process is judged then
            if judged is None or state.hang_reported or state.done or state.last_progress_at is None:
                continue
            deadline = state.last_progress_at + judged[0]
            if state.waiting and deadline < now:
                deadline = state.last_progress_at + self._victim_timeout(judged[0])
            deadlines.append(deadline)
        return min(deadlines, default=None)

    def hangs(self, now: float, is_stopped: Callable[[int], bool] = lambda pid: False) -> list[Hang]:
        """Ranks silent for longer than their timeout, each incarnation reported once (until it
        makes progress again)."""
        if self._paused or not self.rules.enabled:
            return []
        found = []
        for rank, state in sorted(self._ranks.items()):
            if state.hang_reported or state.done or state.last_progress_at is None:
                continue
            silent = now - state.last_progress_at
            earliest = self.timeout(rank, stopped=True)
            assert earliest is not None
            if silent <= earliest[0]:
                continue
            stopped = is_stopped(state.pid)
            judged = self.timeout(rank, stopped=stopped)
            assert judged is not None
            timeout, basis = judged
            if silent <= timeout:
                continue
            if state.waiting and not stopped:
                victim = self._victim_timeout(timeout)
                if silent <= victim:
                    continue  # likelier a victim: give the culprit's node time to report it
                basis += f"; waiting in a collective, given {victim:.1f}s"
                timeout = victim
            state.hang_reported = True
            found.append(Hang(rank, state.pid, silent, timeout, basis, state.last_step, state.waiting, stopped))
        return found

    def _victim_timeout(self, timeout: float) -> float:
        return max(timeout * self.rules.victim_factor, self.rules.startup_s)

    def stragglers(self, now: float) -> list[StragglerChange]:
        """Ranks that became stragglers or stopped being ones since the last call."""
        if self._paused:
            return []
        rules = self.rules
        medians: dict[int, float] = {}
        for rank, state in self._ranks.items():
            while state.samples and state.samples[0][0] < now - rules.straggler_window_s:
                state.samples.popleft()
            if state.samples:
                medians[rank] = statistics.median(s for _, s in state.samples)
        changes = []
        for rank, state in sorted(self._ranks.items()):
            mine = medians.get(rank)
            peers = [m for r, m in medians.items() if r != rank]
            if mine is None or not peers:
                continue
            typical = statistics.median(peers)
            ratio = mine / typical if typical > 0 else 1.0
            if ratio >= rules.straggler_ratio:
                state.slow_since = now if state.slow_since is None else state.slow_since
                if not state.is_straggler and now - state.slow_since >= rules.straggler_window_s:
                    state.is_straggler = True
                    changes.append(StragglerChange(rank, True, ratio, mine, typical))
            else:
                state.slow_since = None
                if state.is_straggler:
                    state.is_straggler = False
                    changes.append(StragglerChange(rank, False, ratio, mine, typical))
        return changes
