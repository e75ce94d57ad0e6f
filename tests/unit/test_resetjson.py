"""reset.json: every writer's shape parses, round trips, and every defect is a precise BadRecord."""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recoverd import resetjson
from recoverd.errors import BadRecord, Reason
from recoverd.resetjson import MAX_BYTES, RankEntry, RankStatus, ResetState, dumps, parse, read_file, write_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "reset_json"
WELL_FORMED = ["fault", "unrecovered", "recovered", "failed", "flushing", "clear", "reschedule", "seed", "legacy"]
# Written exactly as dumps writes them (Go's compact marshalling, ErrorCode as [] not null).
CANONICAL = ["unrecovered", "recovered", "failed", "flushing", "clear"]


def fixture(name: str) -> str:
    return (FIXTURES / name / "reset.json").read_text()


# ------------------------------------------------------------------------------- writer shapes


def test_clusterd_fault_list() -> None:
    state = parse(fixture("fault"))
    assert state.fault_ranks() == (8, 9)
    assert state.recovered_ranks() == ()
    assert state.restart_fault_process is True
    assert state.fault_flushing is False
    entry = state.entry(8)
    assert entry == RankEntry(rank_id=8, status=RankStatus.FAULT)  # null ErrorCode is the empty list
    assert state.entry(7) is None


def test_device_plugin_hot_reset() -> None:
    unrecovered = parse(fixture("unrecovered"))
    assert unrecovered.unrecovered_ranks() == unrecovered.fault_ranks() == (0, 1)
    assert unrecovered.retry_time == 1
    chip = unrecovered.entry(1)
    assert chip is not None
    assert (chip.logic_id, chip.policy, chip.initial_policy) == (1, "reset", "reset")
    assert (chip.error_code, chip.error_code_hex) == ((), "8C03A000")

    recovered = parse(fixture("recovered"))
    assert recovered.recovered_ranks() == (0, 1)
    assert recovered.fault_ranks() == recovered.unrecovered_ranks() == ()

    failed = parse(fixture("failed"))
    assert failed.recovered_ranks() == (0,)
    assert failed.fault_ranks() == ()
    assert failed.entry(1) == RankEntry(
        rank_id=1,
        logic_id=1,
        status=RankStatus.FAILED,
        policy="isolate",
        initial_policy="reset",
        error_code_hex="8C03A000",
    )


def test_clusterd_flushing_and_clear() -> None:
    flushing = parse(fixture("flushing"))
    assert flushing.fault_flushing is True
    assert flushing.rank_list == ()
    clear = parse(fixture("clear"))
    assert clear.fault_flushing is False
    assert clear.rank_list == ()
    assert clear.retry_time == 1


def test_volcano_reschedule_with_nil_rank_list() -> None:
    state = parse(fixture("reschedule"))
    assert state.rank_list == ()
    assert (state.retry_time, state.graceful_exit) == (0, 1)


def test_seed_is_the_empty_state() -> None:
    assert parse(fixture("seed")) == ResetState()
    assert parse(resetjson.SEED) == ResetState()
    assert parse(b'{"status": "initializing"}') == ResetState()


def test_legacy_shape_missing_keys_nulls_and_unsorted() -> None:
    state = parse(fixture("legacy"))
    assert [entry.rank_id for entry in state.rank_list] == [1, 100]
    assert state.fault_ranks() == (1, 100)
    assert state.entry(1) == RankEntry(
        rank_id=1, logic_id=1, status=RankStatus.FAULT, policy="reset", error_code=(2350031360,)
    )
    assert (state.fault_flushing, state.graceful_exit, state.restart_fault_process) == (False, 0, False)


def test_missing_keys_take_go_zero_values_and_unknown_keys_are_ignored() -> None:
    state = parse('{"RankList":[{"RankId":4,"Status":"fault","Extra":{"x":1}}],"NewKey":[1,2]}')
    assert state == ResetState(rank_list=(RankEntry(rank_id=4, status=RankStatus.FAULT),))
    assert parse("{}") == ResetState()
    nulls = '{"RankList":null,"UpdateTime":null,"RetryTime":null,"FaultFlushing":null,"RestartFaultProcess":null}'
    assert parse(nulls) == ResetState()


# ----------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", WELL_FORMED)
def test_fixture_round_trips(name: str) -> None:
    state = parse(fixture(name))
    text = dumps(state)
    assert parse(text) == state
    assert dumps(parse(text)) == text


@pytest.mark.parametrize("name", CANONICAL)
def test_dumps_matches_go_marshalling(name: str) -> None:
    text = fixture(name).rstrip("\n")
    assert dumps(parse(text)) == text


