"""Bad keys under a job: recorded and removed, except where removing would do harm.

Everything under the prefix is untrusted input (``recoverd.jobview`` collects what does not parse
or validate in ``JobView.bad``). A pass records each bad key as a ``bad_record`` event and deletes
it, a bounded number per pass (the rest are left for the next one). Two kinds stay:

* another service's leased record (a live node's or client's): its owner rewrites it, and deleting
  it would make a live participant look dead; it is warned about once per value;
* a node record overwritten without its lease while its node still has a rank table: its agent
  rewrites it at once, so it is spared for ``clobbered_node_grace_s`` and removed only after (the
  node then counts as lost).

:class:`BadKeys` is what a coordinator remembers from one pass to the next (what it warned about,
and since when each clobbered record has been seen). It is lost on restart, which costs at most a
repeated warning and a longer grace.
"""

from __future__ import annotations

import logging

from recoverd.coordinator.fold import Fold
from recoverd.coordinator.settings import CoordinatorSettings
from recoverd.errors import Reason
from recoverd.jobview import BadKey
from recoverd.keys import printable
from recoverd.store import Delete

__all__ = ["BadKeys"]

log = logging.getLogger(__name__)

#: Entries remembered at most, per memory; past it the memory starts again (a repeated warning).
_MEMORY_CAP = 10_000


class BadKeys:
    """Screens a pass's bad keys, remembering what it warned about and each clobbered record's grace."""

    def __init__(self, settings: CoordinatorSettings) -> None:
        self.settings = settings
        self._warned: dict[str, int] = {}
        #: (key, mod revision) of a node record clobbered without its lease -> when first seen.
        self._clobbered_since: dict[tuple[str, int], float] = {}

    def screen(self, fold: Fold) -> list[float]:
        """Record and delete the pass's bad keys (into ``fold``); returns the delays after which the
        job must be looked at again (a spared record's grace ends)."""
        removed = 0
        wake: list[float] = []
        for bad in fold.view.bad:
            if bad.is_live_record:
                self._keep(fold, bad, "leased: kept for its owner to rewrite")
                continue
            if bad.key in fold.view.clobbered_nodes:
                left = self._grace_left(bad, fold.now)
                if left > 0:
                    self._keep(fold, bad, f"its agent has {left:.0f}s to rewrite it")
                    wake.append(left)
                    continue
            if removed >= self.settings.bad_keys_per_pass:
                fold.more = True
                continue
            removed += 1
            fold.note(Reason.BAD_RECORD, bad.reason, data=_event_data(bad))
            fold.ops.append(Delete(bad.key))
        return wake

    def warn_once(self, key: str, mod_revision: int, message: str) -> bool:
        """Log a bad key that is kept (not removed) once per value; True the first time."""
        if self._warned.get(key) == mod_revision:
            return False
        if len(self._warned) > _MEMORY_CAP:
            self._warned.clear()
        self._warned[key] = mod_revision
        log.warning("%s", printable(message))
        return True

    def _keep(self, fold: Fold, bad: BadKey, why: str) -> None:
        """A bad key that stays: warned about, and recorded, once per value."""
        if self.warn_once(bad.key, bad.mod_revision, f"job {fold.run.job}: {bad.reason}"):
            fold.note(Reason.BAD_RECORD, f"{bad.reason} ({why})", data=_event_data(bad))

    def _grace_left(self, bad: BadKey, now: float) -> float:
        """Seconds left of the grace of a node record clobbered without its lease (its agent
        rewrites it at once; if none does, it is removed and the node counts as lost), counted from
        when it was first seen; forgotten once spent."""
        if len(self._clobbered_since) > _MEMORY_CAP:
            self._clobbered_since.clear()
        first = self._clobbered_since.setdefault((bad.key, bad.mod_revision), now)
        left = first + self.settings.clobbered_node_grace_s - now
        if left <= 0:
            self._clobbered_since.pop((bad.key, bad.mod_revision), None)
        return left


def _event_data(bad: BadKey) -> dict[str, str]:
    """The ``bad_record`` event's data: the key and the start of its value, printable."""
    return {"key": printable(bad.key), "value": printable(bad.value[:512].decode(errors="replace"))}
