"""``recoverd adopt`` / ``python -m recoverd.cli.adopt``: supervise rank processes started elsewhere.

A drop-in for MindCluster's ``reset_process.py`` in the upstream launch scripts::

    python -u reset_process.py -p "${train_pids[@]}" -r &        # upstream
    python -u -m recoverd.cli.adopt -p "${train_pids[@]}" -r &    # recoverd, same flags

The same flags (``-p/--pids``, ``-r/--with_rank``, ``-m/--mode common|elastic``, ``-t/--time``,
``-f/--frame``) plus recoverd's (``--job``, ``--etcd``, ...). The job comes from ``--job``,
``$RECOVERD_JOB`` or MindCluster's ``$MINDX_TASK_ID``; etcd from ``--etcd`` / ``$RECOVERD_ETCD``.

It adopts the processes, joins the job as this node's agent, follows the recovery protocol through
etcd, and restarts ranks with their captured command, environment and directory. Modes: ``common``
kills at once (SIGKILL, as upstream); ``elastic`` sends SIGTERM and waits ``-t`` seconds (default
50, upstream's) before SIGKILL. Exit status, as upstream: 0 when the job succeeded or the launcher
sent SIGTERM (its signal that training finished), 1 when the job failed or on SIGUSR2 (hand over to
job-level rescheduling), 2 on bad input (nothing adopted).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence

from recoverd import etcd_security, logs
from recoverd.agent.adopt import AdoptRuntime, Captured, capture
from recoverd.agent.agent import EXIT_SIGINT, AgentSettings, NodeAgent, become_subreaper
from recoverd.agent.runtime import OnExit
from recoverd.agent.settings import DEFAULT_LEASE_TTL_S, NVML_HELP, NVML_MODES
from recoverd.argtypes import lease_ttl
from recoverd.errors import ConfigError, RecoverdError
from recoverd.keys import DEFAULT_PREFIX, Keyspace, check_id
from recoverd.store import Store
from recoverd.strategies import parse_strategies

#: The ranks' etcd identity settings (``--rank-etcd-*``, docs/security.md "Ranks").
RANK_IDENTITY = ("user", "password_file", "cert", "key")

__all__ = ["build_parser", "main", "settings_for"]

log = logging.getLogger("recoverd.adopt")


def _kill_time(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 3000:
        raise argparse.ArgumentTypeError("-t/--time must be within 0..3000 seconds (as upstream)")
    return value


def build_parser(prog: str = "recoverd adopt") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Adopt running rank processes and recover them.")
    parser.add_argument("-p", "--pids", type=int, nargs="+", required=True, help="the rank processes to adopt")
    parser.add_argument(
        "-r",
        "--with_rank",
        "--with-rank",
        action="store_true",
        help="take each rank from the process's RANK_ID (or RANK); required to be present",
    )
    parser.add_argument(
        "-m",
        "--mode",
        choices=("common", "elastic"),
        default="common",
        help="common: SIGKILL at once; elastic: SIGTERM, then SIGKILL after -t (default %(default)s)",
    )
    parser.add_argument(
        "-t",
        "--time",
        type=_kill_time,
        default=50.0,
        help="elastic mode: seconds between SIGTERM and SIGKILL (0..3000, default %(default)s)",
    )
    parser.add_argument("-f", "--frame", default="ms", help="accepted for compatibility; unused")
    parser.add_argument(
        "--job",
        default=os.environ.get("RECOVERD_JOB") or os.environ.get("MINDX_TASK_ID"),
        help="job name (default: $RECOVERD_JOB or $MINDX_TASK_ID)",
    )
    parser.add_argument("--etcd", default=os.environ.get("RECOVERD_ETCD"), help="etcd endpoints ($RECOVERD_ETCD)")
    parser.add_argument("--prefix", default=os.environ.get("RECOVERD_PREFIX", DEFAULT_PREFIX))
    parser.add_argument("--node", default=os.environ.get("RECOVERD_NODE") or socket.gethostname().split(".")[0])
    parser.add_argument("--nnodes", type=int, default=None, help="default: RANK_SIZE / number of PIDs, else 1")
    parser.add_argument("--strategies", default="exit", help="allowed strategies (default: exit, as upstream)")
    parser.add_argument("--log-dir", default=None, help="logs of restarted ranks (default recoverd-logs/<job>)")
    parser.add_argument(
        "--vanish-grace",
        type=float,
        default=2.0,
        help="an adopted rank that vanished with unknown status is a fault after this (s)",
    )
    parser.add_argument(
        "--agent-lease-ttl",
        type=lease_ttl,
        default=DEFAULT_LEASE_TTL_S,
        help="node lease TTL, whole seconds, at least 1 (%(default)s s; docs/adr/0025)",
    )
    parser.add_argument("--reset-json", default=None, help="a device plugin's reset.json to turn into faults")
    parser.add_argument("--nvml", choices=NVML_MODES, default="auto", help=NVML_HELP)
    logs.add_arguments(parser)
    etcd_security.add_arguments(parser)
    etcd_security.add_rank_arguments(parser)
    # As `recoverd agent` takes them: the flags, else $RECOVERD_RANK_ETCD_* (a DaemonSet's env).
    parser.set_defaults(
        **{f"rank_etcd_{name}": os.environ.get(f"RECOVERD_RANK_ETCD_{name.upper()}") for name in RANK_IDENTITY}
    )
    return parser


def settings_for(args: argparse.Namespace, captured: Sequence[Captured]) -> AgentSettings:
    if not args.job:
        raise ConfigError("no job: pass --job, or set RECOVERD_JOB or MINDX_TASK_ID")
    if not args.etcd:
        raise ConfigError("no etcd endpoint: pass --etcd or set RECOVERD_ETCD")
    strategies = parse_strategies(args.strategies, where="--strategies")
    per_node = len(captured)
    ranks = sorted(c.rank for c in captured)
    node_rank = ranks[0] // per_node
    if ranks != list(range(node_rank * per_node, node_rank * per_node + per_node)):
        raise ConfigError(f"the adopted ranks {ranks} are not one node's {per_node} consecutive ranks")
    nnodes = args.nnodes
    if nnodes is None:
        size = captured[0].env.get("RANK_SIZE") or captured[0].env.get("WORLD_SIZE") or ""
        nnodes = max(1, int(size) // per_node) if size.isdigit() else 1
    return AgentSettings(
        job=check_id("job", args.job),
        node=check_id("node", args.node),
        argv=captured[0].argv,  # each rank is restarted with its own captured command
        etcd=args.etcd,
        nproc_per_node=per_node,
        nnodes=nnodes,
        node_rank=node_rank,
        strategies=strategies,
        log_dir=os.path.abspath(args.log_dir or os.path.join("recoverd-logs", args.job)),
        master_addr=captured[0].env.get("MASTER_ADDR") or "127.0.0.1",
        master_port=int(captured[0].env["MASTER_PORT"]) if captured[0].env.get("MASTER_PORT", "").isdigit() else None,
        prefix=args.prefix,
        lease_ttl_s=args.agent_lease_ttl,
        stop_grace_s=0.0 if args.mode == "common" else args.time,
        exit_signals={signal.SIGTERM: 0, signal.SIGINT: EXIT_SIGINT, signal.SIGUSR2: 1},
        reset_json=args.reset_json,
        nvml=args.nvml,
    )


async def _run(args: argparse.Namespace) -> int:
    captured = capture(args.pids, with_rank=args.with_rank)
    settings = settings_for(args, captured)
    security = etcd_security.from_args(args)
    # A rank it restarts gets the job's client identity, never the adopter's own.
    ranks = etcd_security.ranks_from_args(args, security)
    settings = dataclasses.replace(settings, rank_etcd=ranks)
    if (problem := etcd_security.rank_identity_problem(security, ranks, settings.job)) is not None:
        log.warning("%s", problem)
    become_subreaper()

    def runtime(on_exit: OnExit, protected: object) -> AdoptRuntime:
        return AdoptRuntime(on_exit, set, captured, vanish_grace_s=args.vanish_grace)

    async with Store(settings.etcd, security=security) as store:
        await store.verify()
        return await NodeAgent(store, Keyspace(settings.prefix), settings, runtime=runtime).run()


def main(argv: Sequence[str] | None = None, prog: str = "recoverd adopt") -> None:
    args = build_parser(prog).parse_args(argv)
    logs.setup(args.log_level, args.log_format)
    try:
        code = asyncio.run(_run(args))
    except RecoverdError as err:
        print(f"recoverd adopt: error: {err}", file=sys.stderr)
        code = 2
    sys.exit(code)


if __name__ == "__main__":
    main(prog="python -m recoverd.cli.adopt")
