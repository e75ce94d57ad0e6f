"""Nodes whose lease expired while etcd was in trouble: held as live for a grace (docs/adr/0045).

An agent keeps its 2 s node lease alive through whichever etcd member it is connected to. When
that member hangs, or an election stalls keep-alives, the agent moves on within 0.7 s (ADR 0043),
but on a loaded machine that can outlast the lease's 1 s stall margin: the lease expires, the node
key goes, and, read literally, the node is lost and its ranks restarted: etcd's trouble made a job
restart. The agent is alive; it registers again a moment later with its ranks untouched.

So a node that vanishes within ``grace_s`` of trouble the coordinator saw in etcd
(``recoverd.etcd_health``) is **held**: for ``grace_s`` from when it vanished, the pass sees it as
live, with the record it last had. Its ranks are not lost-node faults, a command sent to it is
still awaited, and the recovery record names it (``held_nodes``) so the selector counts it live
too. If its agent registers again within the grace, nothing happened; if not, the node is lost
when the grace ends (the job is looked at again then), ``grace_s`` later than without the hold.
A node that vanishes while etcd is healthy is lost at once, as before (ADR 0025).

What a :class:`LeaseHold` remembers (each live node's last record, when a node vanished) is lost
on a coordinator restart: a node missing at a new term's first pass counts as vanished then, and is
held only if the new leader has a record of it, which it does not; so it is lost at once, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from recoverd.etcd_health import Trouble
from recoverd.jobview import JobView
from recoverd.keys import KeyKind
from recoverd.records import LIVE_RANK_STATES, pb

__all__ = ["Held", "LeaseHold"]

#: Nodes remembered at most (records and vanishings); past it the memory starts again.
_MEMORY_CAP = 20_000


@dataclass(frozen=True, slots=True)
class Held:
    """What one pass holds: every held node, the ones held first in this pass (with the trouble
    that explains them, for an event), and when the job must be looked at again (seconds)."""

    nodes: frozenset[str] = frozenset()
    new: tuple[tuple[str, str], ...] = ()
    wake_after_s: float | None = None


class LeaseHold:
    """Remembers live nodes' records and when nodes vanished; holds the ones etcd explains."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        #: (job, run uid, node) -> the node's last record seen live.
        self._records: dict[tuple[str, str, str], pb.NodeRecord] = {}
        #: (job, run uid, node) -> when a pass first saw it missing, and whether it was announced.
        self._vanished: dict[tuple[str, str, str], tuple[float, bool]] = {}

    def apply(self, view: JobView, now: float, trouble: Trouble | None) -> Held:
        """Put the held nodes' last records into ``view.nodes``; return what is held."""
        if self.grace_s <= 0 or view.run is None:
            return Held()
        if len(self._records) > _MEMORY_CAP or len(self._vanished) > _MEMORY_CAP:
            self._records.clear()
            self._vanished.clear()
        run = (view.run.job, view.run.uid)
        placeholders = {b.key.rsplit("/", 1)[1] for b in view.bad if b.kind is KeyKind.NODE}
        for name, record in view.nodes.items():
            if name not in placeholders:
                self._records[(*run, name)] = record
                self._vanished.pop((*run, name), None)
        held: set[str] = set()
        new: list[tuple[str, str]] = []
        wake: float | None = None
        for name in sorted(_awaited_nodes(view) - view.nodes.keys()):
            key = (*run, name)
            last = self._records.get(key)
            if last is None:
                continue  # never seen live by this coordinator: nothing to hold it with
            since, announced = self._vanished.setdefault(key, (now, False))
            left = since + self.grace_s - now
            if left <= 0 or trouble is None or trouble.at < since - self.grace_s:
                continue
            view.nodes[name] = last
            held.add(name)
            wake = left if wake is None else min(wake, left)
            if not announced:
                self._vanished[key] = (since, True)
                new.append((name, trouble.what))
        return Held(frozenset(held), tuple(new), wake)


def _awaited_nodes(view: JobView) -> set[str]:
    """Nodes whose absence would act on the job: those whose rank table holds running or starting
    ranks (lost-node faults), and those a recovery awaits a command's answer from."""
    nodes = {name for name, table in view.ranks.items() if any(r.state in LIVE_RANK_STATES for r in table.ranks)}
    if view.recovery is not None and view.recovery.phase == pb.PHASE_RECOVERING:
        nodes |= set(view.recovery.command_nodes)
    return nodes
