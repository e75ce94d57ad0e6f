"""torch.distributed's key-value store, kept in etcd: the rendezvous outlives every rank.

torchrun's c10d store lives in one agent (or in rank 0 with a plain ``init_process_group``): when
that process dies, the job's rendezvous dies with it. :class:`EtcdStore` is a ``torch.distributed``
``Store`` whose keys live under the run's ``rendezvous/`` prefix in recoverd's etcd (outside
``jobs/``, so rank traffic never wakes the coordinator). gloo's rendezvous and
:class:`~taskd_client.pytorch.group.ResilientGroup`'s generation bookkeeping both use it.

Blocking reads (``get``, ``wait``) wait on a **watch**, not a poll: one watch per store keeps a
local copy of the keys under the prefix (:meth:`EtcdStore.seen`); a read answers from it when it
holds the key, else reads etcd once (the copy may be a few milliseconds behind), and every
change wakes the waiters, which call ``interrupted()``: when the caller's generation is aborted
they raise :class:`GenerationAborted` instead of waiting out the timeout, so a group that is being
formed with a dead peer gives up at once. Waiting costs no CPU and no etcd requests: polling did
(three ranks waiting for a replacement made about a thousand etcd reads a second on the machine
where that replacement was starting). While the watch is not in step with etcd (starting,
reconnecting) the waits fall back to polling etcd.
Every method may be called from gloo's C++ threads; etcd calls run on one private event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta

import torch.distributed as dist

from recoverd import etcd_security
from recoverd.errors import EtcdUnavailable
from recoverd.store import RANK_PROBE_INTERVAL_S, Absent, Put, Resync, Store, ValueIs
from taskd_client.loop_thread import LoopThread

__all__ = ["EtcdStore", "GenerationAborted", "make_ahead", "open_store"]

log = logging.getLogger(__name__)

#: One etcd call gives up after this long (a rank must never hang on a dead etcd).
OP_TIMEOUT_S = 10.0
#: How long an etcd outage is ridden out before a store call fails.
RETRY_S = 30.0
POLL_MIN_S = 0.001
POLL_MAX_S = 0.005
#: A waiter re-checks its deadline and ``interrupted()`` at least this often while the watch is quiet.
WATCH_WAIT_MAX_S = 0.1
#: The watch is re-established after this long when etcd failed it (doubling up to 1 s).
MIRROR_RETRY_S = 0.05


class GenerationAborted(RuntimeError):
    """The process group generation this wait belonged to was aborted: form the next one."""


def _as_bytes(value: str | bytes | bytearray | Sequence[int]) -> bytes:
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


class EtcdStore(dist.Store):
    """A ``torch.distributed.Store`` over etcd keys under ``prefix`` (see the module docstring)."""

    def __init__(
        self,
        endpoints: str,
        prefix: str,
        timeout: timedelta = timedelta(seconds=300),
        interrupted: Callable[[], str | None] = lambda: None,
    ) -> None:
        super().__init__()
        self._prefix = prefix
        self._timeout = timeout
        self._endpoints = endpoints
        #: Made by a warm-start standby before this rank existed (:func:`make_ahead`).
        self.made_ahead = False
        self._loop = LoopThread(name="recoverd-rendezvous")
        self._store = Store(endpoints, probe_interval_s=RANK_PROBE_INTERVAL_S)
        self.interrupted = interrupted
        # The watched copy of the prefix (see the module docstring): key -> value, None while the
        # watch is not in step with etcd. ``_changes`` counts updates, so a waiter that saw one
        # state sleeps until the next one (no update can slip between its check and its sleep).
        self._changed = threading.Condition()
        self._mirror: dict[str, bytes] | None = None
        self._changes = 0
        self._mirror_task: concurrent.futures.Future[None] | None = None
        # Connect now, in the background: a replacement's first etcd request would otherwise pay
        # for the connection on the recovery's critical path (~20-30 ms measured) while the
        # script still builds its model.
        self._start_mirror()

    # ------------------------------------------------------------------ plumbing
    def _key(self, key: str) -> str:
        return f"{self._prefix}{key}"

    def _run(self, make):  # type: ignore[no-untyped-def]
        """Run ``make()``'s coroutine on the loop; an etcd outage is retried for up to
        ``RETRY_S`` (a leader election, a restart), then raised."""
        deadline = time.monotonic() + RETRY_S
        delay = 0.05
        while True:
            try:
                return self._loop.call(make(), OP_TIMEOUT_S)
            except EtcdUnavailable:
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _deadline(self) -> float:
        return time.monotonic() + self._timeout.total_seconds()

    def _check_interrupted(self) -> None:
        why = self.interrupted()
        if why:
            raise GenerationAborted(why)

    # ------------------------------------------------------------------ the watched copy
    def _start_mirror(self) -> None:
        with self._changed:
            if self._mirror_task is not None or self._loop.loop.is_closed():
                return
            self._mirror_task = self._loop.submit(self._keep_mirror())

    def _publish(self, mirror: dict[str, bytes] | None) -> None:
        with self._changed:
            self._mirror = mirror
            self._changes += 1
            self._changed.notify_all()

    def _apply(self, key: str, value: bytes | None) -> None:
        with self._changed:
            if self._mirror is not None:
                if value is None:
                    self._mirror.pop(key, None)
                else:
                    self._mirror[key] = value
            self._changes += 1
            self._changed.notify_all()

    async def _keep_mirror(self) -> None:
        """Read the prefix, then follow it by watch; re-read after the watch resyncs. Runs on the
        store's loop until it is closed."""
        delay = MIRROR_RETRY_S
        while True:
            try:
                snap = await self._store.get_prefix(self._prefix)
                self._publish({kv.key.removeprefix(self._prefix): bytes(kv.value) for kv in snap.kvs})
                delay = MIRROR_RETRY_S
                async for event in self._store.watch_prefix(self._prefix, snap.revision + 1):
                    if isinstance(event, Resync):
                        break  # re-read: what changed while the watch was down is in the new read
                    self._apply(event.key.removeprefix(self._prefix), None if event.is_delete else bytes(event.value))
                self._publish(None)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # an etcd outage, a refused read: poll meanwhile, try again
                log.debug("rendezvous watch on %s: %r; polling meanwhile", self._prefix, err)
                self._publish(None)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def watched(self, key: str) -> tuple[bool, bytes | None]:
        """(whether the watch is in step with etcd, the value it saw for ``key``): no etcd request."""
        live, (value,) = self._watched_many([key])
        return live, value

    def _watched_many(self, keys: list[str]) -> tuple[bool, list[bytes | None]]:
        """:meth:`watched` for several keys at once (one lock)."""
        self._start_mirror()
        with self._changed:
            if self._mirror is None:
                return False, [None] * len(keys)
            return True, [self._mirror.get(key) for key in keys]

    def seen(self, key: str) -> bytes | None:
        """The value of ``key`` as the watch last saw it, or None when absent. A value written
        moments ago by another rank may not be seen yet; while the watch is not in step with etcd
        this reads etcd. For checks that run often (an abort key): no etcd request each time."""
        live, value = self.watched(key)
        return value if live else self._get_now(key)

    def seen_or_none(self, key: str) -> bool | None:
        """Whether ``key`` is set as far as the watch knows; None when neither the watch nor etcd
        can say right now (an etcd hiccup is "don't know", never "aborted")."""
        live, value = self.watched(key)
        return value is not None if live else self.check_or_none([key])

    def _wait_for(self, keys: list[str], deadline: float, what: str) -> list[bytes]:
        """Block until every key of ``keys`` is set (their values), ``interrupted()`` says so or
        ``deadline`` passes (TimeoutError). Most waits end at once: a key the watched copy holds
        costs no etcd request (gloo's connect reads every peer's address: on a loaded node each
        request took 1-4 ms of a replacement's critical path); one it lacks (not set, or set so
        recently that the watch has not brought it yet) is read from etcd once before waiting."""
        live, values = self._watched_many(keys)
        if live and all(v is not None for v in values):
            return values  # type: ignore[return-value]
        values = [v if v is not None else self._get_now(key) for key, v in zip(keys, values, strict=True)]
        if all(v is not None for v in values):
            return values  # type: ignore[return-value]
        self._start_mirror()
        delay = POLL_MIN_S
        while True:
            with self._changed:
                changes = self._changes
                live = self._mirror is not None
                if live:
                    values = [self._mirror.get(key) for key in keys]  # type: ignore[union-attr]
            if not live:  # the watch is not in step: poll etcd as before it existed
                values = [self._get_now(key) for key in keys]
            if all(v is not None for v in values):
                return values  # type: ignore[return-value]
            self._check_interrupted()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(what)
            with self._changed:
                self._changed.wait_for(
                    lambda seen=changes: self._changes != seen,  # type: ignore[misc]
                    min(left, WATCH_WAIT_MAX_S if live else delay),
                )
            if not live:
                delay = min(delay * 2, POLL_MAX_S)

    def close(self) -> None:
        """Release the etcd connection and the loop thread; idempotent."""
        if not self._loop.loop.is_closed():
            if self._mirror_task is not None:
                self._mirror_task.cancel()
            try:
                self._loop.call(self._store.aclose(), OP_TIMEOUT_S)
            finally:
                self._loop.close()

    # ------------------------------------------------------------------ torch.distributed.Store
    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = timeout

    @property
    def timeout(self) -> timedelta:  # type: ignore[override]
        return self._timeout

    def set(self, key: str, value: str | bytes) -> None:  # type: ignore[override]
        self._run(lambda: self._store.put(self._key(key), _as_bytes(value)))

    def _get_now(self, key: str) -> bytes | None:
        kv = self._run(lambda: self._store.get(self._key(key)))
        return None if kv is None else bytes(kv.value)

    def get(self, key: str) -> bytes:  # type: ignore[override]
        what = f"rendezvous key {key!r} not set within {self._timeout.total_seconds():g}s"
        return self._wait_for([key], self._deadline(), what)[0]

    def check(self, keys: list[str]) -> bool:  # type: ignore[override]
        return all(self._get_now(key) is not None for key in keys)

    def check_or_none(self, keys: list[str]) -> bool | None:
        """:meth:`check` with no retry: None when etcd cannot answer right now."""
        try:
            snaps = [self._loop.call(self._store.get(self._key(key)), OP_TIMEOUT_S) for key in keys]
        except EtcdUnavailable:
            return None
        return all(kv is not None for kv in snaps)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:  # type: ignore[override]
        # gloo passes its (short) connect timeout here; waiting for a peer that is still starting
        # (a replacement importing torch) is the store's own, longer wait, ended early by an abort.
        limit = max(timeout or self._timeout, self._timeout).total_seconds()
        self._wait_for(list(keys), time.monotonic() + limit, f"rendezvous keys {keys!r} not all set within {limit:g}s")

    def add(self, key: str, amount: int) -> int:  # type: ignore[override]
        full = self._key(key)
        while True:
            kv = self._run(lambda: self._store.get(full))
            new = amount if kv is None else int(kv.value or b"0") + amount
            compare = Absent(full) if kv is None else ValueIs(full, kv.value)
            put = Put(full, str(new).encode())
            if self._run(lambda c=compare, p=put: self._store.txn([c], [p])).succeeded:
                return new

    def compare_set(self, key: str, expected_value: str | bytes, desired_value: str | bytes) -> bytes:  # type: ignore[override]
        """Set ``desired`` if the value is ``expected`` (or absent, when ``expected`` is empty);
        return the value now stored."""
        full = self._key(key)
        expected, desired = _as_bytes(expected_value), _as_bytes(desired_value)
        compare = Absent(full) if not expected else ValueIs(full, expected)
        if self._run(lambda: self._store.txn([compare], [Put(full, desired)])).succeeded:
            return desired
        current = self._get_now(key)
        return current if current is not None else expected

    def put_if(
        self,
        key: str,
        value: str | bytes,
        *,
        absent: Sequence[str] = (),
        equal: Mapping[str, str | bytes] | None = None,
    ) -> bool:
        """Set ``key`` in one etcd transaction if every key of ``absent`` is unset and every key of
        ``equal`` holds its value; whether it was set (several checks and a write, one request)."""
        compares: list[Absent | ValueIs] = [Absent(self._key(k)) for k in absent]
        compares += [ValueIs(self._key(k), _as_bytes(v)) for k, v in (equal or {}).items()]
        put = Put(self._key(key), _as_bytes(value))
        return bool(self._run(lambda: self._store.txn(compares, [put])).succeeded)

    def delete_key(self, key: str) -> bool:  # type: ignore[override]
        return bool(self._run(lambda: self._store.delete(self._key(key))))

    def num_keys(self) -> int:  # type: ignore[override]
        snap = self._run(lambda: self._store.get_prefix(self._prefix, keys_only=True))
        return len(snap.kvs)

    def multi_get(self, keys: list[str]) -> list[bytes]:  # type: ignore[override]
        """Every key's value, waiting for the missing ones (one look at the watched copy for all)."""
        what = f"rendezvous keys {keys!r} not all set within {self._timeout.total_seconds():g}s"
        return self._wait_for(list(keys), self._deadline(), what)

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:  # type: ignore[override]
        ops = [Put(self._key(k), _as_bytes(v)) for k, v in zip(keys, values, strict=True)]
        self._run(lambda: self._store.txn([], ops))

    def peek(self, key: str) -> bytes | None:
        """The value of ``key`` now, or None: :meth:`get` without waiting for it to be set."""
        return self._get_now(key)

    def read_record(self, key: str) -> bytes | None:
        """One key of recoverd's keyspace outside this store's prefix (a job record built by
        ``recoverd.keys``), read once; None when absent. Read-only: ranks never write job records."""
        kv = self._run(lambda: self._store.get(key))
        return None if kv is None else bytes(kv.value)

    def delete_prefix_now(self, below: str = "") -> None:
        """Remove every key of this store below ``below`` (all of them by default)."""
        self._run(lambda: self._store.delete_prefix(self._key(below)))

    def __repr__(self) -> str:
        return f"EtcdStore({self._store.endpoint}, {self._prefix!r})"


