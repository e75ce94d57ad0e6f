"""A rank that fails again and again right after it starts is started later each time.

A script with a bug at start-up (an import error, a missing file, a port in use, a peer not up
yet) fails within seconds of every start. Restarted at once, it spins through its restart budget in
a second or two, filling the logs, hammering whatever it failed on, and a transient cause (a file
system or a peer that needed ten more seconds) never gets the time to clear. Kubernetes' answer is
CrashLoopBackOff; this is the same, per rank and in the agent, which alone sees how long each life
lasted.

* A life that ends in a failure within :data:`EARLY_S` of its start adds one to the rank's streak;
  a life that lasted longer, or ended well, or was stopped by the agent, ends the streak.
* The first restart after an early failure is immediate (one crash is an incident, not a loop);
  from the second in a row on, the start waits ``base_s``, then twice as long each time, at most
  ``max_s``. The restart budgets (the policy) still decide how many restarts there are: the
  backoff only spaces them, so a deterministic crash fails the job in about half a minute, not in
  two seconds and not never.
"""

from __future__ import annotations

__all__ = ["EARLY_S", "CrashLoop"]

#: A failure this soon after the start counts as part of a crash loop (seconds).
EARLY_S = 10.0


class CrashLoop:
    """Per-rank streaks of early failures and the wait they ask of the next start. Pure."""

    def __init__(self, base_s: float = 1.0, max_s: float = 30.0, early_s: float = EARLY_S) -> None:
        self.base_s = base_s
        self.max_s = max_s
        self.early_s = early_s
        self._streaks: dict[int, int] = {}
        #: rank -> the wait given to its current life (not counted as part of that life).
        self._waited: dict[int, float] = {}

    def ended(self, rank: int, lived_s: float, *, failed: bool) -> None:
        """Record how a life of ``rank`` ended: ``lived_s`` after its process started (its wait
        included), failed or not (a life the agent stopped itself did not fail)."""
        lived_s -= self._waited.pop(rank, 0.0)
        if failed and lived_s < self.early_s:
            self._streaks[rank] = self._streaks.get(rank, 0) + 1
        else:
            self._streaks.pop(rank, None)

    def streak(self, rank: int) -> int:
        """Early failures of ``rank`` in a row."""
        return self._streaks.get(rank, 0)

    def delay_s(self, rank: int) -> float:
        """How long the next start of ``rank`` should wait: 0 unless it failed early twice or
        more in a row; then ``base_s`` doubled per further failure, at most ``max_s``."""
        streak = self.streak(rank)
        if streak < 2 or self.max_s <= 0:
            return 0.0
        return min(self.base_s * 2 ** (streak - 2), self.max_s)

    def starting(self, rank: int) -> float:
        """A life of ``rank`` is being started: the wait it gets (:meth:`delay_s`), remembered so
        that :meth:`ended` judges the life without it."""
        wait = self.delay_s(rank)
        self._waited[rank] = wait
        return wait
