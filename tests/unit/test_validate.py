"""What a valid record is, kind by kind (recoverd.validate; docs/keyspace.md "Validation")."""

from __future__ import annotations

from typing import Any

import pytest

from recoverd.errors import BadRecord
from recoverd.keys import Keyspace, RunRef
from recoverd.records import MAX_DECODE_BYTES, decode, encode, pb
from recoverd.validate import (
    MAX_VALUE_BYTES,
    JobFrame,
    check_record,
    check_size,
    check_spec,
    max_list,
    report_kind_name,
)

KEYS = Keyspace("/v/v1")
RUN = RunRef("j", "r")
FRAME = JobFrame("j", "r", world_size=4, nnodes=2)


def _check(key: str, msg: Any, lease: int = 0) -> None:
    check_record(KEYS.parse(key), msg, lease, FRAME)


VALID = [
    (KEYS.fault(RUN, "f1"), pb.Fault(fault_id="f1", rank=3, source=pb.SOURCE_AGENT), 0),
    (KEYS.fault(RUN, "f2"), pb.Fault(fault_id="f2", rank=99), 0),  # out-of-world rank: unknown_rank later
    (KEYS.node(RUN, "n0"), pb.NodeRecord(node="n0", node_rank=1, ranks=[2, 3]), 7),
    (KEYS.node(RUN, "s"), pb.NodeRecord(node="s", node_rank=-1, is_spare=True), 7),
    (KEYS.client(RUN, "c"), pb.ClientRecord(client_id="c", ranks=[0]), 7),
    (KEYS.ranks(RUN, "n0"), pb.NodeRanks(node="n0", ranks=[pb.RankStatus(rank=0, state=pb.RANK_RUNNING)]), 0),
    (
        KEYS.report(RUN, "agent.n0", "strategies"),
        pb.Report(participant="agent.n0", epoch=1, kind=pb.REPORT_STRATEGIES),
        0,
    ),
    (KEYS.decision(RUN, 2), pb.Decision(epoch=2, strategy="exit"), 0),
    (KEYS.decision(RUN, 3), pb.Decision(epoch=3, give_up=True), 0),
    (KEYS.command(RUN, "n0"), pb.Command(epoch=1, seq=0, action=pb.ACTION_RESTART_RANKS, ranks=[1]), 0),
    (KEYS.ack(RUN, "n0"), pb.CommandAck(epoch=1, seq=1, ok=True), 0),
    (KEYS.signal(RUN, 5), pb.Signal(seq=5, epoch=1), 0),
    (KEYS.recovery(RUN), pb.Recovery(epoch=1, recovery_id=1, phase=pb.PHASE_DONE), 0),
    (KEYS.status(RUN), pb.JobStatus(uid="r", state=pb.JOB_SUCCEEDED), 0),
    (KEYS.history(RUN), pb.History(outcomes=[pb.RecoveryOutcome(epoch=1)]), 0),
]


@pytest.mark.parametrize(("key", "msg", "lease"), VALID)
def test_valid_records_pass(key: str, msg: Any, lease: int) -> None:
    _check(key, decode(type(msg), encode(msg)), lease)


