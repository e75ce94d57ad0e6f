"""Command-line value types: a lease TTL etcd cannot grant is refused with the reason; one default."""

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


def test_every_entry_point_defaults_to_the_same_agent_lease() -> None:
    """One default (docs/adr/0025): the least TTL a stock etcd grants, 2 s."""
    from recoverd.agent.msrun import MsrunLayout
    from recoverd.agent.plugin import settings_from_env
    from recoverd.agent.settings import DEFAULT_LEASE_TTL_S, AgentSettings
    from recoverd.cli import adopt

    assert DEFAULT_LEASE_TTL_S == 2
    parser = build_parser()
    agent = parser.parse_args(["agent", "--job", "j", "--nproc-per-node", "1", "--", "true"])
    run = parser.parse_args(["run", "--nproc-per-node", "1", "--", "true"])
    adopted = adopt.build_parser().parse_args(["--pids", "1"])
    plugin = settings_from_env({"RECOVERD_JOB": "j", "RECOVERD_ETCD": "h:1"}, MsrunLayout(1, 1, 0))
    settings = AgentSettings(job="j", node="n", argv=("true",), etcd="h:1")
    assert agent.agent_lease_ttl == run.agent_lease_ttl == adopted.agent_lease_ttl == DEFAULT_LEASE_TTL_S
    assert plugin.lease_ttl_s == settings.lease_ttl_s == DEFAULT_LEASE_TTL_S


def test_adopt_takes_the_ranks_identity_from_its_flags_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """As `recoverd agent` does: ``--rank-etcd-*``, else ``$RECOVERD_RANK_ETCD_*`` (docs/security.md)."""
    from recoverd.cli import adopt

    monkeypatch.setenv("RECOVERD_RANK_ETCD_CERT", "/certs/rank.pem")
    monkeypatch.setenv("RECOVERD_RANK_ETCD_KEY", "/certs/rank-key.pem")
    monkeypatch.delenv("RECOVERD_RANK_ETCD_USER", raising=False)
    args = adopt.build_parser().parse_args(["--pids", "1", "--rank-etcd-key", "/other/key.pem"])
    assert (args.rank_etcd_cert, args.rank_etcd_key, args.rank_etcd_user) == ("/certs/rank.pem", "/other/key.pem", None)


def test_the_warm_start_wait_has_one_default_and_refuses_a_negative_value(capsys: pytest.CaptureFixture[str]) -> None:
    """``--warm-start-wait`` (docs/adr/0039): the flag's default is the settings' own; below 0 is an error."""
    from recoverd.agent.settings import AgentSettings
    from recoverd.errors import ConfigError

    parser = build_parser()
    run = parser.parse_args(["run", "--nproc-per-node", "1", "--", "true"])
    assert run.warm_start_wait == AgentSettings(job="j", node="n", argv=("true",), etcd="h:1").warm_start_wait_s == 30
    assert (
        parser.parse_args(["run", "--nproc-per-node", "1", "--warm-start-wait", "0", "--", "true"]).warm_start_wait == 0
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["agent", "--job", "j", "--warm-start-wait", "-1", "--", "true"])
    assert "--warm-start-wait" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="warm-start wait"):
        AgentSettings(job="j", node="n", argv=("true",), etcd="h:1", warm_start_wait_s=-1)
