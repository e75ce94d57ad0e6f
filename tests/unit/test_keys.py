"""The keyspace: every key named by one module, parsed back, ids validated, no literals elsewhere."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from recoverd.errors import BadRecord
from recoverd.keys import DEFAULT_PREFIX, KeyKind, Keyspace, RunRef, check_id

ROOT = Path(__file__).resolve().parents[2]
KEYS = Keyspace()
RUN = RunRef("job-a", "20261129-abcd")
INBOX = {KeyKind.CLIENT, KeyKind.FAULT, KeyKind.REPORT}


@pytest.mark.parametrize(
    ("key", "kind", "name", "sub"),
    [
        (KEYS.status(RUN), KeyKind.STATUS, "", ""),
        (KEYS.recovery(RUN), KeyKind.RECOVERY, "", ""),
        (KEYS.history(RUN), KeyKind.HISTORY, "", ""),
        (KEYS.node(RUN, "n1"), KeyKind.NODE, "n1", ""),
        (KEYS.ranks(RUN, "n1"), KeyKind.RANKS, "n1", ""),
        (KEYS.fault(RUN, "n1.r2.g0.c0"), KeyKind.FAULT, "n1.r2.g0.c0", ""),
        (KEYS.report(RUN, "agent.n1", "stop_complete"), KeyKind.REPORT, "agent.n1", "stop_complete"),
        (KEYS.decision(RUN, 7), KeyKind.DECISION, "000000000007", ""),
        (KEYS.command(RUN, "n1"), KeyKind.COMMAND, "n1", ""),
        (KEYS.ack(RUN, "n1"), KeyKind.ACK, "n1", ""),
        (KEYS.signal(RUN, 3), KeyKind.SIGNAL, "000000000003", ""),
    ],
)
def test_every_run_key_parses_back(key: str, kind: KeyKind, name: str, sub: str) -> None:
    ref = KEYS.parse(key)
    assert (ref.kind, ref.job, ref.uid, ref.name, ref.sub) == (kind, RUN.job, RUN.uid, name, sub)
    assert KEYS.job_of(key) == RUN.job
    assert key.startswith(KEYS.run_inbox_prefix(RUN) if kind in INBOX else KEYS.run_prefix(RUN))


def test_global_and_job_keys_parse_back() -> None:
    assert KEYS.parse(KEYS.leader()).kind is KeyKind.LEADER
    assert KEYS.parse(KEYS.job_spec("job-a")).kind is KeyKind.JOB_SPEC
    event = KEYS.parse(KEYS.event(RUN, "000123-agent.n1-42-0000000001"))
    assert (event.kind, event.job, event.uid) == (KeyKind.EVENT, "job-a", RUN.uid)
    # Events live outside jobs/ so writing one never wakes the jobs/ watchers.
    assert not KEYS.event(RUN, "x1").startswith(KEYS.jobs_prefix())
    assert KEYS.job_of(KEYS.event(RUN, "x1")) is None


@pytest.mark.parametrize("bad", ["", "a/b", "-lead", ".hidden", "a b", "x" * 254, "ü"])
def test_invalid_ids_are_rejected(bad: str) -> None:
    with pytest.raises(BadRecord):
        check_id("job", bad)
    with pytest.raises(BadRecord):
        KEYS.job_spec(bad)


@pytest.mark.parametrize(
    "key",
    [
        "/elsewhere/jobs/a/spec",
        f"{DEFAULT_PREFIX}/jobs/a",
        f"{DEFAULT_PREFIX}/jobs/a/runs/u1/bogus",
        f"{DEFAULT_PREFIX}/jobs/a/runs/u1/nodes",
        f"{DEFAULT_PREFIX}/jobs/a/runs/u1/nodes/n1/extra",
        f"{DEFAULT_PREFIX}/jobs/a/runs/u1/reports/agent.n1",
        f"{DEFAULT_PREFIX}/jobs/a b/spec",
        f"{DEFAULT_PREFIX}/nothing",
    ],
)
def test_keys_outside_the_schema_are_rejected(key: str) -> None:
    with pytest.raises(BadRecord):
        KEYS.parse(key)


def test_job_of_finds_the_job_of_a_malformed_key() -> None:
    assert KEYS.job_of(f"{DEFAULT_PREFIX}/jobs/a/runs/u1/bogus/x") == "a"
    assert KEYS.job_of(f"{DEFAULT_PREFIX}/jobs/bad job/spec") is None
    assert KEYS.job_of("/other/jobs/a/spec") is None


@pytest.mark.parametrize("prefix", ["recoverd", "/recoverd/", "/a//b", ""])
def test_invalid_prefixes_are_rejected(prefix: str) -> None:
    with pytest.raises(BadRecord):
        Keyspace(prefix)


def test_a_custom_prefix_moves_every_key() -> None:
    keys = Keyspace("/team-a/recoverd")
    assert keys.recovery(RUN).startswith("/team-a/recoverd/jobs/job-a/runs/")
    assert keys.parse(keys.recovery(RUN)).kind is KeyKind.RECOVERY


def _code_strings(source: str) -> list[str]:
    """String literals in code (docstrings excluded: prose may name keys for the reader)."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_module_but_keys_py_builds_key_strings() -> None:
    """One keyspace module: the layout's literals appear in no other module's code."""
    offenders = []
    literals = (
        "/recoverd/v1",
        '"jobs/',
        "'jobs/",
        "/runs/",
        "/faults/",
        "/reports/",
        "/commands/",
        "leader/coordinator",
    )
    for path in [*ROOT.joinpath("libs").rglob("*.py"), *ROOT.joinpath("services").rglob("*.py")]:
        if path.name == "keys.py" or path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        strings = _code_strings(path.read_text())
        offenders += [f"{path.relative_to(ROOT)}: {lit}" for lit in literals if any(lit in s for s in strings)]
    assert offenders == []


def test_what_ranks_write_lives_in_the_runs_inbox_and_nowhere_else() -> None:
    """One static key range per job (``jobs/<job>/inbox/``) holds what a rank may write, so etcd's
    per-job client role can grant it without granting the coordinator's records (docs/security.md)."""
    inbox = KEYS.inbox_prefix(RUN.job)
    for key in (KEYS.client(RUN, "c1"), KEYS.fault(RUN, "f1"), KEYS.report(RUN, "agent.n1", "strategies")):
        assert key.startswith(KEYS.run_inbox_prefix(RUN)) and key.startswith(inbox)
    for key in (KEYS.status(RUN), KEYS.recovery(RUN), KEYS.command(RUN, "n1"), KEYS.job_spec(RUN.job)):
        assert not key.startswith(inbox)
    moved = KEYS.client(RUN, "c1").replace("/inbox/", "/runs/")
    with pytest.raises(BadRecord, match="live under inbox/"):
        KEYS.parse(moved)
    with pytest.raises(BadRecord, match="live under runs/"):
        KEYS.parse(KEYS.status(RUN).replace("/runs/", "/inbox/"))
