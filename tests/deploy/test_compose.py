"""deploy/docker-compose.yml, checked without a Docker engine: the Compose Specification's JSON
schema (vendored: tests/deploy/README.md), then what the schema cannot see."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.commands import agent_identities, check_recoverd_argv, readme_auth_users, readme_issued
from tests.deploy.manifests import DEPLOY
from tests.deploy.schemas import compose_errors

COMPOSE = DEPLOY / "docker-compose.yml"
ETCD = ("etcd-0", "etcd-1", "etcd-2")
RECOVERD = ("coordinator-a", "coordinator-b", "strategy", "gateway", "agent-0", "agent-1")
#: The files of deploy/certs a service may mount (deploy/README.md, "Certificates with openssl").
OWN_CERTS = {
    "etcd": {"ca.pem", "server.pem", "server-key.pem"},
    "control": {"ca.pem", "client.pem", "client-key.pem"},
    "agent": {"ca.pem", "agent.pem", "agent-key.pem", "rank.pem", "rank-key.pem"},
}
#: The variables naming a recoverd service's TLS files, each of them mounted.
TLS_VARS = ("RECOVERD_ETCD_CACERT", "RECOVERD_ETCD_CERT", "RECOVERD_ETCD_KEY")
#: And an agent's for its ranks' certificate (--rank-etcd-cert/--rank-etcd-key).
RANK_TLS_VARS = ("RECOVERD_RANK_ETCD_CERT", "RECOVERD_RANK_ETCD_KEY")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_file_matches_the_compose_specification(compose: dict[str, Any]) -> None:
    assert compose_errors(compose) == []


def _broken(text: str, old: str, new: str) -> str:
    assert old in text, f"docker-compose.yml no longer contains {old!r}: update this test"
    return text.replace(old, new, 1)


def test_a_broken_copy_is_refused() -> None:
    """The same check on a copy of the file with four mistakes."""
    text = COMPOSE.read_text()
    text = _broken(text, '    command: ["strategy"]\n', '    command: ["strategy"]\n    restart_policy: always\n')
    text = _broken(text, "condition: service_started", "condition: service_startd")
    text = _broken(text, 'test: ["CMD", "/usr/local/bin/etcdctl", "endpoint", "health"]', "test: {cmd: etcdctl}")
    text = _broken(text, "source: ./certs/agent.pem,", "readonly: true, source: ./certs/agent.pem,")
    errors = "\n".join(compose_errors(yaml.safe_load(text)))
    assert "services.strategy: 'restart_policy' does not match any of the regexes" in errors
    assert "services.agent-0.depends_on: " in errors and "service_startd" in errors
    assert "services.etcd-0.healthcheck.test: {'cmd': 'etcdctl'} is not valid" in errors
    assert "services.agent-1.volumes.1: " in errors and "'readonly': True" in errors


def _env(service: dict[str, Any]) -> dict[str, str]:
    environment = service.get("environment") or {}
    assert isinstance(environment, dict), "environment as a map"
    return {key: str(value) for key, value in environment.items()}


def _binds(service: dict[str, Any]) -> dict[str, str]:
    """target -> source of the service's bind mounts (long syntax)."""
    return {
        v["target"]: v["source"] for v in service.get("volumes") or [] if isinstance(v, dict) and v["type"] == "bind"
    }