INVALID = [
    (KEYS.fault(RUN, "x"), pb.Fault(), 0, "fault id"),  # faults/x = {}
    (KEYS.fault(RUN, "x"), pb.Fault(fault_id="y"), 0, "fault id"),
    (KEYS.node(RUN, "ghost"), pb.NodeRecord(), 7, "node record"),
    (KEYS.node(RUN, "n0"), pb.NodeRecord(node="n0"), 0, "no lease"),
    (KEYS.node(RUN, "n0"), pb.NodeRecord(node="n0", node_rank=5), 7, "node rank"),
    (KEYS.node(RUN, "n0"), pb.NodeRecord(node="n0", ranks=[4]), 7, "names rank 4"),
    (KEYS.client(RUN, "c"), pb.ClientRecord(client_id="c"), 0, "no lease"),
    (KEYS.ranks(RUN, "n0"), pb.NodeRanks(node="n0", ranks=[pb.RankStatus(rank=0), pb.RankStatus(rank=0)]), 0, "twice"),
    (KEYS.ranks(RUN, "n0"), pb.NodeRanks(node="n1"), 0, "rank table"),
    (KEYS.report(RUN, "agent.n0", "strategies"), pb.Report(participant="agent.n1", epoch=1, kind=2), 0, "participant"),
    (KEYS.report(RUN, "agent.n0", "strategies"), pb.Report(participant="agent.n0", epoch=1, kind=1), 0, "kind"),
    (KEYS.report(RUN, "agent.n0", "strategies"), pb.Report(participant="agent.n0", kind=2), 0, "epoch"),
    (KEYS.decision(RUN, 2), pb.Decision(epoch=3, strategy="exit"), 0, "decision epoch"),
    (KEYS.decision(RUN, 2), pb.Decision(epoch=2), 0, "no strategy"),
    (KEYS.command(RUN, "n0"), pb.Command(epoch=1, seq=1), 0, "action"),
    (KEYS.signal(RUN, 5), pb.Signal(seq=6, epoch=1), 0, "signal seq"),
    (KEYS.recovery(RUN), pb.Recovery(), 0, "epoch"),
    (KEYS.recovery(RUN), pb.Recovery(epoch=1, recovery_id=1, phase=99), 0, "phase"),  # type: ignore[arg-type]
    (KEYS.recovery(RUN), pb.Recovery(epoch=1, recovery_id=1, phase=6, faults=[pb.Fault(rank=9)]), 0, "rank 9"),  # type: ignore[arg-type]
    (KEYS.status(RUN), pb.JobStatus(uid="other", state=pb.JOB_FAILED), 0, "uid"),
]


@pytest.mark.parametrize(("key", "msg", "lease", "why"), INVALID)
def test_invalid_records_are_bad_records_with_a_reason(key: str, msg: Any, lease: int, why: str) -> None:
    with pytest.raises(BadRecord, match=why):
        _check(key, msg, lease)


@pytest.mark.parametrize("raw", [b"[]", b'"str"', b"1", b"null", b"{not json", b"\xff", b"[" * 50_000])
def test_what_is_not_a_json_object_is_a_bad_record(raw: bytes) -> None:
    with pytest.raises(BadRecord):
        decode(pb.Fault, raw)


def test_signal_keys_must_be_numbers() -> None:
    with pytest.raises(BadRecord, match="sequence number"):
        _check(KEYS.signals_prefix(RUN) + "zzz", pb.Signal(seq=1, epoch=1))


def test_values_over_the_cap_are_bad_before_parsing() -> None:
    kind = KEYS.parse(KEYS.ack(RUN, "n0")).kind
    check_size(kind, b"x" * MAX_VALUE_BYTES)
    with pytest.raises(BadRecord, match="cap"):
        check_size(kind, b"x" * (MAX_VALUE_BYTES + 1))


def test_spec_must_name_its_job_and_a_size() -> None:
    check_spec(pb.JobSpec(name="j", uid="r1", world_size=2, nnodes=1, nproc_per_node=2), "j")
    for bad in (
        pb.JobSpec(name="k", uid="r1", world_size=2, nnodes=1, nproc_per_node=2),
        pb.JobSpec(name="j", uid="r1"),
    ):
        with pytest.raises(BadRecord):
            check_spec(bad, "j")


def test_report_kind_names_are_the_key_segments() -> None:
    assert [report_kind_name(k) for k in (1, 2, 3)] == ["stop_complete", "strategies", "recover_status"]


def test_lists_in_records_are_bounded_by_the_job_size() -> None:
    cap = max_list(FRAME)
    stacks = [pb.RankStack(rank=1)] * cap
    _check(KEYS.fault(RUN, "f"), pb.Fault(fault_id="f", rank=1, stacks=stacks))
    with pytest.raises(BadRecord, match=f"lists {cap + 1} stacks: over the cap of {cap}"):
        _check(KEYS.fault(RUN, "f"), pb.Fault(fault_id="f", rank=1, stacks=[*stacks, pb.RankStack(rank=1)]))
    pids = pb.NodeRanks(node="n0", warm_spare_pids=[1] * (cap + 1))
    with pytest.raises(BadRecord, match="warm_spare_pids: over the cap"):
        _check(KEYS.ranks(RUN, "n0"), pids)


def test_no_value_over_the_decode_cap_is_parsed() -> None:
    with pytest.raises(BadRecord, match=r"over the \d+-byte cap"):
        decode(pb.Fault, b"{" + b" " * MAX_DECODE_BYTES + b"}")
