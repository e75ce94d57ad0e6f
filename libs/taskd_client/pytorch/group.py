"""A gloo process group that survives a peer's death: abortable collectives, numbered generations.

gloo has no abort: a rank blocked in a collective with a dead peer waits out the group's timeout,
and ``destroy_process_group`` does not release it (measured: rank 0 stayed blocked 30 s). So the
survivors never wait on a collective they cannot leave (docs/adr/0017):

* every collective is issued asynchronously and polled (``work.is_completed()``) while the rank
  watches its generation's **abort key** in the rendezvous store (etcd);
* the first rank that sees a collective fail (gloo reports a reset connection in ~10 ms) sets the
  abort key, which releases every other rank within a poll interval, including one whose own
  collective would only have timed out;
* a failed group is parked (never destroyed: its worker thread may still be blocked; it unwinds at
  the group's own timeout) and a **new generation** is formed on a fresh store prefix, so no rank
  ever reads a dead peer's address;
* a restarted rank whose predecessor joined the current generation aborts it (that generation can
  never complete) and joins the next one.

Generation bookkeeping in the store: ``gen`` (the current number), ``g<n>/abort``, ``g<n>/member/<rank>``
(the incarnation that joined), and gloo's own keys under ``g<n>/pg/``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from taskd_client import progress
from taskd_client.pytorch.store import EtcdStore, GenerationAborted

__all__ = ["GroupFailed", "ResilientGroup"]

ABORT_CHECK_S = 0.005
POLL_MAX_S = 0.001
#: A collective pending this long is told to the agent's hang detector (once per collective).
WAITING_REPORT_S = 0.5
#: How often a rank connecting a new generation checks whether it was aborted.
CONNECT_CHECK_S = 0.01
#: A parked group is dropped this long after its timeout (its thread has unwound by then).
PARK_MARGIN_S = 10.0


class GroupFailed(RuntimeError):
    """A collective of the current generation failed or was aborted; form the next generation."""


#: A gloo backend. torch's stubs declare the collectives on ProcessGroup only; gloo's Backend has
#: them at run time (allreduce, broadcast, allgather), so it is typed loosely here.
GlooGroup = Any


@dataclass(slots=True)
class _Generation:
    number: int
    pg: GlooGroup


class ResilientGroup:
    """``group = ResilientGroup(store, rank, world_size)``; ``group.form()``; collectives; on
    :class:`GroupFailed`, ``group.form()`` again."""

    def __init__(
        self,
        store: EtcdStore,
        rank: int,
        world_size: int,
        *,
        incarnation: str | None = None,
        timeout: timedelta = timedelta(seconds=60),
        form_timeout: timedelta = timedelta(seconds=5),
    ) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.incarnation = incarnation or f"{os.getpid()}@{time.time_ns()}"
        self.timeout = timeout
        #: How long gloo may take to connect a new generation: a member that died after writing its
        #: address (an `exit` that killed ranks mid-formation) is never reached, and gloo's connect
        #: loop cannot be interrupted, so it must give up soon and move to the next generation.
        self.form_timeout = form_timeout
        self._current: _Generation | None = None
        #: Failed groups, kept alive: destroying one whose thread is blocked would block us.
        self._parked: list[tuple[float, GlooGroup]] = []
        self._forming = -1
        self._connecting = threading.local()
        store.interrupted = self._interrupted
        #: ``seat(n)`` -> (rank, world size) in generation n, or None to try the next generation: set
        #: when the world can change between generations (protocol.py); None: always the same.
        self.seat: Callable[[int], tuple[int, int] | None] | None = None

    @property
    def generation(self) -> int:
        return self._current.number if self._current else -1

    # ------------------------------------------------------------------ generations
    def _interrupted(self) -> str | None:
        """The store's blocking reads stop when the generation being formed (by the calling
        thread: each connect runs on its own) is aborted."""
        number = getattr(self._connecting, "number", self._forming)
        if number >= 0 and self.store.check([f"g{number}/abort"]):
            return f"generation {number} aborted"
        return None

    def abort(self, why: str) -> None:
        """Mark the current generation broken (releases every rank waiting in it) and leave it."""
        if self._current is None:
            return
        number = self._current.number
        self._park(self._current.pg)
        self._current = None
        self.store.compare_set(f"g{number}/abort", "", why[:200])
        self.store.compare_set("gen", str(number), str(number + 1))

    def _park(self, pg: GlooGroup) -> None:
        """Keep a failed group alive until its own timeout has surely released its thread."""
        now = time.monotonic()
        keep = self.timeout.total_seconds() + PARK_MARGIN_S
        self._parked = [(at, old) for at, old in self._parked if now - at < keep]
        self._parked.append((now, pg))

    def form(self, deadline: float | None = None) -> int:
        """Join the current generation (aborting stale ones); return its number once formed.

        ``deadline`` (time.monotonic()): raise GroupFailed instead of trying another generation."""
        if self._current is not None:
            self.abort("re-forming")
        # Forming waits for every peer (a replacement may still be importing torch): if this rank
        # is found hung meanwhile, it is the peers' victim, not the culprit.
        progress.waiting()
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise GroupFailed("no generation could be formed before the deadline")
            number = int(self.store.compare_set("gen", "", "0"))
            if self.store.check([f"g{number}/abort"]):
                self.store.compare_set("gen", str(number), str(number + 1))
                continue
            if self.seat is not None:
                seat = self.seat(number)
                if seat is None:
                    continue
                self.rank, self.world_size = seat
            member = f"g{number}/member/{self.rank}"
            held = self.store.compare_set(member, "", self.incarnation).decode()
            if held != self.incarnation:
                # My predecessor joined this generation: it can never complete. Abort it.
                self.store.compare_set(f"g{number}/abort", "", f"rank {self.rank} restarted")
                self.store.compare_set("gen", str(number), str(number + 1))
                continue
            self._forming = number
            try:
                pg = self._connect(number)
            except (GenerationAborted, RuntimeError, TimeoutError) as err:
                # A peer died or restarted while the group was formed: this generation is lost.
                self.store.compare_set(f"g{number}/abort", "", f"forming failed on rank {self.rank}: {err}"[:200])
                self.store.compare_set("gen", str(number), str(number + 1))
                continue
            finally:
                self._forming = -1
            self._current = _Generation(number, pg)
            if number >= 2:
                # Two generations back is surely over: its keys only take etcd space.
                self.store.delete_prefix_now(f"g{number - 2}/")
            return number

    def _connect(self, number: int) -> GlooGroup:
        """Build generation ``number``'s gloo group on a helper thread, and give up on it as soon as
        the generation is aborted: gloo's connect loop cannot be interrupted, and a member that died
        after writing its address (an `exit` mid-recovery) would hold it for the connect timeout."""
        built: dict[str, Any] = {}

        def build() -> None:
            self._connecting.number = number
            try:
                prefixed = dist.PrefixStore(f"g{number}/pg", self.store)  # PrefixStore adds the "/"
                pg = dist.ProcessGroupGloo(prefixed, self.rank, self.world_size, self.form_timeout)
                pg.set_timeout(self.timeout)  # collectives: peers may legitimately be slow
                built["pg"] = pg
            except BaseException as err:  # handed to the caller's thread
                built["error"] = err

        thread = threading.Thread(target=build, name=f"gloo-connect-g{number}", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(CONNECT_CHECK_S)
            if thread.is_alive() and self.store.check_or_none([f"g{number}/abort"]):
                raise GenerationAborted(f"generation {number} aborted while connecting")
        if "error" in built:
            raise built["error"]
        return built["pg"]

    # ------------------------------------------------------------------ collectives
    def _pg(self) -> GlooGroup:
        if self._current is None:
            raise GroupFailed("no process group: form() first")
        return self._current.pg

    def _wait(self, work: dist.Work, what: str) -> None:
        number = self.generation
        started = time.monotonic()
        next_check = started + ABORT_CHECK_S
        said_waiting = False
        delay = 0.0001
        while not work.is_completed():
            now = time.monotonic()
            if not said_waiting and now - started >= WAITING_REPORT_S:
                # If this rank is found hung now, it is likelier a peer's victim than the culprit.
                progress.waiting()
                said_waiting = True
            if now >= next_check:
                # An etcd hiccup is "don't know": keep polling the collective itself.
                if self.store.check_or_none([f"g{number}/abort"]):
                    self.abort(f"{what} released: generation {number} aborted")
                    raise GroupFailed(f"generation {number} aborted during {what}")
                next_check = now + ABORT_CHECK_S
            time.sleep(delay)
            delay = min(delay * 2, POLL_MAX_S)
        try:
            work.wait()
        except RuntimeError as err:
            self.abort(f"{what} failed on rank {self.rank}: {err}")
            raise GroupFailed(f"{what} failed in generation {number}: {err}") from err

    def allreduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over every rank, in place."""
        self._wait(self._pg().allreduce([tensor]), "allreduce")
        return tensor

    def broadcast_(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        self._wait(self._pg().broadcast(tensor, src), "broadcast")
        return tensor

    def allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._wait(self._pg().allgather([out], [tensor]), "allgather")
        return out

    def close(self) -> None:
        self._current = None
