"""The one module that talks to etcd.

Wraps the chosen client (aetcd, docs/adr/0002; nothing else imports it but :mod:`etcd_client`, its
TLS subclass, and :mod:`etcd_admin`'s request types: importing two etcd clients in one process fails
with "duplicate symbol") and adds what it lacks:

* **TLS and users** (docs/adr/0030): :class:`recoverd.etcd_security.EtcdSecurity` (default: the
  environment's); :meth:`Store.verify` is the entry points' startup check (EtcdAccessDenied on a
  bad certificate or password), and an expired auth token reconnects;

* **resuming watches**: :meth:`Store.watch_prefix` survives an etcd restart or a lost connection by
  re-watching from the last seen ``mod_revision + 1``, so no event is lost or delivered twice, and
  yields a :class:`Resync` marker after every reconnect or compaction so level-triggered callers
  re-read everything once;
* **lease keep-alive**: :class:`LeaseKeeper` refreshes a lease every TTL/2, at once again when a
  refresh fails or is late, and sets ``lost`` once it has certainly expired, so its owner can
  re-register (docs/adr/0025);
* **typed transactions**: compares and operations are our own small dataclasses, so callers state
  fences (``ValueIs(leader_key, me)``, ``ModRevisionAtMost(run_prefix, read_rev)``) without the
  client's types;
* **endpoint failover**: a comma-separated endpoint list, started at a random member; a connection
  failure moves to the next. With more than one endpoint a watchdog asks the current member for its
  status every :data:`PROBE_INTERVAL_S` with a :data:`PROBE_TIMEOUT_S` deadline: a member that does
  not answer (hung, SIGSTOPped, its disk stuck) is left at once (and avoided for a while), one
  without a leader for over :data:`LEADERLESS_S` (cut off from the quorum) too, and a leader change
  seen while calls are in flight fails those calls at once (a write forwarded to a dead leader is
  lost and would otherwise wait out ``op_timeout_s``), so callers retry on a healthy member within a
  second, not after the 5 s call timeout; watches move with the connection (docs/adr/0043).

Every call has a timeout (``op_timeout_s``); a connection problem raises :class:`EtcdUnavailable`.

etcd's limits are part of the contract (docs/adr/0019):

* **keys are bytes**: anyone can write a key that is not UTF-8. Keys are decoded with
  ``surrogateescape`` and encoded back the same way, so such a key reaches the caller as a string
  that names no valid id (rejected by ``keys.parse``) and can still be deleted; :func:`printable`
  makes it safe to log or store in a record;
* **no request over the limits**: a transaction over :data:`MAX_TXN_OPS` operations or compares, or
  any request over :data:`MAX_REQUEST_BYTES`, raises :class:`RequestTooLarge` before it is sent; a
  refusal from etcd itself raises :class:`RequestTooLarge` or :class:`EtcdRefused`, never
  :class:`EtcdUnavailable` (a retry of the same request cannot succeed);
* **no response over the limit**: :meth:`Store.get_prefix` reads in pages at one revision and halves
  the page when etcd's answer would exceed the client's 4 MiB, so a job of any size can be read;
* **known-bad servers**: once per connection the server's version is read and a release with a
  known data-loss bug (``etcd_versions``) is logged as a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from asyncio import FIRST_COMPLETED
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions as aetcd_errors

from recoverd import etcd_security, metrics
from recoverd.errors import (
    ConfigError,
    EtcdAccessDenied,
    EtcdRefused,
    EtcdUnavailable,
    PermissionDenied,
    ReadCompacted,
    RecoverdError,
    RequestTooLarge,
)
from recoverd.etcd_client import EtcdClient, access_problem, is_stale_token, tls_hint
from recoverd.etcd_security import EtcdSecurity
from recoverd.etcd_versions import known_problem
from recoverd.keys import printable

__all__ = [
    "AVOID_HUNG_S",
    "KEEPALIVE_FRACTION",
    "KEEPALIVE_IN_FLIGHT",
    "KEEPALIVE_RETRY_S",
    "KV",
    "LEADERLESS_S",
    "MAX_REQUEST_BYTES",
    "MAX_TXN_OPS",
    "PROBE_INTERVAL_S",
    "PROBE_TIMEOUT_S",
    "RANK_PROBE_INTERVAL_S",
    "Absent",
    "Compare",
    "Delete",
    "DeletePrefix",
    "LeaseKeeper",
    "ModRevisionAtMost",
    "Op",
    "Put",
    "Resync",
    "Snapshot",
    "Store",
    "TxnResult",
    "ValueIs",
    "WatchEvent",
    "check_lease_ttl",
    "op_size",
    "parse_endpoints",
    "printable",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: etcd's ``--max-txn-ops`` default: operations per transaction branch (and compares).
MAX_TXN_OPS = 128
#: etcd's ``--max-request-bytes`` default is 1.5 MiB; keep a margin for the request's own framing.
MAX_REQUEST_BYTES = 1536 * 1024 - 16 * 1024
#: Keys per page of a range read; halved while etcd's answer is over the client's 4 MiB.
PAGE_KEYS = 1000
#: A lease's keep-alive interval as a fraction of its TTL (docs/adr/0025): with etcd's minimum TTL
#: of 2 s a dead node is declared in about 1.75 s, and a live one may stall 1 s without losing it.
KEEPALIVE_FRACTION = 0.5
#: Pause before a failed keep-alive is sent again (the store has failed over meanwhile).
KEEPALIVE_RETRY_S = 0.05
#: Keep-alives of one lease in flight at once (a late one gets another beside it).
KEEPALIVE_IN_FLIGHT = 3
_COMPACTED_RETRIES = 3
#: How long re-creating a lost watch may take before it is tried again (see ``watch_prefix``).
WATCH_RECREATE_S = 1.0
#: How often the watchdog asks the current member for its status (only with several endpoints).
PROBE_INTERVAL_S = 0.2
#: How long a member may take to answer the watchdog before it is left: a stall is noticed within
#: PROBE_INTERVAL_S + PROBE_TIMEOUT_S (0.7 s), inside an agent lease's 1 s stall margin (ADR 0025).
#: A healthy member answers in milliseconds; a slow answer on a loaded host costs one reconnect.
PROBE_TIMEOUT_S = 0.5
#: The probe interval of the stores in training ranks (the client library, the rendezvous store):
#: thousands of them must not ask etcd 5 times a second each; a rank holds no node lease.
RANK_PROBE_INTERVAL_S = 1.0
#: A member that reports no leader for longer than this is left: an election takes less (every
#: member is leaderless then, so moving would not help); a member cut off from the quorum stays so.
LEADERLESS_S = 1.0
#: A member left because it did not answer is not chosen again for this long while another is there.
AVOID_HUNG_S = 5.0


def _raw(key: str) -> bytes:
    """A key as etcd stores it: the inverse of :func:`_text` (undecodable bytes round-trip)."""
    return key.encode("utf-8", errors="surrogateescape")


def _text(key: bytes) -> str:
    """A key from etcd as a string; bytes that are not UTF-8 become lone surrogates (never an error)."""
    return key.decode("utf-8", errors="surrogateescape")


def _detail(err: BaseException) -> str:
    """An error's own words: gRPC's details where it is (or wraps) a gRPC error."""
    for candidate in (err, err.__cause__, err.__context__):
        details = getattr(candidate, "details", None)
        if callable(details):
            with contextlib.suppress(Exception):
                return str(details())
    return str(err)


_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    aetcd_errors.ConnectionFailedError,
    aetcd_errors.ConnectionTimeoutError,
    aetcd_errors.InternalError,
    aetcd_errors.WatchTimeoutError,
    asyncio.TimeoutError,
    ConnectionError,
    OSError,
)
# A CancelledError that this task did not ask for comes from a connection closed under the call.
_CALL_ERRORS: tuple[type[BaseException], ...] = (*_CONNECTION_ERRORS, asyncio.CancelledError)
# Spelled out as one typed tuple: mypy rejects ``except (X, *tuple_var)``.
_WATCH_RETRY_ERRORS: tuple[type[BaseException], ...] = (EtcdUnavailable, *_CONNECTION_ERRORS)
_WATCH_OR_CANCEL_ERRORS: tuple[type[BaseException], ...] = (*_WATCH_RETRY_ERRORS, asyncio.CancelledError)


async def _bounded(awaitable: Awaitable[T], limit_s: float) -> T:
    """Await with a time limit. Not ``asyncio.wait_for``: on Python 3.11 it can swallow a
    cancellation that races with the result, leaving a task that never stops."""
    async with asyncio.timeout(limit_s):
        return await awaitable


def _propagate_cancellation() -> None:
    """Re-raise a cancellation that the gRPC layer turned into an error.

    Cancelling a task during an in-flight call makes grpc.aio end the call with StatusCode.CANCELLED,
    which the client maps to a connection error. Treating that as "etcd unavailable" would swallow
    the cancellation (a retry loop would run on forever during shutdown), so check the task first.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError()


