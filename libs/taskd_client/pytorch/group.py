"""A gloo process group that survives a peer's death: abortable collectives, numbered generations.

gloo has no abort: a rank blocked in a collective with a dead peer waits out the group's timeout,
and ``destroy_process_group`` does not release it (measured: rank 0 stayed blocked 30 s). So the
survivors never wait on a collective they cannot leave (docs/adr/0017):

* every collective is issued asynchronously and waited for in slices of ABORT_CHECK_S (gloo's
  bounded ``wait``, which returns the moment it completes; NCCL's ``is_completed()`` polled)
  while the rank watches its generation's **abort key** in the rendezvous store (etcd);
* the first rank that sees a collective fail (gloo reports a reset connection in ~10 ms) sets the
  abort key, which releases every other rank within a poll interval, including one whose own
  collective would only have timed out;
* a failed group is parked (never destroyed: its worker thread may still be blocked; it unwinds at
  the group's own timeout) and a **new generation** is formed on a fresh store prefix, so no rank
  ever reads a dead peer's address;
* a restarted rank whose predecessor joined the current generation aborts it (that generation can
  never complete) and joins the next one.

Generation bookkeeping in the store: ``gen`` (the current number), ``g<n>/abort``, ``g<n>/member/<rank>``
(the incarnation that joined, and what it said of itself: :attr:`ResilientGroup.joining_note`),
and the backends' own keys under ``g<n>/pg/``.

**Backends.** A generation is a ``torch.distributed.ProcessGroup`` with the job's backends registered
per device, as ``init_process_group`` would make it: ``gloo``, ``nccl``, or ``cpu:gloo,cuda:nccl``
(:func:`parse_backend`). An NCCL backend is also released directly: an abort calls its ``abort()``,
which ends a collective blocked on the GPU. **DistributedDataParallel** gets the group itself
(:attr:`ResilientGroup.process_group`) and a communication hook whose futures fail as soon as the
generation is aborted (:meth:`ResilientGroup.allreduce_future`): DDP keeps its buckets and its
overlap of communication with the backward pass, and a rank is never stuck in ``backward()``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from taskd_client import progress
from taskd_client.pytorch.store import EtcdStore, GenerationAborted

__all__ = ["GroupFailed", "ResilientGroup", "parse_backend"]

ABORT_CHECK_S = 0.005
_ABORT_CHECK = timedelta(seconds=ABORT_CHECK_S)
POLL_MIN_S = 0.00002
#: The first poll interval of a collective the rank waits for by polling (NCCL's).
POLL_START_S = 0.0001
POLL_MAX_S = 0.001
#: A collective pending this long is told to the agent's hang detector (once per collective).
WAITING_REPORT_S = 0.5
#: How often a rank connecting a new generation checks whether it was aborted.
CONNECT_CHECK_S = 0.01
#: A parked group is dropped this long after its timeout (its thread has unwound by then).
PARK_MARGIN_S = 10.0


class GroupFailed(RuntimeError):
    """A collective of the current generation failed or was aborted; form the next generation."""


#: A generation's ``torch.distributed.ProcessGroup`` (typed loosely: torch's stubs lag its API).
GlooGroup = Any

_BACKENDS = {"gloo": "GLOO", "nccl": "NCCL"}
#: Tags of :meth:`ResilientGroup.share`'s two point-to-point messages (the size, then the bytes).
_SIZE_TAG, _BYTES_TAG = 1, 2


def parse_backend(spec: str) -> dict[str, str]:
    """``"gloo"``, ``"nccl"`` or ``"cpu:gloo,cuda:nccl"`` as {device type: backend}; ValueError
    with the reason for anything else (a bare backend serves the device type it runs on)."""
    spec = spec.strip().lower()
    if spec in _BACKENDS:
        return {"cuda" if spec == "nccl" else "cpu": spec}
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        device, _, backend = part.partition(":")
        if device not in ("cpu", "cuda") or backend not in _BACKENDS or device in out:
            raise ValueError(f"backend {spec!r}: expected gloo, nccl or DEVICE:BACKEND pairs like cpu:gloo,cuda:nccl")
        out[device] = backend
    if not out:
        raise ValueError(f"backend {spec!r}: empty")
    return out


class _Abandoned(Exception):
    """:func:`_unless_aborted` left its work behind: the generation was aborted meanwhile."""


def _unless_aborted(name: str, work: Callable[[], Any], aborted: Callable[[], bool], every_s: float) -> Any:
    """``work()`` on a daemon thread, checking ``aborted()`` every ``every_s``: raise _Abandoned at
    once when it says so (the thread is left to unwind on its own: a collective inside torch cannot
    be interrupted), else return work's result or raise its exception."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = work()
        except BaseException as err:  # handed to the caller's thread
            result["error"] = err

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(every_s)
        if thread.is_alive() and aborted():
            raise _Abandoned(name)
    if "error" in result:
        raise result["error"]
    return result.get("value")


