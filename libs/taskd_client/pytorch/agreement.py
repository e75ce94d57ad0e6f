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

__all__ = [
    "Agreement",
    "Holding",
    "Kind",
    "NoTwin",
    "ShardedAgreement",
    "agree",
    "agree_sharded",
    "must_read_checkpoints",
]


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
    #: It also holds its state as of one step back (a sharded model's rank keeps it: twins.py).
    previous: bool = False

    def to_note(self) -> str:
        """The holding as a rank writes it when it joins a generation (ResilientGroup.joining_note)."""
        note = f"{_NOTE_TAG}:{int(self.kind)}:{self.step}:{int(self.unread_checkpoint)}"
        return f"{note}:1" if self.previous else note

    def steps_held(self) -> tuple[int, ...]:
        """The steps this rank can resume from: its own, and the one before where it kept it."""
        return (self.step - 1, self.step) if self.previous and self.step > 0 else (self.step,)

    @classmethod
    def from_note(cls, note: str) -> Holding | None:
        """The holding a peer wrote, or None when the note is not one (every rank then falls back
        to saying it again in a collective: they all read the same notes, so all fall back)."""
        tag, _, rest = note.partition(":")
        fields = rest.split(":")
        if tag != _NOTE_TAG or len(fields) not in (3, 4) or not all(f.isdigit() for f in fields):
            return None
        kind, step, unread, previous = (*(int(f) for f in fields), 0)[:4]
        if kind not in set(Kind) or unread > 1 or previous > 1:
            return None
        return cls(Kind(kind), step, bool(unread), bool(previous))


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
    receivers = tuple(r for r, h in enumerate(everyone) if r != source and not _keeps_own(h, best, step))
    return Agreement(step=step, source=source, receivers=receivers)


def _keeps_own(holding: Holding, best: Kind, step: int) -> bool:
    """A rank with live state at the resumed step keeps its own: it is bitwise its source's."""
    return holding.kind == best == Kind.LIVE and holding.step == step


# ---------------------------------------------------------------- sharded models (issue 26)


class NoTwin(Exception):
    """No step at which every shard has a holder: the state cannot be rebuilt from peers (recoverd
    falls back to restarting the job from its checkpoint). ``reason`` says which shard lacks one."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ShardedAgreement:
    """The step every rank resumes from, and per shard: the rank that sends it and the ranks of
    that shard that receive it (docs/adr/0047)."""

    step: int
    #: shard -> the rank whose state of that shard is sent.
    sources: tuple[int, ...]
    #: shard -> the ranks holding that shard that take the source's state.
    receivers: tuple[tuple[int, ...], ...]
    #: The ranks one step ahead that go back to ``step`` on their own (their previous state).
    back: tuple[int, ...] = ()

    def source_for(self, rank: int) -> int | None:
        """The rank ``rank`` receives its shard from, or None when it keeps its own."""
        return next((self.sources[k] for k, ranks in enumerate(self.receivers) if rank in ranks), None)


def agree_sharded(everyone: Sequence[Holding], shard_of: Sequence[int]) -> ShardedAgreement:
    """The agreement for a sharded model whose rank ``r`` said ``everyone[r]`` and holds shard
    ``shard_of[r]`` (the ranks of one shard are its replicas: twins, bitwise equal).

    As :func:`agree`, with one more condition: the step must be one at which *every* shard has a
    holder of the freshest kind, since a shard lives only in its own replicas. Of such steps the
    highest is taken (the least work is redone; a rank behind it receives its shard from a holder,
    a rank ahead of it is put back). A rank that kept its state of one step back
    (``Holding.previous``) holds both steps: a rank ahead goes back on its own, and can be its
    shard's source at the step before
    (FSDP2 interleaves a layer's reduce-scatter in its replica with its all-reduce across replicas,
    so a peer's death can leave one shard's survivors a step ahead of another's). A shard with no
    such holder at any common step raises :class:`NoTwin` with the reason.
    """
    if not everyone or len(shard_of) != len(everyone):
        raise ValueError("an agreement needs one holding and one shard per rank")
    shards = sorted(set(shard_of))
    if shards != list(range(len(shards))):
        raise ValueError(f"shards must be numbered 0..n-1, got {shards}")
    members = [tuple(r for r, k in enumerate(shard_of) if k == shard) for shard in shards]
    best = max(h.kind for h in everyone)
    if best == Kind.NONE:
        # All fresh: each shard's first replica sends its shard to the others (DDP's first
        # broadcast, per shard).
        return ShardedAgreement(0, tuple(m[0] for m in members), tuple(m[1:] for m in members))
    steps = sorted({s for h in everyone if h.kind == best for s in h.steps_held()})

    def holders(shard: int, step: int) -> list[int]:
        """The shard's holders at ``step``: those at it first, then those who go back to it."""
        at = [r for r in members[shard] if everyone[r].kind == best and everyone[r].step == step]
        back = [r for r in members[shard] if everyone[r].kind == best and step in everyone[r].steps_held()]
        return at + [r for r in back if r not in at]

    step = next((s for s in reversed(steps) if all(holders(k, s) for k in shards)), None)
    if step is None:
        lacking = [k for k in shards if not any(everyone[r].kind == best for r in members[k])]
        shard = lacking[0] if lacking else next(k for k in shards if not holders(k, steps[0]))
        raise NoTwin(
            f"shard {shard} (ranks {list(members[shard])}) has no {best.name.lower()} state at a step every"
            f" other shard has (steps held: {steps}): it cannot be rebuilt from a peer"
        )
    sources = tuple(holders(k, step)[0] for k in shards)
    back = tuple(r for r, h in enumerate(everyone) if h.kind == best == Kind.LIVE and h.step == step + 1 and h.previous)
    receivers = tuple(
        tuple(r for r in members[k] if r != sources[k] and not _keeps_own(everyone[r], best, step) and r not in back)
        for k in shards
    )
    return ShardedAgreement(step, sources, receivers, back)
