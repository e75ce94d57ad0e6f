"""The ``Recover`` servicer: MindCluster's ClusterD RPCs answered with recoverd's client sessions.

Every RPC maps onto the etcd operations of :class:`taskd_client.session.ClientSession`, the same ones
the in-process client library uses (docs/gateway.md has the table):

* ``Init`` reads the job record; ``Register`` creates one session per job id and registers it under
  a lease, so the upstream client is the job's recovery participant exactly as a library client is;
* the report RPCs call ``session.report`` / ``session.report_faults`` and return its ``Outcome``;
* ``SubscribeProcessManageSignal`` streams ``session.signals()`` in MindCluster's wire form, marking
  each one ``session.delivered`` once it is written, plus a keep-alive every interval.

Where ClusterD is unsound it is not copied (reference/mindcluster-contract.md section 12): a new
subscription never resets the recovery, it takes over the stream and gets the signal the recovery
is waiting on again. A client that is gone is noticed: when no subscription stream of a job has been
open for ``client_grace_s`` the job's session is deregistered, so its recoveries fall back to the
node agents instead of waiting on a dead client (ClusterD waits 15 minutes per phase).

Errors come back in ``Status.code`` (contract section 1), never as a gRPC status, except the
upstream one: subscribing to an unregistered job fails with ``jobId=<id> not registed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from recoverd import events
from recoverd.codes import Code
from recoverd.errors import BadRecord, Reason, RecoverdError
from recoverd.keys import Keyspace, RunRef, check_id
from recoverd.mindcluster import recover_pb2 as wire
from recoverd.mindcluster import recover_pb2_grpc
from recoverd.records import decode, pb
from recoverd.store import Store
from taskd_client.session import ClientSession, Outcome
from taskd_client.signals import KEEP_ALIVE, to_wire

from .callers import Allowed, CallerTable, call_identity

__all__ = ["NOT_SUPPORTED", "GatewaySettings", "RecoverService", "not_registered_text"]

log = logging.getLogger(__name__)

#: Status code of the RPCs recoverd does not implement (NIC switching, stress tests). codes.py has no
#: "not supported"; 599 (ServerInnerError) is what ClusterD answers when it cannot serve a call.
NOT_SUPPORTED = Code.SERVER_INNER_ERROR
NOT_SUPPORTED_INFO = "not supported by recoverd"

#: Phases in which a recovery waits on a signal its participants were sent (as the session's own).
_ACTIVE = frozenset(
    {pb.PHASE_COLLECTING, pb.PHASE_STOPPING, pb.PHASE_GLOBAL_FAULT, pb.PHASE_DECIDING, pb.PHASE_RECOVERING}
)


def not_registered_text(job: str) -> str:
    """Upstream's exact error text (misspelling included: clients may match on it)."""
    return f"jobId={job} not registed"


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """What the gateway needs to know; every duration in seconds.

    * ``keepalive_interval_s``: a keep-alive message on every subscription stream this often.
      Upstream clients check their exit flags only when a message arrives, so it must stay short
      (ClusterD: 5 s).
    * ``client_lease_ttl_s``: the lease of each registered session; if the gateway itself dies, its
      clients stop being participants this long after.
    * ``client_grace_s``: a job whose subscription streams have all been closed this long (or that
      registered and never subscribed) is deregistered: its client is taken to be gone.
    * ``call_timeout_s``: the budget of one RPC's etcd work; over it the call answers 599.
    """

    #: Loopback by default: without ``auth_file`` every caller that reaches the port may act on
    #: every job (docs/gateway.md, "Callers").
    listen: str = "127.0.0.1:8899"
    keepalive_interval_s: float = 5.0
    client_lease_ttl_s: float = 5.0
    client_grace_s: float = 10.0
    call_timeout_s: float = 10.0
    shutdown_grace_s: float = 1.0
    #: TLS for the gRPC port (PEM files): certificate and key; with ``tls_client_ca`` clients must
    #: present a certificate that CA signed (mutual TLS). None: plaintext (docs/security.md).
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    #: Who may act on which jobs (``callers.py``); None: every caller (local trust).
    auth_file: str | None = None
    #: Serve every caller on a non-loopback address without an auth file (a network policy stands in).
    allow_any_caller: bool = False
    #: At most one ``caller_denied`` event per caller and job this often (a refused caller cannot
    #: fill a job's event log).
    denied_event_interval_s: float = 60.0


