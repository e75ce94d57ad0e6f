"""torch.distributed's key-value store, kept in etcd: the rendezvous outlives every rank.

torchrun's c10d store lives in one agent (or in rank 0 with a plain ``init_process_group``): when
that process dies, the job's rendezvous dies with it. :class:`EtcdStore` is a ``torch.distributed``
``Store`` whose keys live under the run's ``rendezvous/`` prefix in recoverd's etcd (outside
``jobs/``, so rank traffic never wakes the coordinator). gloo's rendezvous and
:class:`~taskd_client.pytorch.group.ResilientGroup`'s generation bookkeeping both use it.

Blocking reads (``get``, ``wait``) poll with a short backoff and call ``interrupted()`` between
polls: when the caller's generation is aborted they raise :class:`GenerationAborted` instead of
waiting out the timeout, so a group that is being formed with a dead peer gives up at once.
Every method may be called from gloo's C++ threads; etcd calls run on one private event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch.distributed as dist

from recoverd.errors import EtcdUnavailable
from recoverd.store import Absent, Put, Store, ValueIs
from taskd_client.loop_thread import LoopThread

__all__ = ["EtcdStore", "GenerationAborted"]

#: One etcd call gives up after this long (a rank must never hang on a dead etcd).
OP_TIMEOUT_S = 10.0
#: How long an etcd outage is ridden out before a store call fails.
RETRY_S = 30.0
POLL_MIN_S = 0.001
POLL_MAX_S = 0.005


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
        self._loop = LoopThread(name="recoverd-rendezvous")
        self._store = Store(endpoints)
        self.interrupted = interrupted

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

    def close(self) -> None:
        """Release the etcd connection and the loop thread; idempotent."""
        if not self._loop.loop.is_closed():
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
        deadline = self._deadline()
        delay = POLL_MIN_S
        while True:
            value = self._get_now(key)
            if value is not None:
                return value
            self._check_interrupted()
            if time.monotonic() >= deadline:
                raise TimeoutError(f"rendezvous key {key!r} not set within {self._timeout.total_seconds():g}s")
            time.sleep(delay)
            delay = min(delay * 2, POLL_MAX_S)

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
        deadline = time.monotonic() + limit
        delay = POLL_MIN_S
        while not self.check(keys):
            self._check_interrupted()
            if time.monotonic() >= deadline:
                raise TimeoutError(f"rendezvous keys {keys!r} not all set within {limit:g}s")
            time.sleep(delay)
            delay = min(delay * 2, POLL_MAX_S)

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

    def delete_key(self, key: str) -> bool:  # type: ignore[override]
        return bool(self._run(lambda: self._store.delete(self._key(key))))

    def num_keys(self) -> int:  # type: ignore[override]
        snap = self._run(lambda: self._store.get_prefix(self._prefix, keys_only=True))
        return len(snap.kvs)

    def multi_get(self, keys: list[str]) -> list[bytes]:  # type: ignore[override]
        return [self.get(key) for key in keys]

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
