"""The gateway's caller table (services/gateway/callers.py): the file's checks and the decision.

The decision against real calls (tokens in metadata, client certificates over mutual TLS) is
tested in tests/integration/test_gateway.py; here the rules alone.
"""

from __future__ import annotations

import hashlib

import grpc
import pytest

from recoverd.errors import ConfigError
from recoverd.gateway.callers import Allowed, Denied, is_loopback, parse

TOKEN = hashlib.sha256(b"secret-a").hexdigest()
TABLE = parse(
    {
        "callers": [
            {"name": "team-a", "token_sha256": TOKEN, "jobs": ["a"]},
            {"certificate": "taskd-b", "jobs": ["b"]},
            {"name": "ops", "certificate": "ops", "jobs": ["*"]},
        ]
    }
)


@pytest.mark.parametrize(
    ("token", "names", "job", "expected"),
    [
        ("secret-a", [], "a", "team-a"),
        ("secret-a", [], "b", grpc.StatusCode.PERMISSION_DENIED),
        ("secret-a", ["ops"], "b", grpc.StatusCode.PERMISSION_DENIED),  # the token decides
        ("guess", ["ops"], "a", grpc.StatusCode.UNAUTHENTICATED),  # a wrong token is not rescued
        (None, ["taskd-b"], "b", "taskd-b"),
        (None, ["taskd-b"], "a", grpc.StatusCode.PERMISSION_DENIED),
        (None, ["unknown", "ops"], "any-job", "ops"),  # a SAN the file lists
        (None, ["unknown"], "a", grpc.StatusCode.UNAUTHENTICATED),
        (None, [], "a", grpc.StatusCode.UNAUTHENTICATED),
    ],
)
def test_a_caller_acts_only_on_its_jobs(token: str | None, names: list[str], job: str, expected: object) -> None:
    verdict = TABLE.authorize(token, names, job)
    if isinstance(expected, str):
        assert isinstance(verdict, Allowed) and verdict.caller is not None and verdict.caller.name == expected
    else:
        assert isinstance(verdict, Denied) and verdict.code == expected and job in verdict.detail


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "'callers' list"),
        ({"callers": [{"jobs": ["a"]}]}, "exactly one of token_sha256 and certificate"),
        ({"callers": [{"certificate": "x", "token_sha256": TOKEN, "jobs": ["a"]}]}, "exactly one"),
        ({"callers": [{"token_sha256": "abc", "jobs": ["a"]}]}, "64 hex digits"),
        ({"callers": [{"certificate": "x", "jobs": []}]}, "non-empty list"),
        ({"callers": [{"certificate": "x", "jobs": ["a/b"]}]}, "invalid job id"),
        ({"callers": [{"certificate": "x", "jobs": ["a"], "role": "admin"}]}, "unknown field(s) role"),
        ({"callers": [{"certificate": "x", "jobs": ["a"]}, {"certificate": "x", "jobs": ["b"]}]}, "listed twice"),
    ],
)
def test_a_bad_auth_file_is_a_clear_error(data: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(data)


@pytest.mark.parametrize(
    ("listen", "loopback"),
    [
        ("127.0.0.1:8899", True),
        ("localhost:8899", True),
        ("[::1]:8899", True),
        ("127.0.0.2:1", True),
        ("0.0.0.0:8899", False),
        ("[::]:8899", False),
        ("10.0.0.5:8899", False),
        ("gateway.example:8899", False),
    ],
)
def test_loopback_addresses(listen: str, loopback: bool) -> None:
    assert is_loopback(listen) is loopback