def test_dumps_emits_every_key_in_go_order() -> None:
    doc = json.loads(dumps(ResetState(rank_list=(RankEntry(rank_id=0, status=RankStatus.FAULT),))))
    assert list(doc) == ["RankList", "UpdateTime", "RetryTime", "FaultFlushing", "GracefulExit", "RestartFaultProcess"]
    assert list(doc["RankList"][0]) == [
        "RankId",
        "LogicId",
        "Status",
        "Policy",
        "InitialPolicy",
        "ErrorCode",
        "ErrorCodeHex",
    ]
    assert doc["FaultFlushing"] is False  # JSON booleans, never Python's True/False
    assert " " not in dumps(ResetState())


def _entries() -> st.SearchStrategy[tuple[RankEntry, ...]]:
    entry = st.builds(
        RankEntry,
        rank_id=st.integers(0, 2**63 - 1),
        logic_id=st.integers(-(2**31), 2**31 - 1),
        status=st.sampled_from(RankStatus),
        policy=st.text(),
        initial_policy=st.text(),
        error_code=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4).map(tuple),
        error_code_hex=st.text(),
    )
    return st.lists(entry, max_size=8, unique_by=lambda e: e.rank_id).map(
        lambda entries: tuple(sorted(entries, key=lambda e: e.rank_id))
    )


STATES = st.builds(
    ResetState,
    rank_list=_entries(),
    update_time=st.integers(-(2**63), 2**63 - 1),
    retry_time=st.integers(-(2**63), 2**63 - 1),
    fault_flushing=st.booleans(),
    graceful_exit=st.integers(-(2**63), 2**63 - 1),
    restart_fault_process=st.booleans(),
)


@given(STATES)
def test_generated_states_round_trip(state: ResetState) -> None:
    text = dumps(state)
    assert parse(text) == state
    assert parse(text.encode()) == state
    assert dumps(parse(text)) == text


@given(STATES, st.randoms(use_true_random=False))
def test_rank_list_order_in_the_document_does_not_matter(state: ResetState, rnd: random.Random) -> None:
    doc = json.loads(dumps(state))
    rnd.shuffle(doc["RankList"])
    assert parse(json.dumps(doc, indent=1)) == state


def test_state_invariants_are_checked_on_construction() -> None:
    a, b = RankEntry(rank_id=1, status=RankStatus.FAULT), RankEntry(rank_id=2, status=RankStatus.FAULT)
    with pytest.raises(ValueError, match="sorted"):
        ResetState(rank_list=(b, a))
    with pytest.raises(ValueError, match="sorted"):
        ResetState(rank_list=(a, a))
    with pytest.raises(ValueError, match="negative"):
        RankEntry(rank_id=-1, status=RankStatus.FAULT)
    with pytest.raises(ValueError):
        RankEntry(rank_id=1, status="initializing")  # type: ignore[arg-type]
    assert RankEntry(rank_id=1, status="fault").status is RankStatus.FAULT  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.rank_id = 3  # type: ignore[misc]


# ------------------------------------------------------------------------------------ malformed

MALFORMED = {
    "truncated": r"not valid JSON: .* at line 2 column 1 \(char 61\); the document ends there \(truncated\?\)",
    "empty": r"empty document",
    "top_array": r"top level is array, expected an object",
    "seed_other": r"top-level status is 'ready'; only the seed .* has one",
    "duplicate_key": r"key 'RetryTime' appears twice in one JSON object",
    "nan": r"NaN is not JSON",
    "ranklist_object": r"RankList must be an array, found object \{",
    "entry_string": r'RankList\[0\] must be an object, found string "1"',
    "rankid_string": r'RankList\[0\]\.RankId must be an integer, found string "1"',
    "rankid_bool": r"RankList\[0\]\.RankId must be an integer, found boolean true",
    "rankid_missing": r"RankList\[0\] has no RankId",
    "rankid_negative": r"RankList\[0\]\.RankId is -1; a rank id is never negative",
    "rankid_duplicate": r"RankList has RankId 1 twice \(entries 0 and 2\)",
    "rankid_huge": r"RankList\[0\]\.RankId is 9223372036854775808, outside the int64 range",
    "logicid_float": r"RankList\[0\] \(RankId 1\)\.LogicId must be an integer, found number 1\.0",
    "logicid_int32": r"RankList\[0\] \(RankId 1\)\.LogicId is 2147483648, outside the int32 range",
    "status_unknown": r"RankList\[0\] \(RankId 1\)\.Status is 'initializing'; expected one of unrecovered, recovered, "
    r"failed, fault",
    "status_missing": r"RankList\[0\] \(RankId 1\) has no Status",
    "status_number": r"RankList\[0\] \(RankId 1\)\.Status must be a string, found number 2",
    "errorcode_string": r'RankList\[0\] \(RankId 1\)\.ErrorCode must be an array, found string "8C03A000"',
    "errorcode_item": r'RankList\[0\] \(RankId 1\)\.ErrorCode\[1\] must be an integer, found string "2"',
    "policy_number": r"RankList\[0\] \(RankId 1\)\.Policy must be a string, found number 1",
    "faultflushing_string": r'FaultFlushing must be a boolean, found string "true"',
    "faultflushing_int": r"FaultFlushing must be a boolean, found number 1",
    "restartfaultprocess_python": r"not valid JSON: Expecting value at line 1 column \d+",
    "retrytime_string": r'RetryTime must be an integer, found string "0"',
    "gracefulexit_bool": r"GracefulExit must be an integer, found boolean false",
}