def test_services_and_their_references(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {*ETCD, *RECOVERD}
    for name, service in services.items():
        for dependency in service.get("depends_on") or {}:
            assert dependency in services, f"{name} depends on unknown {dependency}"
        for source in _binds(service).values():
            assert source.startswith("./certs/") and source != "./certs/ca-key.pem", f"{name} mounts {source}"
        for volume in service.get("volumes") or []:
            if isinstance(volume, str):
                assert volume.split(":")[0] in compose["volumes"], f"{name}: named volume {volume} is not declared"
    # etcd: 3 members that name each other, TLS for clients and peers.
    members = {}
    for name in ETCD:
        env = _env(services[name])
        assert env["ETCD_NAME"] == name and env["ETCD_ADVERTISE_CLIENT_URLS"] == f"https://{name}:2379"
        assert env["ETCD_CLIENT_CERT_AUTH"] == env["ETCD_PEER_CLIENT_CERT_AUTH"] == "true"
        assert env["ETCD_LISTEN_PEER_URLS"].startswith("https://")
        members[name] = env["ETCD_INITIAL_ADVERTISE_PEER_URLS"]
        assert {Path(p).name for p in _binds(services[name])} == OWN_CERTS["etcd"]
    cluster = _env(services["etcd-0"])["ETCD_INITIAL_CLUSTER"]
    assert cluster == ",".join(f"{name}={url}" for name, url in members.items())
    # recoverd: every endpoint is a member over https, and each service mounts exactly its own
    # certificate and key, where its variables point.
    for name in RECOVERD:
        service, env = services[name], _env(services[name])
        assert env["RECOVERD_ETCD"] == ",".join(f"https://{member}:2379" for member in ETCD)
        binds = _binds(service)
        identity = "agent" if name.startswith("agent") else "control"
        for var in TLS_VARS + (RANK_TLS_VARS if identity == "agent" else ()):
            assert env[var] in binds, f"{name}: {var}={env[var]} is not mounted"
        assert {Path(target).name for target in binds} == OWN_CERTS[identity], name
        assert all(services[name]["depends_on"][member]["condition"] == "service_healthy" for member in ETCD)


def test_recoverd_command_lines_parse(compose: dict[str, Any]) -> None:
    services = compose["services"]
    seen = {name: check_recoverd_argv(services[name]["command"], f"docker-compose.yml: {name}") for name in RECOVERD}
    assert seen == {
        "coordinator-a": "coordinator",
        "coordinator-b": "coordinator",
        "strategy": "strategy",
        "gateway": "gateway",
        "agent-0": "agent",
        "agent-1": "agent",
    }
    # One job on two nodes: distinct node names and ranks, one rendezvous on node rank 0's service.
    agents = [_flags(services[name]["command"]) for name in ("agent-0", "agent-1")]
    assert {a["--job"] for a in agents} == {"demo"} and {a["--nnodes"] for a in agents} == {"2"}
    assert sorted(a["--node-rank"] for a in agents) == ["0", "1"] and len({a["--node"] for a in agents}) == 2
    assert {a["--master-addr"] for a in agents} == {"agent-0"}


def _flags(command: list[str]) -> dict[str, str]:
    before = command[: command.index("--")]
    return dict(arg.split("=", 1) for arg in before if arg.startswith("--") and "=" in arg)


def test_agents_give_their_ranks_the_jobs_client_identity(compose: dict[str, Any]) -> None:
    """Ranks act as job demo's client user (CN recoverd-client-demo), never as its agent: each
    agent, as recoverd resolves its flags and environment, hands its ranks a certificate of its own
    (mounted from deploy/certs, issued by deploy/README.md with that CN, whose user the README
    makes), and does not warn that they act as it (docs/security.md, "Ranks")."""
    services = compose["services"]
    issued = readme_issued()
    users = readme_auth_users()
    for name in ("agent-0", "agent-1"):
        service = services[name]
        found = agent_identities(service["command"], _env(service), f"docker-compose.yml: {name}")
        agent, ranks, job = found.agent, found.ranks, found.job
        assert found.warnings == [], f"{name}: {found.warnings}"
        assert ranks.cert and ranks.key and ranks.user is None, f"{name}: its ranks get no certificate of their own"
        assert {ranks.cert, ranks.key}.isdisjoint({agent.cert, agent.key}), f"{name}: its ranks get the agent's"
        assert ranks.cacert == agent.cacert
        binds = _binds(service)
        assert ranks.cert in binds and ranks.key in binds, f"{name}: the ranks' certificate is not mounted"
        cert_of = {"agent": Path(binds[str(agent.cert)]).stem, "client": Path(binds[str(ranks.cert)]).stem}
        assert binds[str(ranks.key)] == f"./certs/{cert_of['client']}-key.pem"
        for role, file in cert_of.items():
            common_name = issued.get(file)
            assert common_name == f"recoverd-{role}-{job}", f"{name}: {file}.pem is issued as {common_name}"
            assert (job, role, common_name) in users, f"deploy/README.md makes no etcd user {common_name}"
