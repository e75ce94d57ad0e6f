"""The coordinator and the strategy selector against the real etcd under random writes.

Each case writes a batch of random keys and values under one job's run prefix (random kinds,
names, undecodable bytes, random bytes, random JSON, record-shaped JSON), then runs coordinator
passes until the job is no longer queued, and a selector pass. Nothing may raise: not a decoder,
not the state machine, not etcd (no transaction over its limits). After all the garbage, a real
fault is still taken into a recovery and its key consumed.

Figures: cases and writes go to tests/fuzzstats.py, printed at the end of the run.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recoverd.jobview import read_job
from recoverd.keys import KeyKind, Keyspace
from recoverd.records import decode, encode, pb
from recoverd.store import Put, Store
from recoverd.strategy.service import StrategyService
from tests.fuzzstats import record
from tests.unit.test_fuzz_decoders import CLASSES, json_values, shaped

from .untrusted import drain, events, fault, leader, seed_job

pytestmark = pytest.mark.etcd

CASES = 150
_KINDS = [k.value for k in CLASSES] + ["bogus", ""]

segments = (
    st.sampled_from(["n0", "n1", "x", "agent.n0", "000000000001", "zzz", "stop_complete"])
    | st.text(max_size=6).map(lambda t: t.replace("\x00", ""))
    | st.binary(min_size=1, max_size=4).map(lambda b: b.decode("utf-8", "surrogateescape"))
)
values = (
    st.binary(max_size=48)
    | json_values.map(lambda v: json.dumps(v).encode())
    | shaped().map(lambda case: json.dumps(case[1]).encode())
)


@st.composite
def valid_records(draw: st.DrawFn) -> tuple[str, list[str], bytes]:
    """Records that pass validation but say odd things: the state machine's hostile input."""
    epoch = draw(st.integers(min_value=1, max_value=6))
    rank = draw(st.integers(min_value=-1, max_value=5))
    node = draw(st.sampled_from(["n0", "n1", "n9"]))
    which = draw(st.sampled_from(["fault", "report", "recovery", "decision", "command", "ack", "ranks"]))
    if which == "fault":
        fid = draw(st.sampled_from(["f1", "f2", "f3"]))
        return "faults", [fid], encode(pb.Fault(fault_id=fid, rank=rank, node=node, source=pb.SOURCE_AGENT))
    if which == "report":
        kind = draw(st.sampled_from([pb.REPORT_STOP_COMPLETE, pb.REPORT_STRATEGIES, pb.REPORT_RECOVER_STATUS]))
        name = pb.ReportKind.Name(kind).removeprefix("REPORT_").lower()
        strategies = draw(st.lists(st.sampled_from(["exit", "recover-in-place", "retry", "bogus"]), max_size=3))
        report = pb.Report(participant=f"agent.{node}", epoch=epoch, kind=kind, code=draw(st.integers(0, 2)))
        report.strategies.extend(strategies)
        return "reports", [f"agent.{node}", name], encode(report)
    if which == "recovery":
        phase = draw(st.sampled_from([p for p in pb.Phase.values() if p]))
        return (
            "recovery",
            [],
            encode(pb.Recovery(epoch=epoch, recovery_id=epoch, phase=phase, participants=["agent.n0"])),
        )
    if which == "decision":
        strategy = draw(st.sampled_from(["exit", "recover-in-place", "bogus"]))
        return "decisions", [f"{epoch:012d}"], encode(pb.Decision(epoch=epoch, strategy=strategy))
    if which == "command":
        return "commands", [node], encode(pb.Command(epoch=epoch, seq=1, action=pb.ACTION_RESTART_RANKS, ranks=[0]))
    if which == "ack":
        return "acks", [node], encode(pb.CommandAck(epoch=epoch, seq=1, ok=draw(st.booleans())))
    state = draw(st.sampled_from([pb.RANK_RUNNING, pb.RANK_FAILED, pb.RANK_SUCCEEDED]))
    table = pb.NodeRanks(node=node, ranks=[pb.RankStatus(rank=max(rank, 0), state=state, node=node)])
    return "ranks", [node], encode(table)


writes = st.lists(
    st.tuples(st.sampled_from(_KINDS), st.lists(segments, min_size=0, max_size=2), values) | valid_records(),
    min_size=1,
    max_size=8,
)


def test_random_writes_under_a_job_never_crash_a_pass(etcd_endpoint: str, key_prefix: str) -> None:
    keys = Keyspace(key_prefix)
    loop = asyncio.new_event_loop()
    store = Store(etcd_endpoint)
    loop.run_until_complete(store.__aenter__())
    try:
        lease = loop.run_until_complete(store._grant(120))
        job = loop.run_until_complete(
            seed_job(store, keys, "job-fz", nnodes=2, nproc=2, lease=lease, strategies=("recover-in-place", "exit"))
        )
        coordinator = loop.run_until_complete(leader(store, keys))
        selector = StrategyService(store, keys)
        run_prefix = keys.run_prefix(job.run)

        @settings(
            max_examples=CASES,
            deadline=None,
            derandomize=True,  # the same cases every run: a failure here is reproducible, never luck
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
        )
        @given(batch=writes)
        def case(batch: list[tuple[str, list[str], bytes]]) -> None:
            record("reconciler (etcd)", etcd_writes=len(batch))
            ops = [Put(run_prefix + "/".join([kind, *rest]), value) for kind, rest, value in batch]

            async def go() -> None:
                await store.txn([], _unique(ops))
                passes = await drain(coordinator, job.name)
                await selector.reconcile(job.name)
                passes += await drain(coordinator, job.name)
                record("reconciler (etcd)", 0, coordinator_passes=passes)

            loop.run_until_complete(go())

        case()

        async def real_fault() -> pb.Recovery:
            # As a real agent would report it: for the generation rank 3 runs now (the fuzz may have
            # written rank tables with any generation), in a job the fuzz did not end (a well-formed
            # random status record is indistinguishable from the coordinator's own: removed).
            await store.delete(keys.status(job.run))
            view = await read_job(store, keys, job.name)
            generation = max((r.generation for t in view.ranks.values() for r in t.ranks if r.rank == 3), default=0)
            fault_id, raw = fault(job, 3, "real-after-fuzz")
            record = decode(pb.Fault, raw)
            record.generation = generation
            value = encode(record)
            await store.put(keys.fault(job.run, fault_id), value)
            await drain(coordinator, job.name)
            assert await store.get(keys.fault(job.run, fault_id)) is None
            kv = await store.get(keys.recovery(job.run))
            assert kv is not None
            return decode(pb.Recovery, kv.value)

        recovery = loop.run_until_complete(real_fault())
        seen = loop.run_until_complete(events(store, keys, job.run))
        print("fuzz event reasons:", dict(Counter(e.reason for e in seen)))
        assert "real-after-fuzz" in {f.fault_id for f in recovery.faults}
        assert recovery.phase != pb.PHASE_UNSPECIFIED
    finally:
        coordinator_queue_close(locals().get("coordinator"))
        loop.run_until_complete(store.aclose())
        loop.close()


def _unique(ops: list[Put]) -> list[Put]:
    """etcd refuses a transaction that puts one key twice: keep the last put of each key."""
    return list({op.key: op for op in ops}.values())


def coordinator_queue_close(coordinator: Any) -> None:
    if coordinator is not None:
        coordinator._jobs.close()


assert KeyKind.SIGNAL in CLASSES  # the fuzz covers every record kind the decoders know
