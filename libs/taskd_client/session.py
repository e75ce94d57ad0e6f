"""A recovery client's session with etcd: registration, reports, faults and signals (asyncio).

The MindCluster API (``manager.py``) is a synchronous facade over this. A session

* **registers** the client under a lease (``clients/<id>``): while it lives, the job's clients are
  its recovery participants and the agents stay silent; when the client dies its lease expires and
  the agents take over (no recovery waits on a dead client);
* **reports** an answer to the current phase, stamped with the epoch and uuid of the last signal it
  delivered (upstream's messages carry no epoch). A repeat for the current uuid is a no-op answered
  with 0; an answer for an older uuid is refused with 401 and recorded as an event, never applied;
* **reports faults** the training process saw itself (``report_process_fault``);
* **delivers signals** by watch from the registration revision, each exactly once and in order
  (numbered by seq), surviving etcd restarts; a subscriber that starts during a recovery first gets
  the signal that recovery is waiting on (upstream resets the episode on a new subscription).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from recoverd import events, participants
from recoverd.codes import Code
from recoverd.errors import BadRecord, RecoverdError
from recoverd.keys import Keyspace, RunRef, check_id
from recoverd.records import decode, encode, pb, ts_from_s
from recoverd.store import LeaseKeeper, Put, Resync, Store

__all__ = ["ClientSession", "Outcome"]

log = logging.getLogger(__name__)

_ACTIVE = frozenset(
    {pb.PHASE_COLLECTING, pb.PHASE_STOPPING, pb.PHASE_GLOBAL_FAULT, pb.PHASE_DECIDING, pb.PHASE_RECOVERING}
)
_KIND_NAMES: dict[int, str] = {
    pb.REPORT_STOP_COMPLETE: "stop_complete",
    pb.REPORT_STRATEGIES: "strategies",
    pb.REPORT_RECOVER_STATUS: "recover_status",
}


@dataclass(frozen=True, slots=True)
class Outcome:
    """A call's result in MindCluster's terms: ``code`` (0 ok) and a message saying why."""

    code: int
    info: str = ""


class ClientSession:
    """One client of one job. ``await session.register()`` before reporting or subscribing."""

    def __init__(self, store: Store, keys: Keyspace, job: str, *, role: str = "", lease_ttl_s: float = 5.0) -> None:
        self.store = store
        self.keys = keys
        self.job = check_id("job", job)
        self.role = role
        self.lease_ttl_s = lease_ttl_s
        self.client_id = f"{socket.gethostname().split('.')[0]}.{os.getpid()}.{secrets.token_hex(3)}"
        self.participant = participants.of_client(self.client_id)
        self.spec: pb.JobSpec | None = None
        self.run: RunRef | None = None
        self.registered_revision = 0
        self._lease: LeaseKeeper | None = None
        self._last_signal: pb.Signal | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._registering = asyncio.Lock()

    @property
    def is_registered(self) -> bool:
        return self._lease is not None and not self._lease.lost.is_set()

    @property
    def last_signal(self) -> pb.Signal | None:
        return self._last_signal

    # ---------------------------------------------------------------- job
    async def find_job(self) -> pb.JobSpec | None:
        kv = await self.store.get(self.keys.job_spec(self.job))
        if kv is None:
            return None
        spec = decode(pb.JobSpec, kv.value, kv.key)
        self.spec, self.run = spec, RunRef(self.job, spec.uid)
        return spec

    async def wait_for_job(self, timeout_s: float | None = None) -> pb.JobSpec:
        """The job's record, waiting (by watch, not polling) until a launcher creates it."""
        async with asyncio.timeout(timeout_s):
            while True:
                start = await self.store.revision()
                spec = await self.find_job()
                if spec is not None:
                    return spec
                async for _ in self.store.watch_key(self.keys.job_spec(self.job), start + 1):
                    break

    # ---------------------------------------------------------------- registration
    async def register(self, ranks: Sequence[int] = ()) -> Outcome:
        """Become a participant of the job's recoveries; idempotent while registered.

        Serialised (the re-register loop and a caller may race), and a registration whose write
        fails revokes its lease instead of leaving a keep-alive task on an orphan lease.
        """
        async with self._registering:
            return await self._register(ranks)

    async def _register(self, ranks: Sequence[int]) -> Outcome:
        if self.is_registered:
            return Outcome(Code.OK, "register success")
        spec = await self.find_job()
        if spec is None or self.run is None:
            return Outcome(Code.JOB_NOT_EXIST, f"job {self.job} does not exist under {self.keys.prefix}")
        lease = LeaseKeeper(self.store, self.lease_ttl_s)
        await lease.__aenter__()
        record = pb.ClientRecord(
            client_id=self.client_id,
            role=self.role,
            host=socket.gethostname(),
            pid=os.getpid(),
            ranks=list(ranks),
            registered_at=ts_from_s(time.time()),
        )
        note = events.event_put(
            self.keys,
            self.run,
            self.participant,
            "client_registered",
            f"client {self.client_id} ({self.role}) registered",
        )
        try:
            result = await self.store.txn(
                [], [Put(self.keys.client(self.run, self.client_id), encode(record), lease.id), note]
            )
        except BaseException:
            await lease.aclose()
            raise
        self._lease = lease
        self.registered_revision = self.registered_revision or result.revision
        if self._keeper is None:
            self._keeper = asyncio.create_task(self._keep_registered(ranks), name=f"client-{self.client_id}-lease")
        return Outcome(Code.OK, "register success")

    async def _keep_registered(self, ranks: Sequence[int], retry_s: float = 0.2) -> None:
        """Register again whenever the lease is lost (etcd was away longer than the TTL): a live
        client must not silently stop being a participant."""
        while True:
            lease = self._lease
            if lease is None:
                return
            await lease.lost.wait()
            if self._lease is not lease:
                continue
            log.warning("client %s: lease lost; registering again", self.client_id)
            self._lease = None
            while True:
                try:
                    await self.register(ranks)
                    break
                except RecoverdError:
                    await asyncio.sleep(retry_s)

    async def deregister(self) -> None:
        """Stop being a participant at once (revokes the lease); idempotent."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None and keeper is not asyncio.current_task():
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        lease, self._lease = self._lease, None
        if lease is not None:
            await lease.aclose()

    # ---------------------------------------------------------------- reports
    async def report(
        self,
        kind: int,
        *,
        code: int = 0,
        message: str = "",
        fault_ranks: Mapping[int, int] | None = None,
        strategies: Sequence[str] = (),
        strategy: str = "",
    ) -> Outcome:
        """Answer the phase of the last delivered signal (see the module docstring for the rules)."""
        if not self.is_registered or self.run is None:
            return Outcome(Code.UNREGISTERED, f"client {self.client_id} is not registered")
        bad = self._check_ranks(fault_ranks)
        if bad:
            return Outcome(Code.INVALID_PARAM, bad)
        signal = self._last_signal
        if signal is None:
            return Outcome(Code.ORDER_MIXED, "no signal was delivered yet: there is nothing to answer")
        kv = await self.store.get(self.keys.recovery(self.run))
        recovery = decode(pb.Recovery, kv.value, kv.key) if kv is not None else None
        if recovery is None or recovery.epoch != signal.epoch or recovery.uuid != signal.uuid:
            current = f"{recovery.uuid} (epoch {recovery.epoch})" if recovery is not None else "none"
            why = f"report for signal {signal.uuid} (epoch {signal.epoch}) is stale; the current one is {current}"
            await events.write_event(
                self.store, self.keys, self.run, self.participant, "stale_epoch", why, epoch=signal.epoch
            )
            return Outcome(Code.ORDER_MIXED, why)
        report = pb.Report(
            participant=self.participant,
            epoch=signal.epoch,
            uuid=signal.uuid,
            kind=kind,  # type: ignore[arg-type]
            code=code,
            message=message,
            strategies=list(strategies),
            strategy=strategy,
            fault_ranks=sorted(fault_ranks or {}),
        )
        key = self.keys.report(self.run, self.participant, _KIND_NAMES[kind])
        existing = await self.store.get(key)
        if existing is not None:
            with contextlib.suppress(BadRecord):
                old = decode(pb.Report, existing.value, key)
                if old.uuid == signal.uuid:
                    return Outcome(Code.OK, "already reported for this signal")  # upstream sends twice
        report.reported_at.CopyFrom(ts_from_s(time.time()))
        await self.store.put(key, encode(report))
        return Outcome(Code.OK, "ok")

    def _check_ranks(self, fault_ranks: Mapping[int, int] | None) -> str:
        if fault_ranks is None:
            return ""
        if not isinstance(fault_ranks, Mapping):
            return f"fault_ranks must be a dict {{rank: faultType}}, not {type(fault_ranks).__name__}"
        world = self.spec.world_size if self.spec is not None else 0
        for rank, fault_type in fault_ranks.items():
            if (
                isinstance(rank, bool)
                or not isinstance(rank, int)
                or isinstance(fault_type, bool)
                or not isinstance(fault_type, int)
            ):
                return f"fault_ranks must map int ranks to int fault types, got {rank!r}: {fault_type!r}"
            if not 0 <= rank < world:
                return f"rank {rank} is not in job {self.job} (ranks 0..{world - 1})"
            if fault_type not in (0, 1, 2):
                return f"fault type {fault_type} of rank {rank} is not 0 (UCE), 1 (other) or 2 (HCCL)"
        return ""

    async def report_faults(self, fault_ranks: Mapping[int, int]) -> Outcome:
        """Faults the training process detected itself: one fault record per rank."""
        if not self.is_registered or self.run is None:
            return Outcome(Code.UNREGISTERED, f"client {self.client_id} is not registered")
        bad = self._check_ranks(fault_ranks)
        if bad or not fault_ranks:
            return Outcome(Code.INVALID_PARAM, bad or "fault_ranks is empty")
        now = time.time()
        ops = []
        for rank, fault_type in sorted(fault_ranks.items()):
            fault = pb.Fault(
                fault_id=f"{self.client_id}.r{rank}.t{int(now * 1000)}",
                rank=rank,
                fault_type=str(fault_type),
                source=pb.SOURCE_CLIENT,
                detected_at=ts_from_s(now),
                detail=f"reported by client {self.client_id} ({self.role})",
            )
            ops.append(Put(self.keys.fault(self.run, fault.fault_id), encode(fault)))
        await self.store.txn([], ops)
        return Outcome(Code.OK, "ok")

    # ---------------------------------------------------------------- signals
    def delivered(self, signal: pb.Signal) -> None:
        """Mark ``signal`` as handed to the handlers: reports from now on answer it.

        Set by the subscriber when the handlers get the signal, not when it arrives, so a slow
        handler's answer can never be stamped with a newer signal it has not seen.
        """
        self._last_signal = signal

    async def signals(self, on_ready: Callable[[], None] | None = None) -> AsyncIterator[pb.Signal]:
        """Every signal of the run from registration on, in order, each exactly once.

        A registered client gets every signal written after its registration (also those written
        before it subscribed), preceded by the signal a recovery in progress is waiting on; an
        observer (not registered) gets the pending signal, then what follows. Survives etcd
        restarts (the watch resumes; a resync re-reads and skips what was already delivered).
        """
        if self.run is None:
            raise RecoverdError("find the job (wait_for_job or register) before subscribing")
        run = self.run
        snap = await self.store.get_prefix(self.keys.signals_prefix(run))
        if on_ready is not None:
            on_ready()  # everything after this read reaches the watch below
        since = self.registered_revision or snap.revision
        backlog = sorted((kv for kv in snap.kvs if kv.mod_revision > since), key=lambda kv: self._seq(kv.key))
        pending = await self._pending_signal(run, [kv for kv in snap.kvs if kv.mod_revision <= since])
        last_seq = max((self._seq(kv.key) for kv in snap.kvs if kv.mod_revision <= since), default=0)
        if pending is not None:
            yield pending
        for kv in backlog:
            signal = self._decode_signal(kv)
            last_seq = max(last_seq, self._seq(kv.key))
            if signal is not None:
                yield signal
        async for item in self.store.watch_prefix(self.keys.signals_prefix(run), snap.revision + 1):
            batch: list[Any]
            if isinstance(item, Resync):
                batch = list((await self.store.get_prefix(self.keys.signals_prefix(run))).kvs)
            elif item.is_delete:
                continue
            else:
                batch = [item]
            for kv in sorted(batch, key=lambda kv: self._seq(kv.key)):
                seq = self._seq(kv.key)
                if seq <= last_seq:
                    continue
                last_seq = seq
                signal = self._decode_signal(kv)
                if signal is not None:
                    yield signal

    def _decode_signal(self, kv: Any) -> pb.Signal | None:
        try:
            return decode(pb.Signal, kv.value, kv.key)
        except BadRecord as err:
            log.warning("skipping a malformed signal: %s", err)
            return None

    async def _pending_signal(self, run: RunRef, kvs: Sequence[object]) -> pb.Signal | None:
        kv = await self.store.get(self.keys.recovery(run))
        if kv is None:
            return None
        try:
            recovery = decode(pb.Recovery, kv.value, kv.key)
        except BadRecord as err:  # untrusted input: the coordinator rebuilds it; nothing pending meanwhile
            log.warning("skipping a malformed recovery record: %s", err)
            return None
        if recovery.phase not in _ACTIVE:
            return None
        decoded = [self._decode_signal(k) for k in kvs]
        current = [s for s in decoded if s is not None and s.epoch == recovery.epoch]
        return max(current, key=lambda s: s.seq) if current else None

    def _seq(self, key: str) -> int:
        try:
            return int(self.keys.parse(key).name)
        except (BadRecord, ValueError):
            return 0
