"""``DLRecoverManager``: MindCluster's client API, speaking recoverd's protocol through etcd.

The contract (reference/mindcluster-contract.md section 9) is kept: the same constructor, methods,
return codes and signal handling, so code written for TaskD's ``DLRecoverManager`` runs unchanged.
Where upstream is unsound it is not copied (docs/compat.md): a signal for another job is discarded
(killMaster included), actions run in the order sent, a report is re-sent after re-registering only
when the code says "not registered" (400/408), a handler that raises is reported to the coordinator
as a failure of that phase instead of being logged and forgotten, and the subscription loop does not
poll: signals arrive by etcd watch.

``server_addr``: ``etcd://host:port[,host:port]`` or ``http://host:port[,...]`` talks to etcd
directly. A bare ``host:port`` is the address of the ``Recover`` gRPC gateway, as upstream clients
pass it. That gateway (``recoverd gateway``) serves upstream's own gRPC clients; this Python client
talks to etcd directly, so a gateway address raises ConfigError saying what to pass instead.

Threads: the etcd work runs on a private event-loop thread; the public methods are synchronous and
thread-safe. ``start_subscribe`` blocks its caller and runs the handlers in the caller's thread.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from recoverd.codes import Code
from recoverd.errors import ConfigError, RecoverdError
from recoverd.keys import DEFAULT_PREFIX, Keyspace
from recoverd.mindcluster import recover_pb2 as pb
from recoverd.records import pb as records
from recoverd.store import RANK_PROBE_INTERVAL_S, Store, parse_endpoints
from taskd_client.loop_thread import LoopThread
from taskd_client.session import ClientSession, Outcome
from taskd_client.signals import KILL_MASTER, Delivery, plan, to_wire

__all__ = ["DLRecoverManager", "Handler", "RecoverManager", "parse_server_addr"]

log = logging.getLogger(__name__)

#: ``handler(fault_ranks, signal)``: fault_ranks is ``{rank: faultType}`` as upstream's callbacks get it.
Handler = Callable[[dict[int, int], pb.ProcessManageSignal], None]

_RETRY_AFTER = (Code.UNREGISTERED, Code.UNINIT)
_REPORT_KINDS = {
    "stop_train": records.REPORT_STOP_COMPLETE,
    "pause_train": records.REPORT_STOP_COMPLETE,
    "on_global_rank": records.REPORT_STRATEGIES,
    "change_strategy": records.REPORT_RECOVER_STATUS,
}


def parse_server_addr(server_addr: str) -> list[tuple[str, int]]:
    """etcd endpoints from ``etcd://`` / ``http://`` / ``https://`` addresses; a bare host:port (the
    gateway) is refused."""
    text = server_addr.strip()
    if not text.lower().startswith(("etcd://", "http://", "https://")):
        raise ConfigError(
            f"server_addr {server_addr!r} is a Recover gRPC gateway address; this client talks to etcd directly"
            " (the gateway serves upstream's own gRPC clients): pass etcd://HOST:PORT, e.g. $RECOVERD_ETCD"
        )
    return parse_endpoints(text)


def _mindio_handlers() -> dict[str, Handler]:
    """Upstream's defaults: MindIO TFT's controller functions, when mindio_ttp is importable."""
    try:
        from mindio_ttp import framework_ttp as ttp  # type: ignore[import-not-found]
    except ImportError:
        return {}

    def on_global_rank(fault_ranks: dict[int, int], signal: pb.ProcessManageSignal) -> None:
        if signal.timeout:
            ttp.tft_notify_controller_on_global_rank(fault_ranks, signal.timeout)
        else:
            ttp.tft_notify_controller_on_global_rank(fault_ranks)

    return {
        "stop_train": lambda ranks, _signal: ttp.tft_notify_controller_stop_train(ranks, "stop"),
        "pause_train": lambda ranks, signal: ttp.tft_notify_controller_stop_train(ranks, "pause", signal.timeout),
        "on_global_rank": on_global_rank,
        "change_strategy": lambda _ranks, signal: ttp.tft_notify_controller_change_strategy(signal.changeStrategy),
        "save_and_exit": lambda _ranks, _signal: ttp.tft_notify_controller_dump(),
        KILL_MASTER: lambda _ranks, _signal: ttp.tft_destroy_controller(),
    }


class RecoverManager(abc.ABC):
    """Upstream's abstract base: a recovery client registers and subscribes."""

    @abc.abstractmethod
    def register(self, request: pb.ClientInfo) -> pb.Status: ...

    @abc.abstractmethod
    def start_subscribe(self, frame: str = "pytorch") -> None: ...


