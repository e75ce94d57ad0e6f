"""How TLS files, users and passwords for etcd are taken (flags > RECOVERD_ETCD_* > ETCDCTL_*) and
checked before anything connects: every mistake a clear ConfigError, no secret in a message or repr.

Pure logic and files on disk; the connections themselves are tested against a real TLS etcd in
tests/integration/test_security.py.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recoverd import etcd_security
from recoverd.errors import ConfigError
from recoverd.etcd_security import EtcdSecurity, endpoint_scheme, from_env
from recoverd.store import Store, parse_endpoints

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.fixture
def pem(tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    path.write_text(PEM)
    return str(path)


def _args(**given: str | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    etcd_security.add_arguments(parser)
    argv: list[str] = []
    for name, value in given.items():
        argv += [f"--etcd-{name.replace('_', '-')}", str(value)]
    return parser.parse_args(argv)


def test_flags_win_over_our_variables_which_win_over_etcdctls(pem: str, tmp_path: Path) -> None:
    other = tmp_path / "other.pem"
    other.write_text(PEM)
    env = {"RECOVERD_ETCD_CACERT": str(other), "ETCDCTL_CACERT": "/nonexistent", "ETCDCTL_CERT": pem}
    assert from_env(env).cacert == str(other)
    assert from_env(env).cert == pem  # etcdctl's where ours is unset
    assert etcd_security.from_args(_args(cacert=pem), {**env, "ETCDCTL_KEY": pem}).cacert == pem


def test_an_empty_variable_of_ours_means_none_and_stops_the_etcdctl_fallback() -> None:
    assert from_env({"RECOVERD_ETCD_CACERT": "", "ETCDCTL_CACERT": "/etc/ca.pem"}).cacert is None


def test_etcdctls_name_password_user_form_is_split(tmp_path: Path) -> None:
    sec = from_env({"ETCDCTL_USER": "alice:s3cret"})
    assert (sec.user, sec.password) == ("alice", "s3cret")
    assert "s3cret" not in repr(sec) and "s3cret" not in sec.describe()


def test_a_password_file_is_read_at_connect_time_first_line_only(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    path.write_text("hunter2\n")
    sec = etcd_security.from_args(_args(user="alice", password_file=str(path)), {})
    assert sec.read_password() == "hunter2"
    assert "hunter2" not in repr(sec)


@pytest.mark.parametrize(
    ("given", "env", "message"),
    [
        ({"cert": "PEM"}, {}, "--etcd-cert needs --etcd-key"),
        ({"key": "PEM"}, {}, "--etcd-key needs --etcd-cert"),
        ({"cacert": "/nonexistent/ca.pem"}, {}, "cannot read it"),
        ({"cacert": "NOTPEM"}, {}, "not a PEM file"),
        ({"user": "alice"}, {}, "needs a password"),
        ({"password_file": "PW"}, {}, "without a user"),
        ({}, {"RECOVERD_ETCD_PASSWORD": "x"}, "without a user"),
        ({"user": "alice", "password_file": "EMPTY"}, {}, "is empty"),
        ({"user": "alice", "password_file": "/nonexistent/pw"}, {}, "cannot read the etcd password file"),
    ],
)
def test_every_mistake_is_a_clear_config_error(
    given: dict[str, str], env: dict[str, str], message: str, pem: str, tmp_path: Path
) -> None:
    (tmp_path / "pw").write_text("pw\n")
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "notpem").write_text("hello")
    files = {
        "PEM": pem,
        "PW": str(tmp_path / "pw"),
        "EMPTY": str(tmp_path / "empty"),
        "NOTPEM": str(tmp_path / "notpem"),
    }
    given = {k: files.get(v, v) for k, v in given.items()}
    with pytest.raises(ConfigError, match=message):
        etcd_security.from_args(_args(**given), env)


@pytest.mark.parametrize(
    ("text", "scheme"),
    [
        ("https://a:1", "https"),
        ("HTTPS://a:1,https://b:2", "https"),
        ("http://a:1", "http"),
        ("a:1,b:2", None),
        ("etcd://a:1", None),
    ],
)
def test_the_endpoint_scheme(text: str, scheme: str | None) -> None:
    assert endpoint_scheme(text) == scheme
    assert parse_endpoints(text)  # https:// parses now: TLS is the Store's business


def test_mixing_https_with_plaintext_endpoints_is_refused() -> None:
    with pytest.raises(ConfigError, match="mix https://"):
        endpoint_scheme("https://a:1,b:2")


def test_an_https_endpoint_without_a_ca_is_refused_never_connected_in_plaintext() -> None:
    with pytest.raises(ConfigError, match="no CA was given") as caught:
        Store("https://etcd.local:2379", security=EtcdSecurity())
    assert "never connects in plaintext" in str(caught.value)


def test_tls_files_with_an_explicit_http_endpoint_are_refused(pem: str) -> None:
    with pytest.raises(ConfigError, match="is http:// \\(plaintext\\) but TLS files were given"):
        Store("http://a:1", security=EtcdSecurity(cacert=pem))


def test_tls_files_with_a_bare_endpoint_ask_for_tls(pem: str) -> None:
    assert Store("a:1", security=EtcdSecurity(cacert=pem)).tls
    assert not Store("a:1", security=EtcdSecurity()).tls


def test_the_store_takes_the_environment_by_default(pem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECOVERD_ETCD_CACERT", pem)
    assert Store("a:1").tls


def test_a_rank_gets_paths_never_the_password(tmp_path: Path, pem: str) -> None:
    sec = EtcdSecurity(cacert=pem, cert=pem, key=pem, user="alice", password="s3cret")
    env = sec.rank_env()
    assert env["RECOVERD_ETCD_CACERT"] == pem and env["RECOVERD_ETCD_USER"] == "alice"
    assert "s3cret" not in "".join(env.values())
    assert env["RECOVERD_ETCD_PASSWORD_FILE"] == ""
    assert set(EtcdSecurity().rank_env().values()) == {""}  # all set, all empty: no etcdctl fall-back


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "recoverd.cli.main", "coordinator", "--etcd", "https://127.0.0.1:1"],
        ["-m", "recoverd.cli.ctl", "--etcd", "https://127.0.0.1:1", "status", "job"],
    ],
)
def test_services_and_recoverctl_refuse_https_without_a_ca_with_exit_2(argv: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECOVERD_ETCD", "ETCDCTL_"))}
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2, done.stderr
    assert "no CA was given" in done.stderr and "never connects in plaintext" in done.stderr


def test_the_embedded_etcd_refuses_tls_flags_it_cannot_use(pem: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "recoverd.cli.main", "up", "--etcd-cacert", pem],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "is for an etcd given with --etcd" in done.stderr


def test_a_password_file_others_can_read_is_warned_about_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "agent.pw"
    path.write_text("secret\n")
    path.chmod(0o600)
    with caplog.at_level("WARNING", logger="recoverd.etcd_security"):
        assert EtcdSecurity(user="u", password_file=str(path)).read_password() == "secret"
    assert not caplog.records
    path.chmod(0o644)
    with caplog.at_level("WARNING", logger="recoverd.etcd_security"):
        EtcdSecurity(user="u", password_file=str(path)).read_password()
        EtcdSecurity(user="u", password_file=str(path)).read_password()
    assert len(caplog.records) == 1, caplog.records
    text = caplog.records[0].getMessage()
    assert f"{path} can be read by every user (mode 644)" in text and "chmod 600" in text and "secret" not in text


def test_ranks_get_the_client_identity_given_and_never_the_agents_user(tmp_path: Path, pem: str) -> None:
    pw = tmp_path / "pw"
    pw.write_text("x\n")
    pw.chmod(0o600)
    agent = EtcdSecurity(cacert=pem, cert=pem, key=pem, user="recoverd-agent-j", password_file=str(pw))
    bare = etcd_security.for_ranks(agent)
    assert (bare.cacert, bare.cert, bare.key, bare.user, bare.password_file) == (pem, pem, pem, None, None)
    client = etcd_security.for_ranks(agent, user="recoverd-client-j", password_file=str(pw))
    env = client.rank_env()
    assert env["RECOVERD_ETCD_USER"] == "recoverd-client-j" and env["RECOVERD_ETCD_PASSWORD_FILE"] == str(pw)
    with pytest.raises(ConfigError, match="go together"):
        etcd_security.for_ranks(agent, cert=pem)


def test_every_service_has_metrics_host_defaulting_to_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    from recoverd.cli.parser import CONFIGURABLE, build_parser, subcommands
    from recoverd.metrics import Health, MetricsServer

    monkeypatch.delenv("RECOVERD_METRICS_HOST", raising=False)
    commands = subcommands(build_parser())
    for name in CONFIGURABLE:
        hosts = [a.default for a in commands[name]._actions if "--metrics-host" in a.option_strings]
        assert hosts == ["127.0.0.1"], name

    async def revision() -> int:
        return 1

    server = MetricsServer(0, Health(revision))
    try:
        assert server._httpd.server_address[0] == "127.0.0.1"
    finally:
        server._httpd.server_close()
