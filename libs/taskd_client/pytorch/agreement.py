"""Which state the ranks resume from after a (re-)formation, and who has to receive it: pure.

Every rank says what it holds (:class:`Holding`); every rank computes the same :class:`Agreement`
from the same list, so no further message is needed to agree on it.

* The **holders** are the ranks with the freshest kind of state: live state (trained in this
  process) wins over live state its rank cannot vouch for (it raised a ``RetryableFault``: an
  uncorrectable memory error may have corrupted it), which wins over a checkpoint loaded from
  disk, which wins over none (all fresh).
* The **step** resumed is the lowest a holder has completed (a survivor whose all-reduce completed
  when a peer's did not is one step ahead, and is put back).
* The **source** is the lowest-numbered holder at that step.
* The **receivers** are the ranks that take the source's state. A rank with live state at the
  resumed step is not one: data parallelism keeps every such rank's model and optimizer bitwise
  equal to the source's (each applied the same averaged gradients to the same state), so sending
  it the state would only cost the recovery time (a copy per survivor: serializing once, sending
  and loading it on every rank, on a critical path where the replacement waits for the slowest).
  Every other rank receives it: a replacement, a rank that was ahead, a rank whose own state is
  suspect (repaired from a healthy peer, as MindCluster repairs a device's memory error), and
  every rank of a world with no live state (a checkpoint per rank need not be equal; fresh ranks
  may have been built with different seeds, as DDP's first broadcast assumes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

__all__ = ["Agreement", "Holding", "Kind", "agree", "must_read_checkpoints"]


class Kind(IntEnum):
    """What state a rank holds; a higher value is fresher."""

    NONE = 0
    FROM_DISK = 1
    #: Live, but its rank raised a RetryableFault (its memory may be corrupt): repaired from a
    #: healthy peer where there is one.
    SUSPECT = 2
    LIVE = 3


@dataclass(frozen=True, slots=True)
class Holding:
    """What one rank says: its kind of state, the steps it has completed, and whether it has a
    checkpoint it has not read yet."""

    kind: Kind
    step: int
    unread_checkpoint: bool = False

    def to_note(self) -> str:
        """The holding as a rank writes it when it joins a generation (ResilientGroup.joining_note)."""
        return f"{_NOTE_TAG}:{int(self.kind)}:{self.step}:{int(self.unread_checkpoint)}"

    @classmethod
    def from_note(cls, note: str) -> Holding | None:
        """The holding a peer wrote, or None when the note is not one (every rank then falls back
        to saying it again in a collective: they all read the same notes, so all fall back)."""
        tag, _, rest = note.partition(":")
        fields = rest.split(":")
        if tag != _NOTE_TAG or len(fields) != 3 or not all(f.isdigit() for f in fields):
            return None
        kind, step, unread = (int(f) for f in fields)
        if kind not in set(Kind) or unread > 1:
            return None
        return cls(Kind(kind), step, bool(unread))


#: Names the format of a holding's note (changed if the format ever changes).
_NOTE_TAG = "holding1"


@dataclass(frozen=True, slots=True)
class Agreement:
    step: int
    source: int
    receivers: tuple[int, ...]

    def receives(self, rank: int) -> bool:
        return rank in self.receivers


def must_read_checkpoints(everyone: Sequence[Holding]) -> bool:
    """No rank holds live state and one has a checkpoint unread: those read theirs, and every rank
    says again (a replacement beside live state never reads one: it would only be replaced)."""
    return any(h.unread_checkpoint for h in everyone) and all(h.kind <= Kind.FROM_DISK for h in everyone)


def agree(everyone: Sequence[Holding]) -> Agreement:
    """The agreement for the world whose rank ``r`` said ``everyone[r]``."""
    if not everyone:
        raise ValueError("an agreement needs at least one rank")
    best = max(h.kind for h in everyone)
    holders = [r for r, h in enumerate(everyone) if h.kind == best]
    if best == Kind.NONE:
        source, step = 0, 0
    else:
        step = min(everyone[r].step for r in holders)
        source = min(r for r in holders if everyone[r].step == step)
    receivers = tuple(
        r for r, h in enumerate(everyone) if r != source and not (h.kind == best == Kind.LIVE and h.step == step)
    )
    return Agreement(step=step, source=source, receivers=receivers)