class _JobClient:
    """The gateway's side of one registered job: its session, the signals not yet sent, its streams.

    A pump task reads ``session.signals()`` from registration on, for as long as the registration
    lives, into ``outbox``; the newest subscription stream drains it. Reading once per registration
    (not once per stream) is what lets a reconnecting client get exactly what it has not been sent:
    ``session.signals()`` restarts from the registration revision on every call, which would replay
    every earlier recovery's signals to a client that subscribes a second time.
    """

    def __init__(self, job: str, session: ClientSession) -> None:
        self.job = job
        self.session = session
        self.outbox: deque[pb.Signal] = deque()
        self.changed = asyncio.Event()
        self.active_stream = 0
        self.open_streams = 0
        self.is_closed = False
        self.failure = ""
        self.pump: asyncio.Task[None] | None = None
        self.reaper: asyncio.Task[None] | None = None

    def new_stream(self, stream_id: int) -> None:
        """Make a new stream the one that gets signals; older streams of the job end."""
        self.active_stream = stream_id
        self.open_streams += 1
        self.changed.set()

    def keep_alive(self) -> wire.ProcessManageSignal:
        last = self.session.last_signal
        return wire.ProcessManageSignal(uuid=last.uuid if last else "", jobId=self.job, signalType=KEEP_ALIVE)


