"""``recoverd``'s command line: every subcommand's flags, and the configuration layer under them.

The flags of a service come from the command line, ``$RECOVERD_<FLAG>`` or a ``--config`` file
(``recoverd.config``); :func:`configured` applies the latter two to the chosen subcommand's parser
before it parses. What the parsed flags become (settings, services) is :mod:`recoverd.cli.main`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from collections.abc import Sequence

from recoverd import __version__, config, etcd_security, logs
from recoverd.agent.settings import DEFAULT_LEASE_TTL_S, NVML_HELP, NVML_MODES
from recoverd.argtypes import lease_ttl, non_negative, positive
from recoverd.cli import completion
from recoverd.coordinator.model import Timeouts
from recoverd.errors import ConfigError
from recoverd.gateway import server as gateway_server
from recoverd.keys import DEFAULT_PREFIX
from recoverd.priority import DEFAULT_BOOST
from recoverd.strategies import parse_strategies

__all__ = ["CONFIGURABLE", "build_parser", "config_path_of", "configured", "show_config", "subcommands"]


def _strategies(text: str) -> tuple[str, ...]:
    try:
        return parse_strategies(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(err.detail.removeprefix("strategies: ")) from None


def add_common(parser: argparse.ArgumentParser, *, etcd_required: bool) -> None:
    parser.add_argument(
        "--etcd",
        default=os.environ.get("RECOVERD_ETCD"),
        help="etcd endpoints, comma-separated host:port (default: $RECOVERD_ETCD"
        + (")" if etcd_required else "; none: start an embedded etcd)"),
    )
    parser.add_argument(
        "--prefix",
        default=os.environ.get("RECOVERD_PREFIX", DEFAULT_PREFIX),
        help="key prefix in etcd (default: $RECOVERD_PREFIX or %(default)s)",
    )
    logs.add_arguments(parser)
    parser.add_argument(
        "--metrics-port",
        type=non_negative(int),
        default=int(os.environ.get("RECOVERD_METRICS_PORT") or 0),
        metavar="PORT",
        help="serve Prometheus /metrics, /healthz and /readyz on this port (default: $RECOVERD_METRICS_PORT,"
        " else 0: off; docs/operations.md)",
    )
    parser.add_argument(
        "--metrics-host",
        default=os.environ.get("RECOVERD_METRICS_HOST") or "127.0.0.1",
        metavar="HOST",
        help="the address --metrics-port listens on (default: $RECOVERD_METRICS_HOST or %(default)s: this host"
        " only; 0.0.0.0 for a scraper on another host, e.g. in a container)",
    )
    parser.add_argument(
        "--cpu-boost",
        type=non_negative(int),
        default=int(os.environ.get("RECOVERD_CPU_BOOST") or DEFAULT_BOOST),
        metavar="N",
        help="run this service N nice levels ahead of the job's processes, which keep their own priority,"
        " so recoveries do not queue behind busy ranks; needs CAP_SYS_NICE, else ignored (default:"
        " $RECOVERD_CPU_BOOST or %(default)s; 0: off; docs/adr/0037)",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=os.environ.get("RECOVERD_CONFIG"),
        help="a YAML file of flag values (docs/configuration.md): flag > $RECOVERD_<FLAG> > file > default;"
        " `recoverd config show COMMAND` prints the result",
    )
    etcd_security.add_arguments(parser)


def add_embedded(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--etcd-bin", default=None, help="etcd binary for the embedded etcd")
    parser.add_argument("--etcd-data-dir", default=None, help="data dir of the embedded etcd (default: a temp dir)")


def add_timeouts(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("coordinator timing (seconds)")
    default = Timeouts()
    group.add_argument(
        "--fault-window",
        type=positive(float),
        default=default.fault_window_s,
        help="collect faults at most this long before stopping (%(default)s)",
    )
    group.add_argument(
        "--fault-settle",
        type=non_negative(float),
        default=default.fault_settle_s,
        help="stop collecting once no fault arrived for this long, within the window (%(default)s; 0: the whole"
        " window)",
    )
    group.add_argument("--stop-timeout", type=positive(float), default=default.stop_s, help="%(default)s")
    group.add_argument("--strategies-timeout", type=positive(float), default=default.strategies_s, help="%(default)s")
    group.add_argument(
        "--decide-timeout",
        type=positive(float),
        default=default.decide_s,
        help="no decision this long: apply exit (%(default)s)",
    )
    group.add_argument("--recover-timeout", type=positive(float), default=default.recover_s, help="%(default)s")
    group.add_argument(
        "--coordinator-lease-ttl", type=lease_ttl, default=5, help="whole seconds, at least 1 (%(default)s)"
    )
    group.add_argument("--event-cap", type=positive(int), default=1000, help="events kept per run (%(default)s)")
    group.add_argument(
        "--etcd-trouble-grace",
        type=non_negative(float),
        default=5.0,
        help="a node whose lease expires within this long of trouble in etcd (a hung or leaderless member,"
        " a leader change) is held as live this long for its agent to register again; 0: never"
        " (%(default)s; docs/adr/0045)",
    )
    group.add_argument(
        "--retention",
        type=positive(float),
        default=3600.0,
        help="finished runs are removed after this long (%(default)s)",
    )


def add_job(parser: argparse.ArgumentParser, *, job_required: bool) -> None:
    parser.add_argument(
        "--job",
        default=os.environ.get("RECOVERD_JOB"),
        required=job_required and not os.environ.get("RECOVERD_JOB"),
        help="job name (default: $RECOVERD_JOB)",
    )
    parser.add_argument("--nproc-per-node", type=positive(int), required=True, help="ranks on this node")
    parser.add_argument(
        "--strategies",
        type=_strategies,
        default=None,
        help="allowed strategies in order, e.g. recover-in-place,exit (default: the policy file's, else exit)",
    )
    parser.add_argument(
        "--policy",
        default=None,
        metavar="FILE",
        help="the job's policy (YAML, docs/policy.md); what it sets wins over --strategies and the budget flags",
    )
    parser.add_argument(
        "--independent-ranks",
        action="store_true",
        help="the ranks never talk to each other (no process group): a rank may be restarted alone even"
        " with no recoverd client in the script. Without it, a plain script's fault restarts every rank"
        " (a lone restart would wait in init_process_group for good; docs/adr/0041)",
    )
    parser.add_argument(
        "--replacement-wait",
        type=non_negative(float),
        default=None,
        metavar="SECONDS",
        help="how long a lost node with no spare waits for an agent to replace it (a new agent for its"
        " node rank, e.g. a rescheduled pod) before the job fails; 0: no wait (default 120; the policy's"
        " deadlines.replacement; docs/adr/0044)",
    )
    parser.add_argument(
        "--max-rank-restarts",
        type=positive(int),
        default=3,
        help="in-place restarts of one rank per window before exit (%(default)s)",
    )
    parser.add_argument(
        "--max-job-restarts", type=positive(int), default=3, help="exits per window before the job fails (%(default)s)"
    )
    parser.add_argument("--restart-window", type=positive(float), default=600.0, help="%(default)s s")
    parser.add_argument("--log-dir", default=None, help="one log file per rank (default: recoverd-logs/<job>)")
    parser.add_argument(
        "--master-addr",
        default=None,
        help="the address of node rank 0, where rank 0 hosts the job's rendezvous (MASTER_ADDR of every"
        " rank; the same on every node; required with --nnodes > 1; default 127.0.0.1 on one node)",
    )
    parser.add_argument(
        "--master-port",
        type=positive(int),
        default=None,
        help="MASTER_PORT of every rank (default: a free port chosen by the agent that creates the job)",
    )
    parser.add_argument(
        "--agent-lease-ttl",
        type=lease_ttl,
        default=DEFAULT_LEASE_TTL_S,
        help="node lease TTL, whole seconds, at least 1 (%(default)s s: a dead node is declared in about 1.8 s;"
        " an agent restart that takes longer than the lease is a node loss; docs/adr/0025)",
    )
    parser.add_argument(
        "--stop-grace",
        type=positive(float),
        default=5.0,
        help="SIGTERM to SIGKILL grace when stopping ranks (%(default)s s)",
    )
    parser.add_argument(
        "--crash-backoff-max",
        type=non_negative(float),
        default=30.0,
        help="a rank that fails within 10 s of its start twice or more in a row is started again after"
        " 1 s, doubling each time, at most this long (%(default)s s; 0: at once; docs/adr/0046)",
    )
    parser.add_argument(
        "--warm-spares",
        type=non_negative(int),
        default=0,
        metavar="N",
        help="keep N processes of the command started ahead, framework imported, to become a restarted"
        " rank at once (scripts that call taskd_client.pytorch.wait_for_rank(); docs/pytorch.md; default 0)",
    )
    parser.add_argument(
        "--no-warm-start",
        action="store_true",
        help="start every rank as a new interpreter; by default a restarted rank of a `python script.py`"
        " command is forked from an interpreter that has imported the framework already (docs/pytorch.md)",
    )
    parser.add_argument(
        "--warm-start-modules",
        default="auto",
        metavar="MODULES",
        help="what that interpreter imports, comma-separated (default: auto, the framework the script imports:"
        " torch with taskd_client.pytorch, or mindspore; none: plain starts)",
    )
    parser.add_argument(
        "--warm-start-wait",
        type=non_negative(float),
        default=30.0,
        metavar="SECONDS",
        help="how long the first start waits for that interpreter to import, so that every rank is forked from"
        " it: one import per node instead of one per rank (default %(default)g; 0: the first start is plain;"
        " a server that fails ends the wait at once; docs/adr/0039)",
    )
    parser.add_argument(
        "--reset-json", default=None, help="a device plugin's reset.json to turn into faults (watched, never written)"
    )
    parser.add_argument("--reset-json-mirror", default=None, help="write recoverd's state here in reset.json form")
    parser.add_argument(
        "--no-hang-detection",
        action="store_true",
        help="do not listen for the ranks' progress reports (no hang or straggler detection; docs/detectors.md)",
    )
    parser.add_argument("--nvml", choices=NVML_MODES, default="auto", help=NVML_HELP)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recoverd", description="Process-level fault recovery for training jobs.")
    parser.add_argument("--version", action="version", version=f"recoverd {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a job on this node with the whole control plane (like torchrun)")
    add_common(run, etcd_required=False)
    add_embedded(run)
    add_timeouts(run)
    add_job(run, job_required=False)
    run.add_argument(
        "--node",
        default=os.environ.get("RECOVERD_NODE") or socket.gethostname().split(".")[0],
        help="this node's name in the job's records (default: $RECOVERD_NODE, else the short host name)",
    )

    up = sub.add_parser("up", help="run the control plane (embedded etcd unless --etcd, coordinator, strategy)")
    add_common(up, etcd_required=False)
    add_embedded(up)
    up.add_argument(
        "--tls-dir",
        metavar="DIR",
        default=None,
        help="serve the embedded etcd with TLS and client certificates from DIR (made there on first use:"
        " a CA, a server and a client certificate; docs/security.md)",
    )
    add_timeouts(up)

    coordinator = sub.add_parser("coordinator", help="the leader-elected recovery coordinator")
    add_common(coordinator, etcd_required=True)
    add_timeouts(coordinator)

    sub.add_parser(
        "adopt",
        help="adopt rank processes started elsewhere (reset_process.py's flags; recoverd adopt --help)",
        add_help=False,
    )

    strategy = sub.add_parser("strategy", help="the strategy selector")
    add_common(strategy, etcd_required=True)

    agent = sub.add_parser("agent", help="the node agent: run this node's ranks")
    add_common(agent, etcd_required=True)
    add_job(agent, job_required=True)
    agent.add_argument(
        "--node",
        default=os.environ.get("RECOVERD_NODE") or socket.gethostname().split(".")[0],
        help="node name (default: $RECOVERD_NODE or the host name)",
    )
    agent.add_argument("--nnodes", type=positive(int), default=1, help="nodes in the job (%(default)s)")
    agent.add_argument(
        "--node-rank",
        type=int,
        default=0,
        help="this node's place among the job's nodes, 0..nnodes-1: its ranks are node_rank x nproc-per-node"
        " onwards (%(default)s)",
    )
    agent.add_argument(
        "--spare",
        action="store_true",
        help="join a running job as a spare node: run no ranks until `recover` moves a faulty node's ranks"
        " here, or an upgrade brings back ranks a downgrade isolated (docs/strategies.md)",
    )
    etcd_security.add_rank_arguments(agent)

    gateway = sub.add_parser("gateway", help="the Recover gRPC gateway for unmodified MindCluster clients")
    add_common(gateway, etcd_required=True)
    gateway_server.add_arguments(gateway)

    config = sub.add_parser("config", help="show the effective configuration of a command (docs/configuration.md)")
    config_sub = config.add_subparsers(dest="config_cmd", required=True, metavar="ACTION")
    show = config_sub.add_parser("show", help="every flag of COMMAND: its value and where it came from")
    show.add_argument("command", choices=CONFIGURABLE, metavar="COMMAND", help=", ".join(CONFIGURABLE))
    show.add_argument("--config", metavar="FILE", default=os.environ.get("RECOVERD_CONFIG"), help="the YAML file")
    show.add_argument("--json", action="store_true", help="machine-readable output")

    shell = sub.add_parser("completion", help="print a shell completion script: source <(recoverd completion bash)")
    shell.add_argument("shell", choices=completion.SHELLS)
    return parser


CONFIGURABLE = ("run", "up", "coordinator", "strategy", "agent", "gateway")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def configured(parser: argparse.ArgumentParser, command: str, config_path: str | None) -> list[config.Setting]:
    """Apply $RECOVERD_<FLAG> and the --config file to ``command``'s parser (``recoverd.config``)."""
    commands = subcommands(parser)
    all_flags = [a.dest for name in CONFIGURABLE for a in commands[name]._actions if a.option_strings]
    return config.resolve(
        commands[command], command, config_path=config_path, all_flags=all_flags, commands=CONFIGURABLE
    )


def config_path_of(argv: Sequence[str]) -> str | None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=os.environ.get("RECOVERD_CONFIG"))
    return pre.parse_known_args(list(argv))[0].config


def show_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    settings = configured(parser, args.command, args.config)
    if args.json:
        print(json.dumps([{"flag": s.flag, "value": s.value, "source": s.source} for s in settings], indent=2))
        return 0
    width = max(len(s.flag) for s in settings)
    for s in settings:
        print(f"{s.flag:<{width}}  {s.value!r:<40}  # {s.source}")
    return 0