def parse_endpoints(text: str | Sequence[str]) -> list[tuple[str, int]]:
    """Parse ``etcd://h:p,h:p``, ``http://h:p``, ``https://h:p`` or ``h:p`` lists into (host, port)
    pairs. Whether TLS is used is :class:`Store`'s business (``https://`` asks for it)."""
    items = text.split(",") if isinstance(text, str) else list(text)
    endpoints: list[tuple[str, int]] = []
    for item in items:
        raw = item.strip()
        if not raw:
            continue
        for scheme in ("etcd://", "http://", "https://"):
            if raw.lower().startswith(scheme):
                raw = raw[len(scheme) :]
        raw = raw.rstrip("/")
        host, sep, port = raw.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"invalid etcd endpoint {item.strip()!r}: expected host:port")
        endpoints.append((host.strip("[]"), int(port)))
    if not endpoints:
        raise ConfigError("no etcd endpoint given (--etcd or RECOVERD_ETCD)")
    return endpoints


@dataclass(frozen=True, slots=True)
class KV:
    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A consistent read of a range: every value as of ``revision``."""

    revision: int
    kvs: list[KV]


# ------------------------------------------------------------------ transactions


@dataclass(frozen=True, slots=True)
class ValueIs:
    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class Absent:
    key: str


@dataclass(frozen=True, slots=True)
class ModRevisionAtMost:
    """Nothing in ``key`` (or, with ``is_prefix``, in the whole range) changed after ``revision``."""

    key: str
    revision: int
    is_prefix: bool = False


Compare = ValueIs | Absent | ModRevisionAtMost


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease: int | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


@dataclass(frozen=True, slots=True)
class DeletePrefix:
    prefix: str


Op = Put | Delete | DeletePrefix


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int


# ------------------------------------------------------------------ watches


@dataclass(frozen=True, slots=True)
class WatchEvent:
    key: str
    value: bytes
    mod_revision: int
    is_delete: bool
    #: The lease the key is attached to (0: none); a delete carries none.
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Resync:
    """The watch reconnected or skipped compacted history: re-read the state once."""

    reason: str


def op_size(op: Op) -> int:
    """About what ``op`` adds to a request, in bytes (key, value and framing)."""
    if isinstance(op, Put):
        return len(_raw(op.key)) + len(op.value) + 32
    if isinstance(op, Delete):
        return len(_raw(op.key)) + 16
    return 2 * len(_raw(op.prefix)) + 16


class _Compacted(Exception):
    """A paged read's revision was compacted between pages (internal: the read starts again)."""


_UNAVAILABLE_CODES = frozenset(
    {
        aetcd.rpc.StatusCode.UNAVAILABLE,
        aetcd.rpc.StatusCode.DEADLINE_EXCEEDED,
        aetcd.rpc.StatusCode.CANCELLED,
        aetcd.rpc.StatusCode.UNKNOWN,
        aetcd.rpc.StatusCode.INTERNAL,
        aetcd.rpc.StatusCode.ABORTED,
    }
)
_TOO_LARGE_HINTS = ("too many operations", "too large", "larger than max", "exhausted", "message length")


def _refusal(name: str, detail: str) -> EtcdRefused:
    """The typed error for a request etcd refused; :class:`RequestTooLarge` when it was its size."""
    text = f"etcd refused {name}: {detail}"
    if any(hint in detail.lower() for hint in _TOO_LARGE_HINTS):
        return RequestTooLarge(text)
    return EtcdRefused(text)


def _prefix_end(prefix: bytes) -> bytes:
    as_list = bytearray(prefix)
    for i in reversed(range(len(as_list))):
        if as_list[i] < 0xFF:
            as_list[i] += 1
            return bytes(as_list[: i + 1])
    return b"\0"