@dataclass(frozen=True, slots=True)
class _Pending:
    """A collective of DDP's communication hook, and the future DDP waits on."""

    generation: int
    future: torch.futures.Future[torch.Tensor]
    work: Any
    tensor: torch.Tensor
    issued_at: float


@dataclass(slots=True)
class _Generation:
    number: int
    pg: GlooGroup
    #: The backends registered in ``pg`` (an NCCL one can be aborted).
    backends: tuple[Any, ...] = ()


def _member_key(generation: int, rank: int) -> str:
    """The store key a rank writes when it joins a generation (its incarnation and joining note)."""
    return f"g{generation}/member/{rank}"


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
        backend: str = "gloo",
        device: torch.device | None = None,
    ) -> None:
        self.store = store
        #: {device type: backend}, e.g. {"cpu": "gloo", "cuda": "nccl"}.
        self.backends = parse_backend(backend)
        #: Where this rank's collectives of the trainer's own (state, barriers) run: its GPU
        #: (``LOCAL_RANK``'s) when the job has only NCCL, else the CPU.
        self.device = device or (
            torch.device("cuda", int(os.environ.get("LOCAL_RANK") or torch.cuda.current_device()))
            if "cpu" not in self.backends
            else torch.device("cpu")
        )
        self.rank = rank
        self.world_size = world_size
        self.incarnation = incarnation or f"{os.getpid()}@{time.time_ns()}"
        #: What this rank says of itself when it joins a generation (no spaces needed, any text):
        #: every member reads all of them once it is formed (:meth:`notes`), with no collective.
        self.joining_note: Callable[[], str] | None = None
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
        #: DDP hook collectives not completed yet: completed or failed by the watcher thread.
        self._pending: dict[int, _Pending] = {}
        self._pending_lock = threading.Lock()
        #: Set while a hook future is pending: wakes the abort watcher (one thread, started once).
        self._has_pending = threading.Event()
        self._watcher: threading.Thread | None = None
        self._pending_seq = 0
        #: Why a hook future of the current generation failed (DDP's backward then raises).
        self.hook_failure: str | None = None
        #: While set, :meth:`settle` lets a work of a generation this rank has left go at once.
        self.dropping_stale_works = False
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
        if number >= 0 and self.store.seen(f"g{number}/abort") is not None:
            return f"generation {number} aborted"
        return None

    def abort(self, why: str) -> None:
        """Mark the current generation broken (releases every rank waiting in it) and leave it."""
        if self._current is None:
            return
        number = self._current.number
        current, self._current = self._current, None
        self._release(current)
        self._fail_pending(number, why)
        self.store.compare_set(f"g{number}/abort", "", why[:200])
        self.store.compare_set("gen", str(number), str(number + 1))

    def _release(self, generation: _Generation) -> None:
        """Leave a failed generation: NCCL backends are aborted (that ends their blocked collectives);
        the group is parked, never destroyed (a gloo thread may still be blocked in it)."""
        for backend in generation.backends:
            if hasattr(backend, "abort") and type(backend).__name__ == "ProcessGroupNCCL":
                try:
                    backend.abort()
                except RuntimeError:
                    pass  # already aborted, or torn down by its own watchdog
        self.park(generation.pg)

    def park(self, pg: GlooGroup) -> None:
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
            number = self._join_current()
            if number is None:
                continue
            self._forming = number
            try:
                pg, backends = self._connect(number)
            except (GenerationAborted, RuntimeError, TimeoutError) as err:
                # A peer died or restarted while the group was formed: this generation is lost.
                self.store.compare_set(f"g{number}/abort", "", f"forming failed on rank {self.rank}: {err}"[:200])
                self.store.compare_set("gen", str(number), str(number + 1))
                continue
            finally:
                self._forming = -1
            self._current = _Generation(number, pg, backends)
            self.hook_failure = None
            if number >= 2:
                # Two generations back is surely over: its keys only take etcd space.
                self.store.delete_prefix_now(f"g{number - 2}/")
            return number

    def _join_current(self) -> int | None:
        """Take this rank's seat in the current generation: its number, or None to look again (it
        was aborted or moved on meanwhile, or a predecessor's seat in it was found and aborted).

        Usually one etcd request (two before the store's watch is in step): the generation as the
        watch saw it, joined in one transaction that holds only if it is still current, not aborted
        and the seat free (a replacement's join was four requests in a row, ~10 ms of its critical
        path on a loaded node). When that transaction fails, the checks run one by one to find out
        why."""
        live, seen = self.store.watched("gen")
        if not live:  # the watch is not in step yet (a replacement's first join): ask etcd
            seen = self.store.peek("gen")
        if seen is not None and not (live and self.store.watched(f"g{int(seen)}/abort")[1]):
            number = int(seen)
            if not self._seated(number):
                return None
            member, abort = _member_key(number, self.rank), f"g{number}/abort"
            if self.store.put_if(member, self._member_value(), absent=(member, abort), equal={"gen": seen}):
                return number
        number = int(self.store.compare_set("gen", "", "0"))
        abort = f"g{number}/abort"
        if self.store.check([abort]):
            self.store.compare_set("gen", str(number), str(number + 1))
            return None
        if not self._seated(number):
            return None
        member, mine = _member_key(number, self.rank), self._member_value()
        held = self.store.compare_set(member, "", mine).decode()
        if held != mine:
            # My predecessor joined this generation: it can never complete. Abort it.
            self.store.compare_set(abort, "", f"rank {self.rank} restarted")
            self.store.compare_set("gen", str(number), str(number + 1))
            return None
        return number

    def _member_value(self) -> str:
        """A member key's value: the incarnation (it has no space), then the joining note."""
        return self.incarnation if self.joining_note is None else f"{self.incarnation} {self.joining_note()}"

    def notes(self) -> list[str]:
        """Every member's joining note in the current generation, by rank ("" where a member
        wrote none). Read from the store's watched copy: every member wrote its key before it
        connected, so a formed generation has them all (an etcd read only for one the watch has
        not brought yet)."""
        number = self.generation
        if number < 0:
            raise GroupFailed("no process group: form() first")
        values = self.store.multi_get([_member_key(number, r) for r in range(self.world_size)])
        return [value.decode().partition(" ")[2] for value in values]

    def _seated(self, number: int) -> bool:
        """Whether this rank has a seat in generation ``number`` (always, unless ``seat`` decides:
        then its rank and world size are the seat's)."""
        if self.seat is None:
            return True
        seat = self.seat(number)
        if seat is None:
            return False
        self.rank, self.world_size = seat
        return True

    def _backend(self, prefixed: dist.Store, device: str, name: str, rank: int, size: int) -> Any:
        if name == "gloo":
            gloo = dist.ProcessGroupGloo(prefixed, rank, size, self.form_timeout)
            gloo.set_timeout(self.timeout)  # collectives: peers may legitimately be slow
            return gloo
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = self.timeout
        return dist.ProcessGroupNCCL(prefixed, rank, size, options)

    def connect_group(self, number: int, prefix: str, rank: int, size: int) -> GlooGroup:
        """A group of ``size`` ranks (this one ``rank`` in it) for generation ``number``, with the
        job's backends, its keys under ``prefix`` (which starts ``g<number>/``: a mesh's sub-group,
        mesh.WorldGroup.connect). Call it on a helper thread (:meth:`run_abortable`): its connection
        waits for the peers, and gives up when the generation is aborted."""
        if not prefix.startswith(f"g{number}/"):
            raise ValueError(f"a group of generation {number} must live under g{number}/, not {prefix!r}")
        self._connecting.number = number
        return self._make_group(dist.PrefixStore(prefix, self.store), rank, size)[0]

    def _make_group(self, prefixed: dist.Store, rank: int, size: int) -> tuple[GlooGroup, tuple[Any, ...]]:
        pg = dist.ProcessGroup(prefixed, rank, size)
        backends = []
        for device, name in self.backends.items():
            backend = self._backend(prefixed, device, name, rank, size)
            kind = getattr(dist.ProcessGroup.BackendType, _BACKENDS[name])
            pg._register_backend(torch.device(device), kind, backend)
            backends.append(backend)
        if len(set(self.backends.values())) == 1:
            pg._set_default_backend(kind)
        return pg, tuple(backends)

    def _connect(self, number: int) -> tuple[GlooGroup, tuple[Any, ...]]:
        """Build generation ``number``'s group on a helper thread, and give up on it as soon as the
        generation is aborted: gloo's connect loop cannot be interrupted, and a member that died
        after writing its address (an `exit` mid-recovery) would hold it for the connect timeout."""

        def build() -> tuple[GlooGroup, tuple[Any, ...]]:
            self._connecting.number = number
            # PrefixStore adds the "/"
            return self._make_group(dist.PrefixStore(f"g{number}/pg", self.store), self.rank, self.world_size)

        try:
            return _unless_aborted(f"gloo-connect-g{number}", build, lambda: self.aborted(number), CONNECT_CHECK_S)  # type: ignore[no-any-return]
        except _Abandoned:
            raise GenerationAborted(f"generation {number} aborted while connecting") from None

    def aborted(self, number: int) -> bool:
        """Generation ``number``'s abort key is set (an etcd hiccup is "not known to be")."""
        return bool(self.store.seen_or_none(f"g{number}/abort"))

    # ------------------------------------------------------------------ collectives
    def _pg(self) -> GlooGroup:
        if self._current is None:
            raise GroupFailed("no process group: form() first")
        return self._current.pg

    @property
    def process_group(self) -> GlooGroup:
        """The current generation's ``ProcessGroup`` (for ``DistributedDataParallel``)."""
        return self._pg()

    def run_abortable(self, what: str, work: Any) -> Any:
        """``work()`` on a helper thread, left behind (and GroupFailed raised) if the generation is
        aborted meanwhile: for blocking collectives inside torch that cannot be polled (DDP's
        construction checks every rank's parameter shapes)."""
        number = self.generation
        try:
            return _unless_aborted(f"{what}-g{number}", work, lambda: self.aborted(number), ABORT_CHECK_S)
        except _Abandoned:
            self.abort(f"{what} released: generation {number} aborted")
            raise GroupFailed(f"generation {number} aborted during {what}") from None
        except RuntimeError as error:  # a collective failed: this generation is lost
            self.abort(f"{what} failed on rank {self.rank}: {error}")
            raise GroupFailed(f"{what} failed in generation {number}: {error}") from error
        # Anything else is the caller's own mistake (a bad argument): no generation would fix it.

    # ------------------------------------------------------------------ DDP's communication hook
    def allreduce_future(self, tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
        """Sum ``tensor`` over every rank, in place; a future that completes with it, or fails as
        soon as the generation is aborted or the collective fails (never blocks a rank for good).

        The collective is watched by polling (:meth:`_watch_pending`), not with a callback on its
        own future: a collective left in flight by an abort completes (with an error) only when its
        peers exit, possibly while this interpreter is shutting down, and a Python callback run
        then cannot take the GIL: the thread is unwound through C++ and the process aborts
        (``terminate called after throwing gloo::IoException``, seen at the end of a recovered run)."""
        number = self.generation
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future(
            devices=[tensor.device] if tensor.is_cuda else None
        )
        work = self._pg().allreduce([tensor])
        with self._pending_lock:
            self._pending_seq += 1
            self._pending[self._pending_seq] = _Pending(number, future, work, tensor, time.monotonic())
            self._has_pending.set()
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch_pending, name="recoverd-collectives", daemon=True)
                self._watcher.start()
        return future

    def _fail_pending(self, number: int, why: str) -> None:
        with self._pending_lock:
            failed = [k for k, entry in self._pending.items() if entry.generation <= number]
            futures = [self._pending.pop(k).future for k in failed]
        for future in futures:
            if not future.done():
                self.hook_failure = f"generation {number} aborted: {why}"
                future.set_exception(GroupFailed(self.hook_failure))  # type: ignore[arg-type]  # stubs: Tensor

    def _finish_completed(self, pending: dict[int, _Pending]) -> bool:
        """Complete the futures of the collectives that are done; True if any was."""
        finished = False
        for key, entry in pending.items():
            if not entry.work.is_completed():
                continue
            with self._pending_lock:
                if self._pending.pop(key, None) is None:
                    continue  # failed by an abort meanwhile
            finished = True
            try:
                entry.work.wait()
            except RuntimeError as err:
                self.hook_failure = f"allreduce failed in generation {entry.generation}: {err}"
                entry.future.set_exception(GroupFailed(self.hook_failure))  # type: ignore[arg-type]
                continue
            entry.future.set_result(entry.tensor)
        return finished

    def _watch_pending(self) -> None:
        """The collectives of DDP's hook: complete their futures as soon as they are done (gloo's:
        a bounded wait on the oldest; others polled from POLL_MIN_S, backing off to POLL_MAX_S),
        fail them when their generation's abort key appears (another rank saw the failure), and
        tell the hang detector when this rank waits.
        As in :meth:`_wait`, a collective done within ABORT_CHECK_S never costs an etcd read."""
        said_waiting = False
        delay = POLL_MIN_S
        next_check = 0.0
        while True:
            with self._pending_lock:
                pending = dict(self._pending)
                if not pending:
                    self._has_pending.clear()
            if not pending:
                said_waiting = False
                self._has_pending.wait()
                delay = POLL_MIN_S
                continue
            if self._finish_completed(pending):
                delay = POLL_MIN_S
                continue
            now = time.monotonic()
            waited = now - min(entry.issued_at for entry in pending.values())
            if waited >= WAITING_REPORT_S and not said_waiting:
                progress.waiting()  # if found hung now, likelier a peer's victim than the culprit
                said_waiting = True
            if waited >= ABORT_CHECK_S and now >= next_check:
                next_check = now + ABORT_CHECK_S
                for number in sorted({entry.generation for entry in pending.values()}):
                    if self.store.seen_or_none(f"g{number}/abort"):
                        self._fail_pending(number, "another rank aborted it")
            oldest = min(pending.values(), key=lambda entry: entry.issued_at)
            # Not while the interpreter shuts down: a daemon thread woken in C++ then cannot take
            # the GIL back (see allreduce_future); there the poll below is safe.
            if self._can_block(oldest.tensor) and threading.main_thread().is_alive():
                # gloo runs a group's collectives in order: the oldest completes first. Its bounded
                # wait returns the moment it does (polling woke up to POLL_MAX_S late), and at the
                # latest when the abort key is due to be read again.
                with contextlib.suppress(RuntimeError):
                    oldest.work.wait(_ABORT_CHECK)
                continue
            time.sleep(delay)
            delay = min(delay * 2, POLL_MAX_S)

    def _can_block(self, tensor: torch.Tensor) -> bool:
        """Whether a collective of ``tensor`` runs on gloo, whose bounded ``wait`` returns the
        moment it completes and, on timeout, leaves it running (NCCL's does not block the host:
        its collectives are polled)."""
        return not tensor.is_cuda and self.backends.get("cpu") == "gloo"

    @staticmethod
    def _settled(work: dist.Work, block: bool, delay: float) -> bool:
        """Whether ``work`` has completed (or failed), after waiting for it up to ABORT_CHECK_S.
        ``block``: in the backend's own wait, woken the moment it completes (a poll woke up to
        POLL_MAX_S late: ~0.5 ms per collective); else by polling from ``delay``."""
        if block:
            try:
                work.wait(_ABORT_CHECK)
                return True
            except RuntimeError:  # "Operation timed out!" (the work goes on), or it failed
                return bool(work.is_completed())
        deadline = time.monotonic() + ABORT_CHECK_S
        while not work.is_completed():
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, POLL_MAX_S)
        return True

    def _wait(self, work: dist.Work, what: str, tensor: torch.Tensor) -> None:
        """Wait for ``work`` until it completes, or raise GroupFailed when it fails or the
        generation is aborted."""
        self._wait_in(self.generation, work, what, self._can_block(tensor))

    def settle(self, work: dist.Work, what: str, number: int) -> None:
        """Wait for ``work``, issued in generation ``number`` on a group of the job's CPU backend (a
        mesh's: mesh.StableGroup), as :meth:`_wait` does. A work of a generation this rank has
        left raises GroupFailed, or returns at once while :attr:`dropping_stale_works` (FSDP2's
        reset after a failed step waits on the works it left in flight)."""
        if number != self.generation:
            if self.dropping_stale_works:
                return
            raise GroupFailed(f"{what} of generation {number}, which this rank has left")
        self._wait_in(number, work, what, self.backends.get("cpu") == "gloo")

    def _wait_in(self, number: int, work: dist.Work, what: str, block: bool) -> None:
        started = time.monotonic()
        said_waiting = False
        delay = POLL_START_S
        while not self._settled(work, block, delay):
            delay = POLL_MAX_S  # polled: it is a long wait now
            if not said_waiting and time.monotonic() - started >= WAITING_REPORT_S:
                # If this rank is found hung now, it is likelier a peer's victim than the culprit.
                progress.waiting()
                said_waiting = True
            # An etcd hiccup is "don't know": keep waiting for the collective itself.
            if self.store.seen_or_none(f"g{number}/abort"):
                self.abort(f"{what} released: generation {number} aborted")
                raise GroupFailed(f"generation {number} aborted during {what}")
        try:
            work.wait()
        except RuntimeError as err:
            self.abort(f"{what} failed on rank {self.rank}: {err}")
            raise GroupFailed(f"{what} failed in generation {number}: {err}") from err

    def allreduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over every rank, in place."""
        self._wait(self._pg().allreduce([tensor]), "allreduce", tensor)
        return tensor

    def share(self, blob: torch.Tensor | None, source: int, receivers: Sequence[int]) -> torch.Tensor | None:
        """Bytes (a uint8 tensor on :attr:`device`, ``blob`` at ``source``, None elsewhere) from
        ``source`` to ``receivers``: returned at a receiver, None elsewhere. Every rank calls it
        with the same ``source`` and ``receivers``.

        On the CPU (gloo) it is point to point, to the receivers only: a rank that does not need
        the bytes neither waits for them nor competes for the CPU with the ones that do (a
        recovery's critical path waits for its slowest rank). On a GPU (a job with NCCL only) it is
        a broadcast to every rank on the generation's communicator, which the agreement's
        all-gather has just set up: point to point, NCCL would set one up for each pair first."""
        me = self.rank
        if me != source and me not in receivers and self.device.type == "cpu":
            return None
        size = torch.tensor([blob.numel() if blob is not None else 0], dtype=torch.int64, device=self.device)
        if self.device.type != "cpu":
            self._wait(self._pg().broadcast(size, source), "broadcast", size)
            data = blob if me == source else torch.empty(int(size[0]), dtype=torch.uint8, device=self.device)
            assert data is not None
            self._wait(self._pg().broadcast(data, source), "broadcast", data)
            return data if me in receivers else None
        # gloo's sends and receives cannot be polled (``is_completed`` turns true only in ``wait``)
        # and a bounded ``wait`` gives one up for good (a receive then holds garbage): they are
        # waited for whole on a helper thread, left behind if the generation is aborted.
        pg = self._pg()
        if me == source:
            assert blob is not None
            # Every message at once: a receiver takes its two in order (they are matched by tag).
            sends = [pg.send([size], r, _SIZE_TAG) for r in receivers]
            sends += [pg.send([blob], r, _BYTES_TAG) for r in receivers]
            self.run_abortable("send", lambda: [work.wait() for work in sends])
            return None

        def receive() -> torch.Tensor:
            pg.recv([size], source, _SIZE_TAG).wait()
            data = torch.empty(int(size[0]), dtype=torch.uint8, device=self.device)
            pg.recv([data], source, _BYTES_TAG).wait()
            return data

        return self.run_abortable("receive", receive)  # type: ignore[no-any-return]

    def allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._wait(self._pg().allgather([out], [tensor]), "allgather", tensor)
        return out

    def close(self) -> None:
        self._current = None