class RecoverService(recover_pb2_grpc.RecoverServicer):  # type: ignore[misc]
    """The servicer. Build it once, serve it with grpc.aio, and ``await aclose()`` at shutdown."""

    def __init__(
        self, store: Store, keys: Keyspace, settings: GatewaySettings, callers: CallerTable | None = None
    ) -> None:
        self.store = store
        self.keys = keys
        self.settings = settings
        self.callers = callers
        self._denied_at: dict[tuple[str, str], float] = {}
        self._initialised: set[str] = set()
        self._clients: dict[str, _JobClient] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._stream_ids = itertools.count(1)
        self._is_closing = False

    # ---------------------------------------------------------------- lifecycle
    async def aclose(self) -> None:
        """Deregister every session (the agents take over at once) and stop every task; idempotent."""
        self._is_closing = True
        for client in list(self._clients.values()):
            await self._drop(client, "the gateway is shutting down")
        tasks, self._tasks = list(self._tasks), set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def registered(self, job: str) -> _JobClient | None:
        client = self._clients.get(job)
        return client if client is not None and not client.is_closed else None

    async def _drop(self, client: _JobClient, why: str) -> None:
        """Deregister ``client``'s session and forget it; its streams end."""
        if client.is_closed:
            return
        client.is_closed = True
        client.failure = client.failure or why
        client.changed.set()
        if self._clients.get(client.job) is client:
            del self._clients[client.job]
        log.info("job %s: client %s deregistered: %s", client.job, client.session.client_id, why)
        for task in (client.pump, client.reaper):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        with contextlib.suppress(RecoverdError, TimeoutError):  # the lease then expires by its TTL
            async with asyncio.timeout(self.settings.call_timeout_s):
                await client.session.deregister()

    async def _pump(self, client: _JobClient) -> None:
        try:
            async for signal in client.session.signals():
                client.outbox.append(signal)
                client.changed.set()
            why = "signal subscription ended; register again"
        except Exception as err:
            log.exception("job %s: signal subscription failed", client.job)
            why = f"signal subscription failed: {err!r}; register again"
        # The watch itself survives etcd outages (store.py); anything else leaves the client without
        # signals, so it must stop being a participant rather than stall the job's recoveries.
        client.failure = why
        await self._drop(client, why)

    def _arm_reaper(self, client: _JobClient) -> None:
        if client.reaper is not None:
            client.reaper.cancel()
        client.reaper = self._spawn(self._reap(client), f"gateway-{client.job}-grace")

    async def _reap(self, client: _JobClient) -> None:
        await asyncio.sleep(self.settings.client_grace_s)
        if client.open_streams == 0 and not client.is_closed:
            await self._drop(client, f"no subscription stream for {self.settings.client_grace_s:g}s")

    # ---------------------------------------------------------------- callers
    async def _admit(self, context: Any, method: str, job: str) -> None:
        """Abort the call (UNAUTHENTICATED / PERMISSION_DENIED) unless its caller may act on
        ``job``; a refusal is logged and recorded as a ``caller_denied`` event of the job. Called
        before any work, outside ``_guarded``, whose catch-all would swallow the abort."""
        if self.callers is None:
            return  # local trust: said once at startup
        token, names = call_identity(context)
        verdict = self.callers.authorize(token, names, job)
        if isinstance(verdict, Allowed):
            return
        log.warning("%s from %s refused (%s): %s", method, context.peer(), verdict.code.name, verdict.detail)
        await self._record_denial(method, job, verdict.who, verdict.code.name, context.peer())
        await context.abort(verdict.code, verdict.detail)

    async def _record_denial(self, method: str, job: str, who: str, code: str, peer: str) -> None:
        """One event per (caller, job) per interval, in the job's current run; best effort (a
        refused call must not wait on etcd, and a job that does not exist has no log)."""
        if self._bad_job(job):
            return
        now = time.monotonic()
        last = self._denied_at.get((who, job))
        if last is not None and now - last < self.settings.denied_event_interval_s:
            return
        if len(self._denied_at) > 4096:
            self._denied_at.clear()
        self._denied_at[(who, job)] = now
        with contextlib.suppress(RecoverdError, TimeoutError):
            async with asyncio.timeout(self.settings.call_timeout_s):
                spec = await ClientSession(self.store, self.keys, job).find_job()
                if spec is None:
                    return
                why = f"{method} refused ({code}): {who} from {peer} may not act on job {job}"
                await events.write_event(
                    self.store, self.keys, RunRef(job, spec.uid), "gateway", Reason.CALLER_DENIED, why,
                    data={"method": method, "code": code, "caller": who, "peer": peer},
                )  # fmt: skip

    # ---------------------------------------------------------------- guard
    async def _guarded(self, name: str, call: Callable[[], Awaitable[wire.Status]]) -> wire.Status:
        """Run a unary RPC's work within the call budget; failures become a 599 Status (contract
        section 1: errors travel in ``Status.code``, not as gRPC errors)."""
        try:
            async with asyncio.timeout(self.settings.call_timeout_s):
                return await call()
        except TimeoutError:
            info = f"{name}: etcd did not answer within {self.settings.call_timeout_s:g}s"
        except RecoverdError as err:
            info = f"{name} failed: {err}"
        except Exception as err:
            log.exception("%s failed", name)
            info = f"{name} failed: internal error {err!r}"
        log.warning("%s", info)
        return wire.Status(code=Code.SERVER_INNER_ERROR, info=info)

    @staticmethod
    def _bad_job(job: str) -> str:
        try:
            check_id("job", job)
        except BadRecord as err:
            return str(err.detail)
        return ""

    # ---------------------------------------------------------------- Init / Register
    async def Init(self, request: wire.ClientInfo, context: Any) -> wire.Status:
        await self._admit(context, "Init", request.jobId)
        return await self._guarded("Init", lambda: self._init(request))

    async def _init(self, request: wire.ClientInfo) -> wire.Status:
        job = request.jobId
        bad = self._bad_job(job)
        if bad:
            return wire.Status(code=Code.INVALID_PARAM, info=bad)
        # Read at every call, not only the first: a job can be re-run with another policy.
        spec = await ClientSession(self.store, self.keys, job).find_job()
        if spec is None:
            self._initialised.discard(job)
            return wire.Status(
                code=Code.JOB_NOT_EXIST, info=f"job {job} does not exist (yet) under {self.keys.prefix}; retry Init"
            )
        if not set(spec.policy.strategies) - {"exit"}:
            self._initialised.discard(job)
            return wire.Status(
                code=Code.RECOVER_DISABLED, info=f"job {job} allows only exit: process-level recovery is off"
            )
        self._initialised.add(job)
        return wire.Status(code=Code.OK, info="init success")

    async def Register(self, request: wire.ClientInfo, context: Any) -> wire.Status:
        await self._admit(context, "Register", request.jobId)
        return await self._guarded("Register", lambda: self._register(request))

    async def _register(self, request: wire.ClientInfo) -> wire.Status:
        job = request.jobId
        bad = self._bad_job(job)
        if bad:
            return wire.Status(code=Code.INVALID_PARAM, info=bad)
        if job not in self._initialised:
            return wire.Status(code=Code.UNINIT, info=f"jobId={job} is not initialised: call Init first")
        if self._is_closing:
            return wire.Status(code=Code.SERVER_INNER_ERROR, info="the gateway is shutting down")
        async with self._locks.setdefault(job, asyncio.Lock()):
            if self.registered(job) is not None:
                # The session's own keeper re-registers a lost lease; nothing to do here.
                return wire.Status(code=Code.OK, info="register success")
            session = ClientSession(
                self.store, self.keys, job, role=request.role, lease_ttl_s=self.settings.client_lease_ttl_s
            )
            outcome = await session.register()
            if outcome.code != Code.OK:
                return wire.Status(code=outcome.code, info=outcome.info)
            client = _JobClient(job, session)
            self._clients[job] = client
            client.pump = self._spawn(self._pump(client), f"gateway-{job}-signals")
            self._arm_reaper(client)  # registered but never subscribing counts as gone too
            log.info("job %s: registered client %s (role %r)", job, session.client_id, request.role)
            return wire.Status(code=Code.OK, info="register success")

    # ---------------------------------------------------------------- signals
    async def SubscribeProcessManageSignal(self, request: wire.ClientInfo, context: Any) -> None:
        await self._admit(context, "SubscribeProcessManageSignal", request.jobId)
        job = request.jobId
        client = self.registered(job)
        if client is None:
            await context.abort(grpc.StatusCode.UNKNOWN, not_registered_text(job))
            return
        me = next(self._stream_ids)
        client.new_stream(me)
        if client.reaper is not None:
            client.reaper.cancel()
            client.reaper = None
        log.info("job %s: subscription %d opened by %s", job, me, context.peer())
        try:
            await self._stream(client, me, context)
        finally:
            client.open_streams -= 1
            log.info("job %s: subscription %d closed", job, me)
            if client.open_streams == 0 and not client.is_closed and not self._is_closing:
                self._arm_reaper(client)

    async def _stream(self, client: _JobClient, me: int, context: Any) -> None:
        try:
            resend = await self._pending_resend(client)
        except (RecoverdError, TimeoutError) as err:
            # Cannot tell whether the recovery still waits on the last signal: let the client retry.
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"jobId={client.job}: etcd unavailable ({err}); retry")
            return
        if resend is not None:
            log.info("job %s: re-sending pending %s (uuid %s)", client.job, resend.signal_type, resend.uuid)
            await context.write(to_wire(resend, client.job))
        interval_s = self.settings.keepalive_interval_s
        next_keepalive = time.monotonic() + interval_s
        while True:
            client.changed.clear()
            if client.is_closed:
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"jobId={client.job}: {client.failure}")
                return
            if client.active_stream != me:
                return  # a newer subscription of this job took over
            if client.outbox:
                signal = client.outbox.popleft()
                try:
                    await context.write(to_wire(signal, client.job))
                except BaseException:
                    client.outbox.appendleft(signal)  # not known to be sent: the next stream sends it
                    raise
                client.session.delivered(signal)
                log.info("job %s: sent %s (uuid %s, seq %d)", client.job, signal.signal_type, signal.uuid, signal.seq)
                continue
            now = time.monotonic()
            if now >= next_keepalive:
                await context.write(client.keep_alive())
                next_keepalive = max(next_keepalive + interval_s, now)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(next_keepalive - now):
                    await client.changed.wait()

    async def _pending_resend(self, client: _JobClient) -> pb.Signal | None:
        """The last signal sent, if its recovery is still waiting for this client's answer to it.

        A client that reconnects may have lost it with the old stream. Not re-sent when a newer
        signal of the episode is queued anyway, when the episode is over, or when the client has
        already answered the phase (re-sending would make a legacy client act twice).
        """
        last = client.session.last_signal
        run = client.session.run
        if last is None or run is None or any(s.epoch == last.epoch for s in client.outbox):
            return None
        async with asyncio.timeout(self.settings.call_timeout_s):
            kv = await self.store.get(self.keys.recovery(run))
        if kv is None:
            return None
        recovery = decode(pb.Recovery, kv.value, kv.key)
        if recovery.phase not in _ACTIVE or (recovery.epoch, recovery.uuid) != (last.epoch, last.uuid):
            return None
        if client.session.participant in recovery.reported:
            return None
        return last

    # ---------------------------------------------------------------- reports
    def _session_for(self, job: str) -> ClientSession | wire.Status:
        client = self.registered(job)
        if client is None:
            return wire.Status(code=Code.UNREGISTERED, info=f"jobId={job} not registered")
        return client.session

    async def _report(
        self, name: str, job: str, kind: int, ranks: Iterable[wire.FaultRank], **fields: Any
    ) -> wire.Status:
        async def go() -> wire.Status:
            session = self._session_for(job)
            if isinstance(session, wire.Status):
                return session
            fault_ranks = parse_fault_ranks(ranks)
            if isinstance(fault_ranks, str):
                return wire.Status(code=Code.INVALID_PARAM, info=fault_ranks)
            outcome: Outcome = await session.report(kind, fault_ranks=fault_ranks, **fields)
            return wire.Status(code=outcome.code, info=outcome.info)

        return await self._guarded(name, go)

    async def ReportStopComplete(self, request: wire.StopCompleteRequest, context: Any) -> wire.Status:
        await self._admit(context, "ReportStopComplete", request.jobId)
        return await self._report(
            "ReportStopComplete", request.jobId, pb.REPORT_STOP_COMPLETE, request.faultRanks,
            code=request.status.code, message=request.status.info,
        )  # fmt: skip

    async def ReportRecoverStrategy(self, request: wire.RecoverStrategyRequest, context: Any) -> wire.Status:
        await self._admit(context, "ReportRecoverStrategy", request.jobId)
        return await self._report(
            "ReportRecoverStrategy", request.jobId, pb.REPORT_STRATEGIES, request.faultRanks,
            strategies=list(request.strategies),
        )  # fmt: skip

    async def ReportRecoverStatus(self, request: wire.RecoverStatusRequest, context: Any) -> wire.Status:
        await self._admit(context, "ReportRecoverStatus", request.jobId)
        # isolateRankIds has no place in a session report (upstream's client never fills it).
        return await self._report(
            "ReportRecoverStatus", request.jobId, pb.REPORT_RECOVER_STATUS, (),
            code=request.status.code, message=request.status.info, strategy=request.strategy,
        )  # fmt: skip

    async def ReportProcessFault(self, request: wire.ProcessFaultRequest, context: Any) -> wire.Status:
        await self._admit(context, "ReportProcessFault", request.jobId)

        async def go() -> wire.Status:
            session = self._session_for(request.jobId)
            if isinstance(session, wire.Status):
                return session
            fault_ranks = parse_fault_ranks(request.faultRanks)
            if isinstance(fault_ranks, str):
                return wire.Status(code=Code.INVALID_PARAM, info=fault_ranks)
            outcome = await session.report_faults(fault_ranks)
            return wire.Status(code=outcome.code, info=outcome.info)

        return await self._guarded("ReportProcessFault", go)

    # ---------------------------------------------------------------- the rest
    async def HealthCheck(self, request: wire.ClientInfo, context: Any) -> wire.Status:
        return wire.Status(code=Code.OK, info="ok")

    async def SwitchNicTrack(self, request: Any, context: Any) -> wire.Status:
        return _not_supported("SwitchNicTrack")

    async def ReplySwitchNicResult(self, request: Any, context: Any) -> wire.Status:
        return _not_supported("ReplySwitchNicResult")

    async def StressTest(self, request: Any, context: Any) -> wire.Status:
        return _not_supported("StressTest")

    async def ReplyStressTestResult(self, request: Any, context: Any) -> wire.Status:
        return _not_supported("ReplyStressTestResult")

    async def SubscribeSwitchNicSignal(self, request: Any, context: Any) -> None:
        await _abort_unsupported(context, "SubscribeSwitchNicSignal")

    async def SubscribeNotifySwitch(self, request: Any, context: Any) -> None:
        await _abort_unsupported(context, "SubscribeNotifySwitch")

    async def SubscribeStressTestResponse(self, request: Any, context: Any) -> None:
        await _abort_unsupported(context, "SubscribeStressTestResponse")

    async def SubscribeNotifyExecStressTest(self, request: Any, context: Any) -> None:
        await _abort_unsupported(context, "SubscribeNotifyExecStressTest")


def parse_fault_ranks(items: Iterable[wire.FaultRank]) -> dict[int, int] | str:
    """``{int(rankId): int(faultType)}`` as upstream's server reads them, or why they are invalid.

    An empty ``faultType`` counts as 1 (other fault), as in the client library.
    """
    out: dict[int, int] = {}
    for item in items:
        try:
            out[int(item.rankId)] = int(item.faultType or "1")
        except ValueError:
            return f"invalid fault rank {{rankId: {item.rankId!r}, faultType: {item.faultType!r}}}: not decimal"
    return out


def _not_supported(method: str) -> wire.Status:
    return wire.Status(code=NOT_SUPPORTED, info=f"{method}: {NOT_SUPPORTED_INFO}")


async def _abort_unsupported(context: Any, method: str) -> None:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method}: {NOT_SUPPORTED_INFO}")