def _timed(op: str | None = None) -> Callable[[Callable[..., Awaitable[T]]], Callable[..., Awaitable[T]]]:
    """Time an etcd request (``recoverd_etcd_request_seconds``) and count its failures by kind;
    ``op`` None: the method's first argument names the operation."""

    def wrap(method: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        @functools.wraps(method)
        async def timed(self: Any, *args: Any, **kwargs: Any) -> T:
            name = op or str(args[0])
            started = time.perf_counter()
            token = object()
            self._in_flight[token] = time.monotonic()
            try:
                result = await method(self, *args, **kwargs)
                self._up.set()
                return result
            except EtcdAccessDenied:
                metrics.ETCD_ERRORS.labels(name, "denied").inc()
                raise
            except EtcdUnavailable:
                metrics.ETCD_ERRORS.labels(name, "unavailable").inc()
                raise
            except EtcdRefused:
                metrics.ETCD_ERRORS.labels(name, "refused").inc()
                raise
            finally:
                del self._in_flight[token]
                metrics.ETCD_SECONDS.labels(name).observe(time.perf_counter() - started)

        return timed

    return wrap


class _State(Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


class Store:
    """An etcd connection with resuming watches, kept leases and typed transactions.

    Use as ``async with Store(endpoints) as store:``. One per process (see the module docstring).
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        connect_timeout_s: float = 5.0,
        op_timeout_s: float = 5.0,
        watch_retry_s: float = 0.05,
        watch_retry_max_s: float = 1.0,
        security: EtcdSecurity | None = None,
        warn_version: bool = True,
        probe_interval_s: float = PROBE_INTERVAL_S,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        self.endpoints = parse_endpoints(endpoints)
        #: Warn when the server runs a release with a known data-loss bug; off for the throwaway
        #: etcd `recoverd run` starts itself (its summary line says it once).
        self.warn_version = warn_version
        #: TLS and credentials; by default the environment's (``RECOVERD_ETCD_*``, else ``ETCDCTL_*``):
        #: that is how a rank's client connects as its agent does (docs/security.md).
        self.security = (security or etcd_security.from_env()).check()
        text = endpoints if isinstance(endpoints, str) else ",".join(endpoints)
        scheme = etcd_security.endpoint_scheme(text)
        if scheme == "http" and self.security.tls:
            raise ConfigError(
                f"etcd endpoint {text!r} is http:// (plaintext) but TLS files were given"
                f" ({self.security.describe()}): write the endpoint as https://HOST:PORT"
            )
        self.tls = scheme == "https" or self.security.tls
        if self.tls:
            self.security.require_ca(text)
        self.connect_timeout_s = connect_timeout_s
        self.op_timeout_s = op_timeout_s
        self.watch_retry_s = watch_retry_s
        self.watch_retry_max_s = watch_retry_max_s
        self.probe_interval_s = probe_interval_s
        self.probe_timeout_s = probe_timeout_s
        # A random member first: every service starting on the first one would put the whole
        # control plane behind one member (and one stall of it would stall them all).
        self._current = random.randrange(len(self.endpoints))
        self._watchdog_task: asyncio.Task[None] | None = None
        #: Endpoint index -> monotonic time until which a failover passes it by (it did not answer).
        self._avoid_until: dict[int, float] = {}
        #: Start times (monotonic) of the calls in flight, by call: a leader change retires the
        #: connection only when one may be waiting on a proposal the dead leader lost.
        self._in_flight: dict[object, float] = {}
        #: Members left by the watchdog (stalled, leaderless, leader changed under calls): for tests,
        #: logs and benches.
        self.stalls_detected = 0
        self.page_keys = PAGE_KEYS
        #: The server release of the current connection ("" until read).
        self.server_version = ""
        self._client: Any = None
        self._version_task: asyncio.Task[None] | None = None
        #: (asked, granted) lease TTL last warned about (a raised TTL is said once per store).
        self._warned_ttl: tuple[int, int] | None = None
        #: Dropped connections, closed once the calls still in flight on them had their time.
        self._retiring: set[asyncio.Task[None]] = set()
        #: Leases judged lost that may still be alive (an etcd restart re-arms them): revoked before
        #: the next grant, so their keys do not outlive the owner's giving up on them.
        self._abandoned: set[int] = set()
        #: Set by every call that succeeds, cleared when a connection is dropped: a retry waiting
        #: in :meth:`wait_retry` goes as soon as etcd answers anyone again.
        self._up = asyncio.Event()
        self._state = _State.UNOPENED

    @property
    def endpoint(self) -> str:
        host, port = self.endpoints[self._current]
        return f"{host}:{port}"

    async def __aenter__(self) -> Store:
        if self._state is not _State.UNOPENED:
            raise RuntimeError(f"Store cannot be entered twice (state: {self._state.value})")
        self._state = _State.OPEN
        if len(self.endpoints) > 1 and self.probe_interval_s > 0:
            # With one endpoint there is nowhere to go: a hung etcd is waited out as before.
            self._watchdog_task = asyncio.create_task(self._watchdog(), name="etcd-watchdog")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection; idempotent."""
        self._state = _State.CLOSED
        self._stop_version_check()
        watchdog, self._watchdog_task = self._watchdog_task, None
        if watchdog is not None:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
        for task in list(self._retiring):
            task.cancel()  # closes its client at once (its finally)
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await _bounded(client.close(), limit_s=self.connect_timeout_s)

    # ---------------------------------------------------------------- connection
    async def _get_client(self) -> Any:
        if self._state is _State.CLOSED:
            raise EtcdUnavailable("store is closed")
        if self._client is None:
            host, port = self.endpoints[self._current]
            # A private subchannel pool: gRPC otherwise shares one connection per target across
            # channels, so after an etcd outage a "fresh" client inherits the dead connection's
            # reconnect backoff (1 s growing to 120 s) and fails fast although etcd is back.
            try:
                # Read at every connection: a rotated certificate or password file is picked up.
                password = self.security.read_password() if self.security.user else None
                credentials = self.security.channel_credentials() if self.tls else None
            except ConfigError as err:  # checked at startup; gone since: retry, never crash a service
                raise EtcdAccessDenied(f"etcd at {host}:{port}: {err.detail}") from err
            client = EtcdClient(
                host=host,
                port=port,
                username=self.security.user,
                password=password,
                timeout=self.op_timeout_s,
                options={"grpc.use_local_subchannel_pool": 1},
                credentials=credentials,
            )
            try:
                await _bounded(client.connect(), limit_s=self.connect_timeout_s)
            except _CONNECTION_ERRORS as err:
                _propagate_cancellation()
                raise self._unreachable(f"cannot connect to etcd at {host}:{port}", err) from err
            except aetcd_errors.ClientError as err:
                _propagate_cancellation()
                raise self._unreachable(f"cannot authenticate to etcd at {host}:{port}", err) from err
            self._client = client
            # In the background: the version is advice and must not delay (or fail) the first call.
            self._version_task = asyncio.create_task(self._check_version(client), name="etcd-version")
        return self._client

    def _unreachable(self, what: str, err: BaseException) -> EtcdUnavailable:
        """EtcdAccessDenied when ``err`` says the credentials failed (a clear message naming the
        endpoint and what to check), else EtcdUnavailable."""
        detail = _detail(err)
        problem = access_problem(detail)
        if problem == "tls":
            return EtcdAccessDenied(f"{what}: {tls_hint(detail, self.security)} ({detail.strip()[:240]})")
        if problem == "auth":
            return EtcdAccessDenied(
                f"{what}: etcd refused the credentials of user {self.security.user!r}: {detail.strip()[:200]}"
            )
        # One line in the error's own words (gRPC's repr is a five-line dump an operator must decode).
        words = " ".join(detail.split())[:300] or "no answer in time"
        return EtcdUnavailable(f"{what}: {type(err).__name__}: {words}")

    async def verify(self) -> None:
        """Connect and make one call: raise EtcdAccessDenied when TLS or authentication fails (an
        entry point's setup check: exit 2 before anything is written). An etcd that is merely not
        up yet is not an error here: the services wait for it."""
        try:
            await self._status()
        except EtcdAccessDenied:
            raise
        except EtcdUnavailable as err:
            log.warning("etcd is not reachable yet (%s); waiting for it", err)
            return

    def _stop_version_check(self) -> None:
        task, self._version_task = self._version_task, None
        if task is not None and not task.done():
            task.cancel()

    async def _check_version(self, client: Any) -> None:
        """Warn (once per connection) when the server runs a release with a known data-loss bug."""
        try:
            status = await _bounded(
                client.maintenancestub.Status(
                    aetcd.rpc.StatusRequest(), timeout=self.op_timeout_s, metadata=client.metadata
                ),
                limit_s=self.op_timeout_s,
            )
        except Exception as err:  # the version is advice: never fail a connection over it
            log.debug("cannot read the etcd version at %s: %r", self.endpoint, err)
            return
        self.server_version = str(status.version)
        problem = known_problem(self.server_version)
        if problem is not None and self.warn_version:
            log.warning(
                "etcd at %s runs %s, a release that %s; use 3.4.22+ or 3.5.6+ in production",
                self.endpoint,
                self.server_version,
                problem,
            )

    async def _failover(self, failed: Any = None, *, at_once: bool = False, avoid: bool = False) -> None:
        """Drop the connection ``failed`` (the current one when None) and move to the next endpoint.

        Only the connection that failed is dropped: when several tasks saw it fail, the first one
        replaces it and the others find a new one already there. The dropped client is closed only
        after ``op_timeout_s``: closing it at once would cancel every other task's call in flight on
        it (grpc.aio raises CancelledError there, although nobody cancelled those tasks). With
        ``at_once`` (the watchdog found the member hung) it is closed now, on purpose: the calls in
        flight on it would only wait out their timeout, and a watch on a hung member never errors;
        closed, each call raises EtcdUnavailable and each watch resumes on the next member. With
        ``avoid`` (it did not answer) the member is passed by for :data:`AVOID_HUNG_S` while another
        one is there: a failover for any other reason must not land on it again at once.
        """
        client = self._client
        if client is None or (failed is not None and client is not failed):
            return
        self._stop_version_check()
        self._client = None
        self._up.clear()
        if len(self.endpoints) > 1:
            if avoid:
                self._avoid_until[self._current] = time.monotonic() + AVOID_HUNG_S
            now = time.monotonic()
            count = len(self.endpoints)
            candidates = [(self._current + step) % count for step in range(1, count)]
            fresh = [i for i in candidates if self._avoid_until.get(i, 0.0) <= now]
            self._current = (fresh or candidates)[0]
        if at_once:
            # The cluster is in trouble (a hung member, or a leader change under calls in flight):
            # the connections still retiring from earlier failovers are closed now too. A call a
            # follower forwarded to a dead leader waits there for good, on whichever connection it
            # was sent (a leader kill: the first failover, on etcd's "leader changed", retires the
            # follower's connection with the lost proposal still in flight for op_timeout_s).
            for retiring in list(self._retiring):
                retiring.cancel()
        task = asyncio.get_running_loop().create_task(
            self._close_later(client, 0.0 if at_once else self.op_timeout_s), name="etcd-retire"
        )
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _watchdog(self) -> None:
        """Leave a member that stalls, has no leader, or changed leader under calls in flight.

        Why a probe: a hung member (SIGSTOPped, a stuck disk, a half-open connection) accepts
        connections and requests and answers nothing, so a call fails only at ``op_timeout_s`` and a
        watch never fails at all: every task of the process would wait on it. etcd's Status is served
        by the member itself (no consensus, no permission), in milliseconds when it is healthy.
        Runs while the store is open, with more than one endpoint; never raises but cancellation.
        """
        # The last leader any member named (0: none yet), across connections: a store that has just
        # moved off the dead leader's member must still see the new leader as a change, or a call
        # the new member forwarded to the dead one waits out its whole timeout.
        last_leader = 0
        # A member said "no leader" since the last leader was named: an election, during which a
        # proposal a follower forwarded may have been lost (even with no leader named before it).
        election_seen = False
        leaderless_since: tuple[Any, float] | None = None  # (connection, when it first said "none")
        while True:
            await asyncio.sleep(self.probe_interval_s)
            client = self._client
            if client is None:  # nobody connected since the last failover: nothing to judge
                continue
            sent = time.monotonic()
            try:
                status = await _bounded(
                    client.maintenancestub.Status(
                        aetcd.rpc.StatusRequest(), timeout=self.probe_timeout_s, metadata=client.metadata
                    ),
                    limit_s=self.probe_timeout_s,
                )
            except aetcd.rpc.AioRpcError as err:
                if err.code() not in _UNAVAILABLE_CODES or is_stale_token(err.details() or ""):
                    continue  # not the member's health: the calls sort it out
                hung = True
                problem = f"did not answer a status probe within {self.probe_timeout_s:g}s ({err.code().name})"
            except _CONNECTION_ERRORS as err:  # asyncio.TimeoutError included
                hung = True
                problem = f"did not answer a status probe within {self.probe_timeout_s:g}s ({type(err).__name__})"
            except asyncio.CancelledError:
                _propagate_cancellation()  # the store is closing
                continue  # the connection was closed under the probe: a failover already happened
            else:
                leader = int(status.leader)
                hung = False
                previous, after_election = last_leader, election_seen
                if leader:
                    last_leader, leaderless_since, election_seen = leader, None, False
                if leader == 0:
                    election_seen = True
                    if leaderless_since is None or leaderless_since[0] is not client:
                        leaderless_since = (client, sent)
                    if sent - leaderless_since[1] <= LEADERLESS_S:
                        continue  # an election, most likely: every member is leaderless for it
                    problem = f"has had no leader for over {LEADERLESS_S:g}s"
                elif previous == leader or (previous == 0 and not after_election):
                    continue  # no change, or the first leader this store has seen
                elif any(started < sent for started in self._in_flight.values()):
                    # A request a follower forwarded to the old leader is lost; etcd would answer it
                    # only at its own request timeout. Failed now, its caller retries at once.
                    problem = f"changed leader ({previous:x} -> {leader:x}) with calls in flight"
                else:
                    continue
            if self._client is not client:
                continue
            dropped = self.endpoint
            self.stalls_detected += 1
            metrics.ETCD_ERRORS.labels("probe", "unavailable").inc()
            await self._failover(client, at_once=True, avoid=hung)
            log.warning("etcd member %s %s: leaving it for %s", dropped, problem, self.endpoint)

    async def wait_retry(self, delay_s: float) -> None:
        """Wait before retrying after a failure: ``delay_s``, or less, until a call of this store
        succeeds again (etcd is back: a lease keep-alive retried every 50 ms sees it first)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay_s):
                await self._up.wait()

    async def _close_later(self, client: Any, delay_s: float) -> None:
        try:
            await asyncio.sleep(delay_s)
        finally:
            with contextlib.suppress(Exception):
                await _bounded(client.close(), limit_s=1.0)

    @_timed()
    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        client = await self._get_client()
        try:
            return await _bounded(getattr(client, name)(*args, **kwargs), limit_s=self.op_timeout_s)
        except _CALL_ERRORS as err:
            _propagate_cancellation()  # a cancellation of this task: re-raised; any other: the connection
            await self._failover(client)
            raise self._unreachable(f"etcd {name} failed at {self.endpoint}", err) from err
        except aetcd_errors.ClientError as err:
            _propagate_cancellation()
            if is_stale_token(str(err)):
                await self._failover(client)  # the next connection authenticates again
                raise EtcdUnavailable(f"etcd {name} at {self.endpoint}: the auth token expired") from err
            raise self._refused(name, str(err), args[0] if args else None) from err

    async def _rpc_error(self, name: str, err: Any, client: Any, key: Any = None) -> EtcdUnavailable | EtcdRefused:
        """Sort a gRPC error: etcd not answering (fail over, retry later) or refusing this request."""
        code = err.code()
        details = err.details() or ""
        if code in _UNAVAILABLE_CODES or is_stale_token(details):
            await self._failover(client)
            return self._unreachable(f"etcd {name} failed at {self.endpoint}", err)
        refusal = self._refused(name, f"{code.name} {details}", key)
        log.error("etcd refused a %s request: %s", name, refusal.detail)
        return refusal

    def _refused(self, name: str, detail: str, key: Any = None) -> EtcdRefused:
        if "permission denied" in detail.lower():
            who = f"user {self.security.user!r}" if self.security.user else "this client's certificate or user"
            what = ""
            if isinstance(key, bytes | str):
                what = f" of {printable(key if isinstance(key, str) else _text(key))}"
            return PermissionDenied(
                f"etcd refused {name}{what}: permission denied: {who} has no role that grants it"
                " (docs/security.md: each job's agent and client may use only that job's keys)"
            )
        return _refusal(name, detail)

    # ---------------------------------------------------------------- reads
    async def get(self, key: str) -> KV | None:
        result = await self._call("get", _raw(key))
        if result is None:
            return None
        return KV(key, result.value, result.mod_revision, result.create_revision, result.lease)

    async def read(self, key: str, *, revision: int = 0) -> Snapshot:
        """Exactly ``key`` (zero or one KV) with the revision it was read at: absent as of then.

        ``revision``: read as of that revision (several reads then form one consistent snapshot).
        """
        start = _raw(key)
        return await self._read_at(start, start + b"\0", revision, key)

    async def get_prefix(self, prefix: str, *, keys_only: bool = False, revision: int = 0) -> Snapshot:
        """Every key under ``prefix`` at one revision (sorted by key); ``keys_only`` leaves values empty.

        Read in pages of at most ``page_keys`` keys, every page at the first page's revision, so the
        result is one consistent snapshot of any size while no single answer exceeds the client's
        4 MiB (a page that would is halved and read again). If that revision is compacted away
        between pages the whole read starts again at a fresh revision.
        """
        start = _raw(prefix)
        end = _prefix_end(start)
        if revision:
            return await self._read_at(start, end, revision, prefix, keys_only)
        for _ in range(_COMPACTED_RETRIES):
            try:
                return await self._read_range(start, end, keys_only)
            except _Compacted:
                continue
        raise EtcdUnavailable(f"reading {printable(prefix)}: history compacted under every attempt")

    async def _read_at(self, start: bytes, end: bytes, revision: int, what: str, keys_only: bool = False) -> Snapshot:
        try:
            return await self._read_range(start, end, keys_only, revision)
        except _Compacted:
            raise ReadCompacted(f"reading {printable(what)} at revision {revision}: compacted since") from None

    async def _read_range(self, start: bytes, end: bytes, keys_only: bool, revision: int = 0) -> Snapshot:
        kvs: list[KV] = []
        key = start
        while True:
            response = await self._range_page(key, end, revision, keys_only)
            if revision == 0:
                revision = int(response.header.revision)
            kvs.extend(
                KV(_text(kv.key), kv.value, kv.mod_revision, kv.create_revision, kv.lease) for kv in response.kvs
            )
            if not response.more or not response.kvs:
                return Snapshot(revision, kvs)
            key = response.kvs[-1].key + b"\0"

    @_timed("range")
    async def _range_page(self, key: bytes, end: bytes, revision: int, keys_only: bool) -> Any:
        """One page of a range read; shrinks ``page_keys`` while the answer is too large."""
        client = await self._get_client()
        while True:
            request = aetcd.rpc.RangeRequest(
                key=key,
                range_end=end,
                limit=self.page_keys,
                revision=revision,
                sort_order=aetcd.rpc.RangeRequest.ASCEND,
                sort_target=aetcd.rpc.RangeRequest.KEY,
                keys_only=keys_only,
            )
            try:
                return await _bounded(
                    client.kvstub.Range(request, timeout=self.op_timeout_s, metadata=client.metadata),
                    limit_s=self.op_timeout_s,
                )
            except aetcd.rpc.AioRpcError as err:
                _propagate_cancellation()
                code = err.code()
                if code == aetcd.rpc.StatusCode.RESOURCE_EXHAUSTED and self.page_keys > 1:
                    self.page_keys = max(1, self.page_keys // 2)
                    log.info("range read over the response limit; reading %d keys per page", self.page_keys)
                    continue
                if code == aetcd.rpc.StatusCode.OUT_OF_RANGE and "compacted" in (err.details() or ""):
                    raise _Compacted() from err
                raise await self._rpc_error("range", err, client, key) from err
            except _CALL_ERRORS as err:
                _propagate_cancellation()
                await self._failover(client)
                raise EtcdUnavailable(f"etcd range failed at {self.endpoint}: {err!r}") from err

    async def revision(self) -> int:
        """The store's current revision (for starting a watch after a read).

        From etcd's Status call, which needs no permission on any key (a job's user may read only
        its job's keys). It is the connected member's revision: never ahead of what a later read
        sees, so a watch started after it misses nothing."""
        return int((await self._status()).header.revision)

    async def auth_rpc(self, method: str, request: Any) -> Any:
        """One call of etcd's Auth service (user and role administration: :mod:`recoverd.etcd_admin`)."""

        def call(client: Any) -> Any:
            stub = client.auth_stub or aetcd.rpc.AuthStub(client.channel)
            return getattr(stub, method)(request, timeout=self.op_timeout_s, metadata=client.metadata)

        return await self._unary(method, call)

    async def status(self) -> Any:
        """The connected member's own Status (version, leader, revision): answered by the member,
        no consensus, no permission needed."""
        return await self._status()

    async def _status(self) -> Any:
        return await self._unary(
            "status",
            lambda client: client.maintenancestub.Status(
                aetcd.rpc.StatusRequest(), timeout=self.op_timeout_s, metadata=client.metadata
            ),
        )

    @_timed()
    async def _unary(self, name: str, call: Callable[[Any], Awaitable[Any]]) -> Any:
        """One unary gRPC call on the current connection, its errors sorted as every call's are."""
        client = await self._get_client()
        try:
            return await _bounded(call(client), limit_s=self.op_timeout_s)
        except aetcd.rpc.AioRpcError as err:
            _propagate_cancellation()
            raise await self._rpc_error(name, err, client) from err
        except _CALL_ERRORS as err:
            _propagate_cancellation()
            await self._failover(client)
            raise self._unreachable(f"etcd {name} failed at {self.endpoint}", err) from err

    # ---------------------------------------------------------------- writes
    async def put(self, key: str, value: bytes, *, lease: int | None = None) -> int:
        size = op_size(Put(key, value, lease))
        if size > MAX_REQUEST_BYTES:
            raise RequestTooLarge(f"put of {printable(key)}: {size} bytes is over etcd's {MAX_REQUEST_BYTES}")
        result = await self._call("put", _raw(key), value, lease=lease)
        return int(result.header.revision)

    async def delete(self, key: str) -> bool:
        result = await self._call("delete", _raw(key))
        return result is not None and bool(getattr(result, "deleted", 0))

    async def delete_prefix(self, prefix: str) -> int:
        result = await self._call("delete_prefix", _raw(prefix))
        return int(getattr(result, "deleted", 0))

    @_timed("txn")
    async def txn(self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        """Apply ``success`` atomically if every compare holds, else ``failure``.

        Raises :class:`RequestTooLarge` without sending when a branch has more than
        :data:`MAX_TXN_OPS` operations, there are more compares than that, or the request is over
        :data:`MAX_REQUEST_BYTES`: callers split their work (docs/adr/0019), etcd would refuse it.
        """
        if max(len(compares), len(success), len(failure)) > MAX_TXN_OPS:
            raise RequestTooLarge(
                f"transaction of {len(compares)} compares, {len(success)}/{len(failure)} operations:"
                f" etcd allows {MAX_TXN_OPS}"
            )
        client = await self._get_client()
        tx = client.transactions
        built: list[Any] = []
        for cmp in compares:
            if isinstance(cmp, ValueIs):
                built.append(tx.value(_raw(cmp.key)) == cmp.value)
            elif isinstance(cmp, Absent):
                built.append(tx.create(_raw(cmp.key)) == 0)
            else:
                key = _raw(cmp.key)
                mod = tx.mod(key, _prefix_end(key)) if cmp.is_prefix else tx.mod(key)
                built.append(mod < cmp.revision + 1)

        def ops(items: Sequence[Op]) -> list[Any]:
            out: list[Any] = []
            for op in items:
                if isinstance(op, Put):
                    out.append(tx.put(_raw(op.key), op.value, lease=op.lease))
                elif isinstance(op, Delete):
                    out.append(tx.delete(_raw(op.key)))
                else:
                    key = _raw(op.prefix)
                    out.append(tx.delete(key, _prefix_end(key)))
            return out

        request = aetcd.rpc.TxnRequest(
            compare=[c.build_message() for c in built],
            success=client._ops_to_requests(ops(success)),
            failure=client._ops_to_requests(ops(failure)),
        )
        size = request.ByteSize()
        if size > MAX_REQUEST_BYTES:
            raise RequestTooLarge(f"transaction of {size} bytes: etcd allows {MAX_REQUEST_BYTES}")
        try:
            response = await _bounded(
                client.kvstub.Txn(request, timeout=self.op_timeout_s, metadata=client.metadata),
                limit_s=self.op_timeout_s,
            )
        except aetcd.rpc.AioRpcError as err:
            _propagate_cancellation()
            raise await self._rpc_error("txn", err, client) from err
        except _CALL_ERRORS as err:
            _propagate_cancellation()
            await self._failover(client)
            raise EtcdUnavailable(f"etcd txn failed at {self.endpoint}: {err!r}") from err
        return TxnResult(bool(response.succeeded), int(response.header.revision))

    async def create(self, key: str, value: bytes, *, lease: int | None = None) -> bool:
        """Put ``key`` only if it does not exist; True if this call created it."""
        return (await self.txn([Absent(key)], [Put(key, value, lease)])).succeeded

    # ---------------------------------------------------------------- leases
    def lease(self, ttl_s: float) -> LeaseKeeper:
        return LeaseKeeper(self, ttl_s)

    async def _grant(self, ttl: int) -> int:
        return (await self._grant_ttl(ttl))[0]

    async def _grant_ttl(self, ttl: int) -> tuple[int, int]:
        """Grant a lease; (its id, the TTL etcd granted: at least its minimum, 1.5 x its election timeout)."""
        lease = await self._call("lease", ttl)
        return int(lease.id), int(lease.ttl)

    async def _refresh(self, lease_id: int) -> int:
        reply = await self._call("refresh_lease", lease_id)
        return int(reply.TTL) if reply is not None else 0

    async def _revoke(self, lease_id: int) -> None:
        await self._call("revoke_lease", lease_id)

    async def _revoke_abandoned(self) -> None:
        """Revoke leases this store's owners gave up as lost (see :meth:`LeaseKeeper.aclose`);
        best effort: one still unreachable is tried again before the next grant."""
        for lease_id in sorted(self._abandoned):
            try:
                await _bounded(self._revoke(lease_id), limit_s=self.op_timeout_s)
            except EtcdRefused:  # "lease not found": it did expire after all
                pass
            except (EtcdUnavailable, TimeoutError):
                return
            self._abandoned.discard(lease_id)

    # ---------------------------------------------------------------- watches
    def watch_key(self, key: str, start_revision: int) -> AsyncIterator[WatchEvent | Resync]:
        """Every change of exactly ``key``; otherwise as :meth:`watch_prefix`."""
        return self.watch_prefix(key, start_revision, exact=True)

    async def watch_prefix(
        self, prefix: str, start_revision: int, *, exact: bool = False
    ) -> AsyncIterator[WatchEvent | Resync]:
        """Every change under ``prefix`` (or of exactly that key, with ``exact``) from
        ``start_revision`` on, in order, exactly once.

        Survives etcd restarts and lost connections (resumes from the last ``mod_revision + 1``);
        after compaction it continues from the compaction point. Either way it yields one
        :class:`Resync` as soon as the new watch is live: a re-read then reaches a live etcd, and
        anything written after that read arrives through the watch. Nothing is yielded while etcd is
        down (no flood of re-reads against a dead server). Runs until cancelled.
        """
        next_rev = start_revision
        delay = self.watch_retry_s
        key = _raw(prefix)
        resync: str | None = None  # reason for the Resync owed once the watch is live again
        skip_to_now = False
        while True:
            watch = None
            client = None
            try:
                client = await self._get_client()
                if skip_to_now:
                    next_rev, skip_to_now = await self.revision() + 1, False
                # Re-creating a lost watch gets a short bound: a creation started while etcd was down
                # can wait on a dead stream for its whole timeout after etcd is back (measured: an
                # agent deaf for 3.5 s after an etcd restart). A healthy creation takes milliseconds.
                watch = await _bounded(
                    client.watch(key, range_end=None if exact else _prefix_end(key), start_revision=next_rev),
                    limit_s=self.op_timeout_s if resync is None else min(self.op_timeout_s, WATCH_RECREATE_S),
                )
                # aetcd waits for the watch to be created with asyncio.wait_for, which on 3.11 can
                # swallow a cancellation that races with the answer (ADR 0008): the task would then
                # wait on this watch forever. A swallowed cancel still counts in cancelling().
                _propagate_cancellation()
                delay = self.watch_retry_s
                if resync is not None:
                    reason, resync = resync, None
                    metrics.WATCH_RESYNCS.labels("compacted" if "compact" in reason else "reconnect").inc()
                    yield Resync(reason)
                async for event in watch:
                    kv = event.kv
                    next_rev = kv.mod_revision + 1
                    yield WatchEvent(
                        _text(kv.key),
                        kv.value,
                        kv.mod_revision,
                        event.kind == aetcd.rtypes.EventKind.DELETE,
                        kv.lease,
                    )
                # The iterator ended without an error: the stream was shut down under us.
                raise aetcd_errors.ConnectionFailedError("watch stream ended")
            except aetcd_errors.RevisionCompactedError as err:
                log.warning("watch on %s: history compacted below %s; resyncing", prefix, err.compacted_revision)
                next_rev = err.compacted_revision
                resync = "compacted"
            except _WATCH_OR_CANCEL_ERRORS as err:
                _propagate_cancellation()  # this task's own cancellation; any other: a lost stream
                log.info("watch on %s lost (%r); retrying within %.2fs", prefix, err, delay)
                await self._failover(client)
                # At least the first delay (a watch failing on its own never spins), then until
                # etcd answers any call again, at most the backed-off delay.
                await asyncio.sleep(self.watch_retry_s)
                await self.wait_retry(max(0.0, delay - self.watch_retry_s))
                delay = min(delay * 2, self.watch_retry_max_s)
                resync = resync or "reconnected"  # a pending "compacted" says more; keep it
            except aetcd_errors.ClientError as err:  # after its subclasses above: only the plain one
                if "larger than max" not in str(err):
                    raise
                # The events from next_rev on came as one answer over gRPC's 4 MiB limit (etcd
                # batches a catch-up): asking again gets the same answer. Skip to now and resync:
                # level-triggered readers re-read the state (paged reads), so nothing is lost.
                log.warning(
                    "watch on %s: events after revision %d exceed the message limit; resyncing", prefix, next_rev
                )
                skip_to_now = True
                resync = "oversized"
            finally:
                if watch is not None:
                    with contextlib.suppress(Exception):
                        await _bounded(watch.cancel(), limit_s=0.5)


def check_lease_ttl(ttl_s: float) -> int:
    """A lease TTL as etcd takes it: whole seconds, at least 1. Anything else is refused with the
    reason (it used to be rounded silently: 0.5 s became 1 s, which etcd may raise again)."""
    whole = round(ttl_s)
    if ttl_s < 1 or abs(ttl_s - whole) > 1e-9:
        raise ConfigError(f"lease TTL {ttl_s:g} s: etcd grants whole seconds, at least 1 (e.g. 1, 2, 5)")
    return int(whole)


class LeaseKeeper:
    """Grants a lease and keeps it alive; ``lost`` is set once it has certainly expired.

    ``async with store.lease(ttl_s) as lease:`` grants on entry, keeps it alive in a task, and
    revokes on exit (best effort). Once more than the TTL has passed since the last confirmed
    keep-alive, or etcd answers TTL 0, the lease is lost and the owner must register again with a
    new one.

    The keep-alive policy (docs/adr/0025) trades how soon a dead owner is noticed against how long a
    live one may stall: a keep-alive is sent :data:`KEEPALIVE_FRACTION` of the TTL after the last
    confirmed one was sent, so a dead owner's lease runs out ``TTL - interval/2`` after its death on
    average, and a live one may stall ``TTL - interval`` before its lease is at risk. Inside that
    margin nothing is left to a timer: a keep-alive that fails is sent again after
    :data:`KEEPALIVE_RETRY_S`, and one not answered within a quarter of the interval gets another
    beside it (at most :data:`KEEPALIVE_IN_FLIGHT`), until one is confirmed or the lease has run out.
    """

    def __init__(self, store: Store, ttl_s: float) -> None:
        self.store = store
        self.ttl = check_lease_ttl(ttl_s)
        self.id = 0
        self.lost = asyncio.Event()
        #: Keep-alives confirmed, and sent again because one was late or failed (for logs and benches).
        self.renewals = 0
        self.resends = 0
        #: The least time a confirmed keep-alive left before the lease could have run out (seconds).
        self.min_margin_s = float(self.ttl)
        self._granted = (0.0, 0.0)
        self._task: asyncio.Task[None] | None = None

    @property
    def interval_s(self) -> float:
        """Seconds from sending one confirmed keep-alive to sending the next."""
        return self.ttl * KEEPALIVE_FRACTION

    async def __aenter__(self) -> LeaseKeeper:
        await self.store._revoke_abandoned()
        asked = time.monotonic()
        self.id, granted = await self.store._grant_ttl(self.ttl)
        self._granted = (asked, time.monotonic())
        if self.store._abandoned:
            # etcd did not answer the revoke in time (it was restarting: under load that outlasts
            # one op timeout) but has answered the grant: revoke now, before the lease is handed
            # out, so a given-up lease's keys (a leader key) never outlive the new lease's start.
            await self.store._revoke_abandoned()
        if granted != self.ttl:
            # etcd raises a TTL below its minimum (1.5 x its election timeout): liveness is then
            # judged by what was granted, and said once, never silently.
            if self.store._warned_ttl != (self.ttl, granted):
                self.store._warned_ttl = (self.ttl, granted)
                log.warning(
                    "etcd at %s granted a %d s lease for the %d s asked (its minimum lease TTL is 1.5 x its"
                    " election timeout): a loss is noticed after %d s",
                    self.store.endpoint,
                    granted,
                    self.ttl,
                    granted,
                )
            self.ttl = granted
        self._task = asyncio.create_task(self._keep_alive(), name=f"lease-{self.id:x}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, *, revoke: bool = True) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if revoke and self.id and not self.lost.is_set():
            with contextlib.suppress(Exception):
                await _bounded(self.store._revoke(self.id), limit_s=1.0)
        elif revoke and self.id:
            # Judged lost, but an etcd that restarts re-arms every lease with its full TTL: its keys
            # (a leader key, a node record) would block a new campaign or registration for one more
            # TTL. It is ours and given up: revoked before this store's next lease is granted.
            self.store._abandoned.add(self.id)
        self.lost.set()

    async def _keep_alive(self) -> None:
        # (sent, answered) of the last confirmed keep-alive (at first: the grant). etcd renewed the
        # lease between the two, so the next one is due `interval` after `sent` (never later than
        # needed), and the lease has certainly run out `ttl` after `answered` (never declared early).
        sent, answered = self._granted
        while True:
            await asyncio.sleep(max(0.0, sent + self.interval_s - time.monotonic()))
            try:
                renewed = await self._renew(expires_at=answered + self.ttl)
            except Exception:
                # A bug, not etcd: the owner must still learn that nobody keeps its lease alive.
                log.exception("lease %x: keep-alive failed unexpectedly; treating the lease as lost", self.id)
                renewed = None
            if renewed is None:
                self.lost.set()
                return
            margin = sent + self.ttl - renewed[1]
            self.min_margin_s = min(self.min_margin_s, margin)
            if margin < self.ttl / 4:
                log.warning(
                    "lease %x: keep-alive confirmed only %.2fs before the lease could run out (TTL %d s):"
                    " this process or etcd stalls",
                    self.id,
                    margin,
                    self.ttl,
                )
            sent, answered = renewed
            self.renewals += 1

    async def _renew(self, expires_at: float) -> tuple[float, float] | None:
        """Keep-alives until one is confirmed: its (sent, answered) monotonic times; None once the
        lease has run out (etcd answered TTL 0, or nothing was confirmed before ``expires_at``)."""
        attempts: dict[asyncio.Task[int], float] = {}
        next_send = time.monotonic()
        late_s = self.interval_s / 4
        error: BaseException | None = None
        try:
            while True:
                now = time.monotonic()
                if now >= expires_at:
                    log.warning(
                        "lease %x lost: no keep-alive confirmed for more than %ss (%s)",
                        self.id,
                        self.ttl,
                        error if error is not None else "etcd did not answer",
                    )
                    return None
                if now >= next_send and len(attempts) < KEEPALIVE_IN_FLIGHT:
                    if attempts or error is not None:
                        self.resends += 1
                    attempts[asyncio.create_task(self.store._refresh(self.id))] = now
                    next_send = now + late_s
                wake = expires_at if len(attempts) >= KEEPALIVE_IN_FLIGHT else min(expires_at, next_send)
                if not attempts:  # every one failed: the next is sent after the retry pause
                    await asyncio.sleep(max(0.0, wake - now))
                    continue
                done, _ = await asyncio.wait(attempts, timeout=max(0.0, wake - now), return_when=FIRST_COMPLETED)
                for task in done:
                    sent = attempts.pop(task)
                    try:
                        ttl = task.result()
                    except RecoverdError as err:  # unreachable (the store failed over) or refused
                        error = err
                        next_send = min(next_send, time.monotonic() + KEEPALIVE_RETRY_S)
                        continue
                    if ttl <= 0:
                        log.warning("lease %x expired", self.id)
                        return None
                    return sent, time.monotonic()
        finally:
            for task in attempts:
                task.cancel()
            if attempts:
                await asyncio.gather(*attempts, return_exceptions=True)
