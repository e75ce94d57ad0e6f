"""The ``recoverd`` command lines of the deployment files, parsed by recoverd's own CLI.

A flag that does not exist, a value of the wrong type, a missing ``--master-addr`` with
``--nnodes`` > 1 or an invalid job or node name fails here, as it would at the container's start.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Mapping, Sequence

from recoverd.cli import adopt
from recoverd.cli.main import _agent_settings, build_parser
from recoverd.errors import RecoverdError
from recoverd.strategies import parse_strategies

__all__ = ["check_recoverd_argv", "expand_kubernetes"]

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
