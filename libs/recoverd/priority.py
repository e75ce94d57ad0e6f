"""The control plane runs ahead of the ranks for the CPU; the ranks run at the job's own priority.

A recovery is a chain of small steps in recoverd's processes (the agent sees an exit, writes the
fault, the coordinator and the strategy service decide, the agent starts the replacement) while the
ranks that survive keep every core busy. At the same priority each step waits its turn behind them
(traced on 2 cores with 4 training ranks: about 100 ms of a 0.48 s recovery). With this and the
other changes of docs/adr/0037, SIGKILL -> the next completed step went from 695 to 387 ms (median,
alternated, bench/results/issue15-p3/ab_in_place.md). The control plane is idle between
recoveries, so running it ahead costs the ranks nothing then.

* :func:`boost` lowers this process's nice value by ``--cpu-boost`` (default 10) at start, before
  it starts any thread or process: threads created later inherit it (Linux keeps nice per thread),
  and so does an embedded etcd.
* Every process started for the job is put back to the priority the service had before the boost
  (:func:`as_job`): the ranks, a warm spare, the warm-start server (which the agent raises to the
  control plane's priority only while it forks, and whose ranks put themselves back at once).
* Lowering a nice value needs CAP_SYS_NICE (root has it, a container by default does not): without
  it, everything runs at the job's priority as before, and the service says so once.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

__all__ = ["DEFAULT_BOOST", "Priority", "as_job", "boost", "current"]

log = logging.getLogger(__name__)

#: How much ahead of the job the control plane runs by default (nice 0 -> -10: about 9 times the
#: CPU share of a rank when both want the CPU).
DEFAULT_BOOST = 10
_MOST = -20


@dataclass(frozen=True, slots=True)
class Priority:
    """The nice value of the job's processes and of the control plane (equal: no boost)."""

    job_nice: int
    own_nice: int
    why_not: str = ""

    @property
    def boosted(self) -> bool:
        return self.own_nice < self.job_nice


_current = Priority(job_nice=os.getpriority(os.PRIO_PROCESS, 0), own_nice=os.getpriority(os.PRIO_PROCESS, 0))


def current() -> Priority:
    """The priorities :func:`boost` set (or not) in this process."""
    return _current


def boost(amount: int) -> Priority:
    """Lower this thread's nice value by ``amount`` (threads and processes started after it inherit
    it); ``amount`` 0 leaves it. Never raises: without the privilege it says why in the result."""
    global _current
    job = os.getpriority(os.PRIO_PROCESS, 0)
    if amount <= 0:
        _current = Priority(job, job, "off (--cpu-boost 0)")
        return _current
    target = max(_MOST, job - amount)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, target)
    except PermissionError:
        _current = Priority(job, job, "not permitted: raising priority needs CAP_SYS_NICE")
        log.info("control plane at the job's CPU priority (nice %d): --cpu-boost %s", job, _current.why_not)
        return _current
    _current = Priority(job, os.getpriority(os.PRIO_PROCESS, 0))
    log.debug("control plane at nice %d, the job's processes at nice %d", _current.own_nice, job)
    return _current


def as_job(pid: int) -> None:
    """Put process ``pid`` (just started, still single-threaded) back at the job's priority. A
    process already gone is no error: its exit is reported where it is reaped."""
    if not _current.boosted:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, pid, _current.job_nice)
    except (ProcessLookupError, PermissionError):
        pass


def as_control_plane(pid: int) -> None:
    """Run process ``pid`` (a single-threaded helper of the agent) at the control plane's priority."""
    if not _current.boosted:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, pid, _current.own_nice)
    except (ProcessLookupError, PermissionError):
        pass
