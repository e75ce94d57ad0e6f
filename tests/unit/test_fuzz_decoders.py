"""Property tests of every decoder and validator on hostile input: random bytes, random JSON, JSON
shaped like each record with random values, and random keys. The only error allowed out of them is
BadRecord (bad input, recorded by the caller); anything else is a crash.

Figures: the case counts go to tests/fuzzstats.py and are printed at the end of the run.
"""

from __future__ import annotations

import json
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recoverd.coordinator.codec import fault_from_pb, recovery_from_pb, recovery_to_pb
from recoverd.errors import BadRecord
from recoverd.jobview import RECORD_CLASSES
from recoverd.keys import KeyKind, Keyspace, RunRef
from recoverd.records import decode, encode, pb
from recoverd.strategy.service import request_from_records
from recoverd.validate import JobFrame, check_record, check_size, check_spec
from tests.fuzzstats import record

KEYS = Keyspace("/fz/v1")
_RUN = RunRef("j", "r")
FRAME = JobFrame("j", "r", world_size=8, nnodes=2)
SPEC = pb.JobSpec(name="j", uid="r", world_size=8, nnodes=2, nproc_per_node=4, policy=pb.Policy(strategies=["exit"]))
CLASSES: dict[KeyKind, type[Any]] = RECORD_CLASSES


def fast(cases: int) -> settings:
    return settings(
        max_examples=cases, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
    )


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=16)
    | st.sampled_from(["PHASE_DONE", "PHASE_STOPPING", "RANK_RUNNING", "REPORT_STRATEGIES", "x", "1", "-1", "1e99"])
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=16,
)


def _key_for(kind: KeyKind, name: str, sub: str = "") -> str:
    run = KEYS.run_prefix(_RUN)
    if kind in (KeyKind.STATUS, KeyKind.RECOVERY, KeyKind.HISTORY):
        return f"{run}{kind.value}"
    if kind is KeyKind.REPORT:
        return f"{run}{kind.value}/{name}/{sub}"
    return f"{run}{kind.value}/{name}"


names = st.sampled_from(["n0", "n1", "x", "agent.n0", "000000000001", "7", "zzz", ""]) | st.text(max_size=6)


def _check(kind: KeyKind, raw: bytes, key: str, lease: int = 1) -> None:
    """Run one value through the whole read path of its kind; only BadRecord may come out."""
    try:
        ref = KEYS.parse(key)
        check_size(kind, raw)
        msg = decode(CLASSES[kind], raw, key)
        check_record(ref, msg, lease, FRAME)
    except BadRecord:
        return
    # Valid: what consumes it must not crash either.
    if kind is KeyKind.RECOVERY:
        rec = recovery_from_pb(msg)
        assert recovery_from_pb(recovery_to_pb(rec)) == rec
        request_from_records(SPEC, msg, None, time.time())
    elif kind is KeyKind.FAULT:
        fault_from_pb(msg)
    encode(msg)


@fast(250)
@given(kind=st.sampled_from(sorted(CLASSES)), raw=st.binary(max_size=64), name=names, sub=names)
def test_random_bytes_are_bad_records_never_crashes(kind: KeyKind, raw: bytes, name: str, sub: str) -> None:
    record("decoders: random bytes")
    _check(kind, raw, _key_for(kind, name, sub))


@fast(250)
@given(kind=st.sampled_from(sorted(CLASSES)), value=json_values, name=names, sub=names, lease=st.sampled_from([0, 7]))
def test_random_json_is_bad_records_never_crashes(kind: KeyKind, value: Any, name: str, sub: str, lease: int) -> None:
    record("decoders: random JSON")
    _check(kind, json.dumps(value).encode(), _key_for(kind, name, sub), lease)


@st.composite
def shaped(draw: st.DrawFn) -> tuple[KeyKind, dict[str, Any]]:
    """A JSON object with a record's own field names and random values: reaches the validators."""
    kind = draw(st.sampled_from(sorted(CLASSES)))
    fields = [f.name for f in CLASSES[kind].DESCRIPTOR.fields]
    values = (
        st.integers(min_value=-3, max_value=12)
        | st.sampled_from(["n0", "r", "x", "agent.n0", "stop_complete"])
        | json_values
    )
    obj = draw(st.dictionaries(st.sampled_from(fields), values, max_size=len(fields)))
    return kind, obj


@fast(300)
@given(case=shaped(), name=names, sub=st.sampled_from(["stop_complete", "strategies", "recover_status", "x"]))
def test_record_shaped_json_with_random_values_never_crashes(
    case: tuple[KeyKind, dict[str, Any]], name: str, sub: str
) -> None:
    record("decoders: record-shaped JSON")
    kind, obj = case
    _check(kind, json.dumps(obj).encode(), _key_for(kind, name, sub))


@fast(200)
@given(
    tail=st.text(max_size=40) | st.binary(max_size=40).map(lambda b: b.decode("utf-8", "surrogateescape")),
    root=st.sampled_from(
        ["/fz/v1/", "/fz/v1/jobs/", "/fz/v1/jobs/j/", "/fz/v1/jobs/j/runs/r/", "/fz/v1/events/", "/x"]
    ),
)
def test_random_keys_parse_or_are_bad_records(tail: str, root: str) -> None:
    record("decoders: random keys")
    key = root + tail
    KEYS.job_of(key)
    KEYS.job_of(key.encode("utf-8", "surrogateescape"))
    try:
        KEYS.parse(key)
        KEYS.parse(key.encode("utf-8", "surrogateescape"))
    except BadRecord:
        pass


@fast(100)
@given(value=json_values)
def test_random_specs_are_bad_records_never_crashes(value: Any) -> None:
    record("decoders: job specs")
    try:
        check_spec(decode(pb.JobSpec, json.dumps(value).encode(), "spec"), "j")
    except BadRecord:
        pass
