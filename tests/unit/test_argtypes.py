"""Command-line value types: a lease TTL etcd cannot grant is refused with the reason."""

from __future__ import annotations

import argparse

import pytest

from recoverd.argtypes import lease_ttl
from recoverd.cli.main import build_parser


@pytest.mark.parametrize("text", ["0", "0.5", "1.5", "-1", "soon"])
def test_a_lease_ttl_that_is_no_whole_number_of_seconds_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        lease_ttl(text)


def test_whole_seconds_are_taken() -> None:
    assert lease_ttl("1") == 1 and lease_ttl("5.0") == 5


def test_the_agent_flag_refuses_half_a_second(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["agent", "--job", "j", "--agent-lease-ttl", "0.5", "--", "true"])
    assert "whole seconds" in capsys.readouterr().err