def test_every_malformed_fixture_has_an_expected_message() -> None:
    assert sorted(p.stem for p in (FIXTURES / "malformed").iterdir()) == sorted(MALFORMED)


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_fixture_is_a_bad_record_with_a_precise_message(name: str) -> None:
    path = FIXTURES / "malformed" / f"{name}.json"
    with pytest.raises(BadRecord) as caught:
        parse(path.read_bytes(), source=str(path))
    assert caught.value.reason is Reason.BAD_RECORD
    assert caught.value.detail.startswith(f"{path}: ")
    assert re.search(MALFORMED[name], caught.value.detail), caught.value.detail
    with pytest.raises(BadRecord, match=re.escape(str(path))):
        read_file(str(path))


def _huge_document() -> bytes:
    entry = RankEntry(rank_id=0, status=RankStatus.UNRECOVERED, error_code_hex="8C03A000" * 8)
    count = MAX_BYTES // 64  # each entry is well over 64 bytes
    entries = tuple(dataclasses.replace(entry, rank_id=i) for i in range(count))
    return dumps(ResetState(rank_list=entries)).encode()


def test_huge_document_is_refused(tmp_path: Path) -> None:
    raw = _huge_document()
    assert len(raw) > MAX_BYTES
    with pytest.raises(BadRecord, match=rf"{len(raw)} bytes is larger than the {MAX_BYTES}-byte limit"):
        parse(raw)
    with pytest.raises(BadRecord, match="at least 1048577 bytes is larger than"):
        parse(" " * (MAX_BYTES + 1))
    with pytest.raises(BadRecord, match="larger than the 100-byte limit"):
        parse(fixture("unrecovered"), max_bytes=100)
    with pytest.raises(BadRecord, match="102 bytes is larger than the 101-byte limit"):
        parse("\u00e9" * 51, max_bytes=101)  # 51 characters, 102 bytes of UTF-8
    path = tmp_path / "reset.json"
    path.write_bytes(raw)
    # read_file reads one byte past the limit and no more.
    with pytest.raises(BadRecord, match=rf"{path}: {MAX_BYTES + 1} bytes is larger than"):
        read_file(str(path))


def test_other_undecodable_input() -> None:
    with pytest.raises(BadRecord, match=r"not UTF-8 \(invalid start byte at byte 1\)"):
        parse(b'{\xff"RankList":[]}')
    with pytest.raises(BadRecord, match="nested too deeply"):
        parse("[" * 200_000)
    with pytest.raises(BadRecord, match="not valid JSON: Extra data"):
        parse('{"RankList":[]} {}')


def test_a_late_defect_rejects_the_whole_document() -> None:
    doc = json.loads(fixture("unrecovered"))
    doc["RankList"].append({"RankId": 7, "Status": "bogus"})
    with pytest.raises(BadRecord, match=r"RankList\[2\] \(RankId 7\)\.Status is 'bogus'"):
        parse(json.dumps(doc))


# ----------------------------------------------------------------------------------------- edge


def test_read_and_write_file(tmp_path: Path) -> None:
    path = str(tmp_path / "reset.json")
    assert read_file(path) is None
    state = parse(fixture("fault"))
    write_file(path, state)
    assert read_file(path) == state
    assert Path(path).read_text() == dumps(state)
    newer = dataclasses.replace(state, retry_time=state.retry_time + 1, fault_flushing=True)
    write_file(path, newer)
    assert read_file(path) == newer
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reset.json"]  # no temp file left behind
