"""The ``recoverd`` command lines of the deployment files, parsed by recoverd's own CLI.

A flag that does not exist, a value of the wrong type, a missing ``--master-addr`` with
``--nnodes`` > 1 or an invalid job or node name fails here, as it would at the container's start.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from unittest import mock

from recoverd import config, etcd_security
from recoverd.cli import adopt, ctl
from recoverd.cli.main import _agent_settings, build_parser
from recoverd.cli.parser import subcommands
from recoverd.errors import RecoverdError
from recoverd.etcd_security import EtcdSecurity
from recoverd.strategies import parse_strategies
from tests.deploy.manifests import DEPLOY

__all__ = [
    "AgentIdentities",
    "agent_identities",
    "check_recoverd_argv",
    "expand_kubernetes",
    "readme_auth_users",
    "readme_issued",
]

_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


def expand_kubernetes(arg: str, env: Mapping[str, str], where: str) -> str:
    """``$(VAR)`` as the kubelet expands it in command and args. An undefined variable is an error
    here: the kubelet would leave ``$(VAR)`` in the argument and the agent would refuse it."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        if name not in env:
            raise AssertionError(f"{where}: {arg!r} uses $({name}), which the container does not define")
        return env[name]

    return _REFERENCE.sub(replace, arg)


def check_recoverd_argv(argv: Sequence[str], where: str) -> str:
    """Parse ``recoverd ARGV`` (ARGV without the program name) as recoverd would; return the
    subcommand. Raises AssertionError with argparse's message on bad input."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            if argv[:1] == ["adopt"]:
                args = adopt.build_parser().parse_args(list(argv[1:]))
                parse_strategies(args.strategies, where="--strategies")
                return "adopt"
            args = build_parser().parse_args(list(argv))
            if args.cmd == "agent":
                _agent_settings(args, "https://etcd:2379", args.job, args.nnodes, args.node_rank)
            return str(args.cmd)
    except SystemExit as err:
        message = (stderr.getvalue().strip().splitlines() or ["(no message)"])[-1]
        raise AssertionError(f"{where}: `recoverd {' '.join(argv)}` is refused: {message}") from err
    except RecoverdError as err:
        raise AssertionError(f"{where}: `recoverd {' '.join(argv)}` is refused: {err}") from err


@dataclass(frozen=True)
class AgentIdentities:
    job: str
    agent: EtcdSecurity  # what the agent connects with
    ranks: EtcdSecurity  # what it gives its ranks (their RECOVERD_ETCD_*)
    warnings: list[str]  # what the agent warns about them at startup


def agent_identities(argv: Sequence[str], env: Mapping[str, str], where: str) -> AgentIdentities:
    """The etcd identities of ``recoverd agent ARGV`` started with environment ``env``, as recoverd
    resolves them: its flags over ``$RECOVERD_<FLAG>`` (``--rank-etcd-cert`` is
    ``$RECOVERD_RANK_ETCD_CERT``), then :mod:`recoverd.etcd_security`, and the startup warnings
    about the ranks' identity. The files exist only in the container: PEM reads are skipped here
    (the tests check the mounts apart)."""
    parser = build_parser()
    try:
        config.resolve(subcommands(parser)["agent"], "agent", config_path=None, env=env)
        args = parser.parse_args(list(argv))
        assert args.cmd == "agent", f"{where}: not `recoverd agent`"
        with mock.patch.object(etcd_security, "_read_pem", lambda flag, path: b""):
            agent = etcd_security.from_args(args, env)
            ranks = etcd_security.ranks_from_args(args, agent)
    except RecoverdError as err:
        raise AssertionError(f"{where}: `recoverd {' '.join(argv)}` is refused: {err}") from err
    problem = etcd_security.rank_identity_problem(agent, ranks, args.job)
    warnings = [problem] if problem is not None else []
    return AgentIdentities(args.job, agent, ranks, warnings)


README = DEPLOY / "README.md"
_ISSUE = re.compile(r"^issue (\S+) (\S+) ", re.MULTILINE)


def readme_issued() -> dict[str, str]:
    """deploy/README.md's openssl recipes: each ``issue FILE COMMON_NAME ...`` line, FILE -> CN."""
    issued: dict[str, str] = {}
    for file, name in _ISSUE.findall(README.read_text()):
        assert issued.setdefault(file, name) == name, f"deploy/README.md issues {file} twice, as {issued[file]}, {name}"
    return issued


def readme_auth_users() -> set[tuple[str, str, str]]:
    """deploy/README.md's ``recoverctl auth user JOB ROLE --name NAME --no-password`` lines, each
    parsed by recoverctl's own CLI: (JOB, ROLE, NAME)."""
    users: set[tuple[str, str, str]] = set()
    for line in README.read_text().splitlines():
        if "recoverctl auth user " not in line or "--no-password" not in line:
            continue
        words = shlex.split(line.split("recoverctl ", 1)[1].split("'")[0])
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                args = ctl.build_parser().parse_args(words)
        except SystemExit as err:
            message = (stderr.getvalue().strip().splitlines() or ["(no message)"])[-1]
            raise AssertionError(f"deploy/README.md: `recoverctl {' '.join(words)}` is refused: {message}") from err
        if len(args.words) == 2:
            job, role = args.words
            users.add((job, role, args.name))
    return users