class DLRecoverManager(RecoverManager):
    """A job's recovery client (one controller per job, MindCluster style).

    ``info.jobId`` names the recoverd job; ``info.role`` is free text. Keyword-only extras (all
    optional): ``prefix`` (default ``$RECOVERD_PREFIX`` or ``/recoverd/v1``), ``lease_ttl_s`` (how
    soon a dead client stops being a participant; default ``$RECOVERD_CLIENT_LEASE_TTL`` or 5),
    ``call_timeout_s`` (every etcd-backed call), ``handlers`` ({action: Handler}).
    """

    def __init__(
        self,
        info: pb.ClientInfo,
        server_addr: str,
        *,
        prefix: str | None = None,
        lease_ttl_s: float | None = None,
        call_timeout_s: float = 10.0,
        handlers: Mapping[str, Handler] | None = None,
    ) -> None:
        if not isinstance(info, pb.ClientInfo):
            raise TypeError(f"info must be a recover_pb2.ClientInfo, not {type(info).__name__}")
        parse_server_addr(server_addr)  # a gateway address or a malformed one: refused here
        self.info = info
        self.server_addr = server_addr
        self.call_timeout_s = call_timeout_s
        self._keys = Keyspace(prefix or os.environ.get("RECOVERD_PREFIX", DEFAULT_PREFIX))
        ttl = lease_ttl_s if lease_ttl_s is not None else float(os.environ.get("RECOVERD_CLIENT_LEASE_TTL", "5"))
        self._handlers: dict[str, Handler] = {**_mindio_handlers(), **(handlers or {})}
        self._initialised = False
        self._closed = threading.Event()
        self._pumps: set[concurrent.futures.Future[None]] = set()
        self._was_registered = False
        #: Set once a subscription is live: every signal published from then on will be delivered.
        self.subscribed = threading.Event()
        self._loop = LoopThread(name=f"recoverd-client-{info.jobId}")
        # TLS and credentials from RECOVERD_ETCD_* (the agent sets them for its ranks; docs/security.md).
        self._store = Store(
            server_addr.strip(), op_timeout_s=min(call_timeout_s, 5.0), probe_interval_s=RANK_PROBE_INTERVAL_S
        )
        self._session = ClientSession(self._store, self._keys, info.jobId, role=info.role, lease_ttl_s=ttl)

    # ---------------------------------------------------------------- plumbing
    def _call(self, coro: Any, timeout_s: float | None = -1.0) -> Any:
        """Run ``coro`` on the private loop; ``timeout_s`` None waits as long as it takes."""
        if self._closed.is_set():
            coro.close()
            raise RecoverdError(f"DLRecoverManager for job {self.info.jobId} is closed")
        return self._loop.call(coro, self.call_timeout_s if timeout_s == -1.0 else timeout_s)

    def close(self) -> None:
        """Deregister (the agents take over at once), stop a running subscription, free the thread."""
        if self._closed.is_set():
            return
        with contextlib.suppress(Exception):
            self._loop.call(self._session.deregister(), self.call_timeout_s)
        self._closed.set()
        for pump in list(self._pumps):
            pump.cancel()
        with contextlib.suppress(Exception):
            self._loop.call(self._store.aclose(), self.call_timeout_s)
        self._loop.close()

    def __enter__(self) -> DLRecoverManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def client_id(self) -> str:
        return self._session.client_id

    def set_handler(self, action: str, handler: Handler) -> None:
        """Run ``handler(fault_ranks, signal)`` for ``action`` (e.g. "stop_train", "on_global_rank",
        "change_strategy", "fault_nodes_restart", "killMaster"). Replaces MindIO's default."""
        self._handlers[action] = handler

    # ---------------------------------------------------------------- MindCluster API
    def init_clusterd(self) -> bool:
        """Wait (by watch) until the job exists; False when its policy turns process recovery off (403)."""
        spec = self._call(self._session.wait_for_job(), None)
        if not set(spec.policy.strategies) - {"exit"}:
            log.warning("job %s allows only exit: process-level recovery is off (403)", self.info.jobId)
            return False
        self._initialised = True
        return True

    def register(self, request: pb.ClientInfo | None = None) -> pb.Status:
        """Register as the job's recovery participant. 0 "register success" (also when already
        registered); 408 before init_clusterd; 402 unknown job; 409 a request for another job."""
        request = request if request is not None else self.info
        if request.jobId != self.info.jobId:
            return pb.Status(
                code=Code.INVALID_PARAM, info=f"this manager serves job {self.info.jobId}, not {request.jobId}"
            )
        if not self._initialised:
            return pb.Status(code=Code.UNINIT, info="call init_clusterd first")
        outcome: Outcome = self._call(self._session.register())
        if outcome.code == Code.OK:
            self._was_registered = True
        return pb.Status(code=outcome.code, info=outcome.info)

    def start_subscribe(self, frame: str = "pytorch") -> None:
        """Deliver the job's signals to the handlers, in order, until killMaster or close().

        Registers first if needed (upstream's loop runs Init -> Register -> Subscribe).
        """
        if not self._session.is_registered:
            if not self._initialised and not self.init_clusterd():
                return
            status = self.register(self.info)
            if status.code != Code.OK:
                raise RecoverdError(f"cannot subscribe: register returned {status.code} {status.info}")
        self._consume()

    def observe(self) -> None:
        """Deliver the job's signals to the handlers like start_subscribe, without registering.

        For processes that must follow a recovery but do not answer it (e.g. the survivors of a
        job whose controller is another process): an observer is never a participant, so its
        reports are refused (400) and nobody waits for it.
        """
        self._call(self._session.wait_for_job(), None)
        self._consume()

    def _consume(self) -> None:
        inbox: queue.Queue[records.Signal | BaseException | None] = queue.Queue()

        async def pump() -> None:
            try:
                async for signal in self._session.signals(on_ready=self.subscribed.set):
                    inbox.put(signal)
            except asyncio.CancelledError:
                inbox.put(None)  # closed: the subscription ends quietly
                raise
            except Exception as err:  # handed to the subscriber thread, re-raised there
                inbox.put(err)

        future = self._loop.submit(pump())
        self._pumps.add(future)
        try:
            while not self._closed.is_set():
                try:
                    item = inbox.get(timeout=0.5)  # wakes to notice close()
                except queue.Empty:
                    continue
                if isinstance(item, BaseException):
                    raise RecoverdError(f"signal subscription of job {self.info.jobId} failed: {item!r}") from item
                if item is None:
                    return
                if self._deliver(item):
                    return
        finally:
            future.cancel()
            self._pumps.discard(future)
            self.subscribed.clear()

    def _deliver(self, signal: records.Signal) -> bool:
        """Run one signal's handlers; True after killMaster (the subscription ends)."""
        message = to_wire(signal, self.info.jobId)
        delivery = plan(message, self.info.jobId)
        if delivery is None:
            return False
        log.info("job %s: signal %s %s ranks %s", self.info.jobId, delivery.signal_type, list(delivery.actions),
                 delivery.fault_ranks)  # fmt: skip
        self._session.delivered(signal)
        if delivery.is_kill_master:
            self._run_handler(KILL_MASTER, delivery, message)
            return True
        for action in delivery.actions:
            self._run_handler(action, delivery, message)
        return False

    def _run_handler(self, action: str, delivery: Delivery, message: pb.ProcessManageSignal) -> None:
        handler = self._handlers.get(action)
        if handler is None:
            log.info("no handler for action %r (signal %s); ignored", action, delivery.signal_type)
            return
        try:
            handler(dict(delivery.fault_ranks), message)
        except Exception as err:
            log.exception("handler for %r failed", action)
            self._report_handler_failure(action, delivery, err)

    def _report_handler_failure(self, action: str, delivery: Delivery, err: Exception) -> None:
        """A failed handler is this client's answer to the phase: failure, not silence."""
        kind = _REPORT_KINDS.get(action)
        text = f"{action} handler failed: {err!r}"
        try:
            if kind == records.REPORT_STOP_COMPLETE:
                self.report_stop_complete(Code.CLIENT_ERROR, text, delivery.fault_ranks)
            elif kind == records.REPORT_STRATEGIES:
                self.report_recover_strategy(delivery.fault_ranks, ["exit"])
            elif kind == records.REPORT_RECOVER_STATUS:
                self.report_recover_status(Code.CLIENT_ERROR, text, delivery.fault_ranks, "")
        except Exception:
            # The subscription goes on: the phase's deadline escalates if this answer never lands.
            log.exception("could not report the failure of the %r handler", action)

    # ---------------------------------------------------------------- reports
    def _report(self, make: Callable[[], Any]) -> int:
        outcome: Outcome = self._call(make())
        if outcome.code in _RETRY_AFTER and self._was_registered:
            # Registered before and lost it (e.g. a lease that expired): register again, once.
            self._call(self._session.register())
            outcome = self._call(make())
        if outcome.code != Code.OK:
            log.warning("job %s: report refused with %d: %s", self.info.jobId, outcome.code, outcome.info)
        return int(outcome.code)

    def report_stop_complete(self, code: int, msg: str, fault_ranks: dict[int, int]) -> int:
        return self._report(
            lambda: self._session.report(records.REPORT_STOP_COMPLETE, code=code, message=msg, fault_ranks=fault_ranks)
        )

    def report_recover_strategy(self, fault_ranks: dict[int, int], strategy_list: Sequence[str]) -> int:
        if isinstance(strategy_list, str) or not all(isinstance(s, str) for s in strategy_list):
            log.error("strategy_list must be a list of strategy names, got %r", strategy_list)
            return int(Code.INVALID_PARAM)
        return self._report(
            lambda: self._session.report(records.REPORT_STRATEGIES, fault_ranks=fault_ranks, strategies=strategy_list)
        )

    def report_recover_status(self, code: int, msg: str, fault_ranks: dict[int, int], strategy: str) -> int:
        return self._report(
            lambda: self._session.report(
                records.REPORT_RECOVER_STATUS, code=code, message=msg, fault_ranks=fault_ranks, strategy=strategy
            )
        )

    def report_process_fault(self, fault_ranks: dict[int, int], fault_codes: dict[Any, Any] | None = None) -> int:
        """Faults the job detected itself (``fault_codes`` is accepted and unused, as upstream)."""
        return self._report(lambda: self._session.report_faults(fault_ranks))
