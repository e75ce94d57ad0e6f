"""Which global ranks train in each generation of the group, and a rank's seat in it.

The authority is recoverd's recovery record: a downgrade (``elastic-training``) records the ranks it
stopped as ``isolated``; an upgrade, or an ``exit`` that takes them back, removes them. The live
ranks are the job's ``WORLD_SIZE`` ranks minus the isolated ones, and a rank's data-parallel rank is
its position among them.

The ranks of one generation must agree on its world exactly (gloo is given the rank and size), yet
they read the record at different moments. So the first rank to seat itself in generation ``n``
pins the world it read under ``g<n>/world`` (compare-and-set), and every rank of ``n`` uses the
pinned one. When the record changes, the job's controller (:mod:`.relay`), or every rank when
they take part through their agents (docs/adr/0036), calls :meth:`publish`:
it pins the current generation to the new world if nobody has yet, or aborts it when it is pinned
to another. Both sides read in the order (generation, record, pin), and the controller writes the
pin after the record changed, so no generation can be formed with a world that was stale when the
controller published: either the controller's pin wins, or it finds the old one and aborts.

On an upgrade the controller first waits until the returning ranks are up and asking for a seat
(``ready/<rank>``, :meth:`wait_ready`), so the survivors train on in the small world while those
start (a Python start and a torch import: seconds) instead of waiting for them in a formation.
"""

from __future__ import annotations

import json
import time

from recoverd.records import decode, pb
from taskd_client.pytorch.store import EtcdStore

__all__ = ["Membership"]

#: A rank outside generation ``n``'s world waits this long at most for the next generation, then
#: lets the group re-read (and check its own deadline).
NOT_SEATED_WAIT_S = 1.0
POLL_MIN_S = 0.002
POLL_MAX_S = 0.05


class Membership:
    """``seat(n)`` for a :class:`~taskd_client.pytorch.group.ResilientGroup`; ``publish()`` for the
    controller. ``rank`` is the global rank (``RANK``); ``world_size`` the job's (``WORLD_SIZE``)."""

    def __init__(self, store: EtcdStore, recovery_key: str, rank: int, world_size: int) -> None:
        self.store = store
        self.recovery_key = recovery_key
        self.rank = rank
        self.world_size = world_size
        #: The world of the generation this rank last took a seat in.
        self.seated_world: list[int] = []
        #: This rank has said it is ready for a seat (``ready/<rank>``) and has not had one since.
        self._marked = False

    def live(self) -> list[int]:
        """The job's ranks minus those the recovery record says are isolated, in rank order."""
        raw = self.store.read_record(self.recovery_key)
        isolated = {p.rank for p in decode(pb.Recovery, raw, self.recovery_key).isolated} if raw else set()
        return [r for r in range(self.world_size) if r not in isolated]

    def _pin(self, number: int, live: list[int]) -> list[int]:
        held = self.store.compare_set(f"g{number}/world", "", json.dumps(live))
        return [int(r) for r in json.loads(held)]

    def seat(self, number: int) -> tuple[int, int] | None:
        """(data-parallel rank, world size) of this rank in generation ``number``; None when the
        generation's world leaves this rank out (it came back before the survivors were told, or
        it is isolated): then it has waited, up to ``NOT_SEATED_WAIT_S``, for the next generation."""
        world = self._pin(number, self.live())
        if self.rank in world:
            self.seated_world = world
            if self._marked:  # seated at last: the mark is not ready for the next upgrade
                self._marked = False
                self.store.delete_key(f"ready/{self.rank}")
            return world.index(self.rank), len(world)
        # Ready to join: the controller lets the others train on until every returning rank is.
        self.store.set(f"ready/{self.rank}", str(number))
        self._marked = True
        deadline = time.monotonic() + NOT_SEATED_WAIT_S
        delay = POLL_MIN_S
        while time.monotonic() < deadline and int(self.store.get("gen")) == number:
            time.sleep(delay)
            delay = min(delay * 2, POLL_MAX_S)
        return None

    def wait_ready(self, ranks: list[int], timeout_s: float, *, consume: bool = True) -> list[int]:
        """Wait until each of ``ranks`` (ranks coming back) waits for a seat, or ``timeout_s``;
        return those that do. ``consume``: delete their marks (the relay, the one waiter), else
        each returning rank deletes its own once seated (every survivor waits, through the
        agents); either way the next upgrade waits anew. Read from the store's watched copy: no
        etcd request per poll, however many ranks wait."""
        deadline = time.monotonic() + timeout_s
        delay = POLL_MIN_S
        while True:
            # Seated already counts as ready: a survivor told late (its agent relayed the upgrade
            # after another's ranks had published, or again after a restart) finds the marks gone.
            seated = self._current_world()
            ready = [r for r in ranks if r in seated or self.store.seen(f"ready/{r}") is not None]
            if len(ready) == len(ranks) or time.monotonic() >= deadline:
                for r in ready if consume else ():
                    self.store.delete_key(f"ready/{r}")
                return ready
            time.sleep(delay)
            delay = min(delay * 2, POLL_MAX_S)

    def _current_world(self) -> set[int]:
        """The ranks of the current generation's pinned world, as the store's watched copy has
        them (empty when it is not pinned yet)."""
        number = self.store.seen("gen")
        world = self.store.seen(f"g{int(number)}/world") if number is not None else None
        return {int(r) for r in json.loads(world)} if world else set()

    def publish(self, why: str) -> tuple[int, list[int], bool]:
        """The controller's side, after the record changed: (current generation, live ranks, whether
        that generation had to be aborted because it was pinned to another world)."""
        live = self.live()
        number = int(self.store.compare_set("gen", "", "0"))
        if self._pin(number, live) == live:
            return number, live, False
        self.abort(number, why)
        return number, live, True

    def is_aborted(self, number: int) -> bool:
        return self.store.check([f"g{number}/abort"])

    def abort(self, number: int, why: str) -> None:
        """Abort generation ``number`` (the one this rank is in): every rank of it may call this at
        once, for one abort and one next generation (a ``retry`` through the agents)."""
        self.store.compare_set(f"g{number}/abort", "", why[:200])
        self.store.compare_set("gen", str(number), str(number + 1))

    def abort_current(self, why: str) -> int:
        """Abort whatever generation is current (a dump: every rank must leave the loop)."""
        number = int(self.store.compare_set("gen", "", "0"))
        self.abort(number, why)
        return number