# ---------------------------------------------------------------------- made ahead
#: The store a warm-start standby made while it waited (:func:`make_ahead`), for the trainer of the
#: rank it became to take (:func:`open_store`): connected, its watch in step with the prefix.
_ahead: EtcdStore | None = None
_ahead_lock = threading.Lock()


def make_ahead(endpoints: str, prefix: str) -> None:
    """Make now the rendezvous store this process's trainer will ask for first.

    A warm-start standby (a process forked ahead to become the next replacement rank, docs/
    pytorch.md) calls it while it waits: the store connects and reads the prefix on its own thread,
    so the replacement's first requests, on the recovery's critical path, pay for no connection
    (~12 ms on an idle node) and find the current generation and the peers' addresses in the
    watched copy (its join is one etcd request). The cost: one more watch of the run's rendezvous
    prefix per node, for as long as the standby waits."""
    global _ahead
    made = EtcdStore(endpoints, prefix)
    made.made_ahead = True
    with _ahead_lock:
        _ahead, old = made, _ahead
    if old is not None:
        old.close()


def open_store(endpoints: str, prefix: str, timeout: timedelta = timedelta(seconds=300)) -> EtcdStore:
    """The rendezvous store for ``prefix``: the one made ahead, once, if it is for the same etcd,
    prefix and credentials (this process's environment now: a rank's is set after the store was
    made), else a new one."""
    global _ahead
    with _ahead_lock:
        made, _ahead = _ahead, None
    if made is not None:
        if (made._endpoints, made._prefix, made._store.security) == (endpoints, prefix, etcd_security.from_env()):
            made.set_timeout(timeout)
            return made
        made.close()
    return EtcdStore(endpoints, prefix, timeout=timeout)
