"""``MSRunPlugin.start()``: this node's agent, driving msrun's workers through its callbacks.

The plugin is constructed by msrun with no arguments, so everything comes from the environment
(docs/compat.md, "MSRunPlugin"):

* job: ``RECOVERD_JOB``, else ``MINDX_TASK_ID`` (MindCluster's job id);
* etcd: ``RECOVERD_ETCD`` (the plugin talks to etcd directly; ``MINDX_SERVER_IP`` names the gateway);
* node name: ``RECOVERD_NODE``, else ``POD_NAME``, else the host name;
* layout: ``MS_WORKER_NUM``; ``MS_LOCAL_WORKER``, else the number of MONITOR entries;
  ``RECOVERD_NODE_RANK``, else ``MS_NODE_RANK``, else 0 when there is one node;
* strategies: ``RECOVERD_STRATEGIES``, else ``recover-in-place,exit`` when
  ``ENABLE_RESTART_FAULT_PROCESS=on`` (what MindCluster sets for recover-in-place), else ``exit``;
* waits: ``RECOVERD_MSRUN_POLL_S`` (0.1), ``RECOVERD_STOP_GRACE_S`` (5),
  ``RECOVERD_AGENT_LEASE_TTL`` (2, docs/adr/0025).

Every wait upstream hard-codes (1-5 s ticks, 10/15/50/60 s sleeps, the 900 s start gate) is one of
these settings or gone: exits are seen within one MONITOR tick, restarts happen when the recovery
protocol says so, and the plugin ends msrun with the job's status (0 when every rank finished 0).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

from recoverd.agent.agent import AgentSettings, NodeAgent
from recoverd.agent.msrun import MsrunLayout, MsrunRuntime, kill_msrun_processes
from recoverd.agent.runtime import OnExit
from recoverd.agent.settings import DEFAULT_LEASE_TTL_S
from recoverd.errors import ConfigError, RecoverdError
from recoverd.keys import DEFAULT_PREFIX, Keyspace, check_id
from recoverd.store import Store
from recoverd.strategies import parse_strategies

__all__ = ["EXIT_CONFIG_ERROR", "layout_from_env", "run_msrun_plugin", "settings_from_env"]

log = logging.getLogger(__name__)

EXIT_CONFIG_ERROR = 2


def _int(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name)
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise ConfigError(f"{name} must be positive, got {raw!r}")
    return value


def layout_from_env(environ: Mapping[str, str], monitor: Callable[[list[int]], Any]) -> MsrunLayout:
    """This node's place in the job, from msrun's variables or, failing those, MONITOR."""
    worker_num = _int(environ, "MS_WORKER_NUM")
    if worker_num is None or worker_num <= 0:
        raise ConfigError("MS_WORKER_NUM is not set: MSRunPlugin must run inside msrun")
    local = _int(environ, "MS_LOCAL_WORKER")
    if local is None:
        entries = monitor([-1])
        local = len(entries) if isinstance(entries, Mapping) else 0
    if local <= 0 or worker_num % local:
        raise ConfigError(f"cannot lay out {worker_num} workers with {local} on this node")
    node_rank = _int(environ, "RECOVERD_NODE_RANK")
    if node_rank is None:
        node_rank = _int(environ, "MS_NODE_RANK")
    if node_rank is None or node_rank < 0:
        if worker_num != local:
            raise ConfigError(
                "multi-node msrun job without a node rank: set MS_NODE_RANK (msrun --node_rank) or RECOVERD_NODE_RANK"
            )
        node_rank = 0
    if node_rank >= worker_num // local:
        raise ConfigError(f"node rank {node_rank} is outside 0..{worker_num // local - 1}")
    return MsrunLayout(worker_num=worker_num, local_worker_num=local, node_rank=node_rank)


def settings_from_env(environ: Mapping[str, str], layout: MsrunLayout) -> AgentSettings:
    job = environ.get("RECOVERD_JOB") or environ.get("MINDX_TASK_ID")
    if not job:
        raise ConfigError("no job id: set RECOVERD_JOB (or MindCluster's MINDX_TASK_ID)")
    etcd = environ.get("RECOVERD_ETCD")
    if not etcd:
        hint = (
            " (MINDX_SERVER_IP names the Recover gRPC gateway; the plugin talks to etcd directly)"
            if environ.get("MINDX_SERVER_IP")
            else ""
        )
        raise ConfigError(f"no etcd endpoint: set RECOVERD_ETCD{hint}")
    node = environ.get("RECOVERD_NODE") or environ.get("POD_NAME") or socket.gethostname().split(".")[0]
    if environ.get("RECOVERD_STRATEGIES"):
        strategies = parse_strategies(environ["RECOVERD_STRATEGIES"], where="RECOVERD_STRATEGIES")
    elif environ.get("ENABLE_RESTART_FAULT_PROCESS", "").lower() == "on":
        strategies = ("recover-in-place", "exit")
    else:
        strategies = ("exit",)

    port = _int(environ, "MS_SCHED_PORT")
    return AgentSettings(
        job=check_id("job", job),
        node=check_id("node", node),
        argv=("msrun-worker",),  # msrun starts the workers; the agent never spawns them itself
        etcd=etcd,
        nproc_per_node=layout.local_worker_num,
        nnodes=layout.worker_num // layout.local_worker_num,
        node_rank=layout.node_rank,
        strategies=strategies,
        master_addr=environ.get("MS_SCHED_HOST") or "127.0.0.1",
        master_port=port,
        prefix=environ.get("RECOVERD_PREFIX", DEFAULT_PREFIX),
        lease_ttl_s=_seconds(environ, "RECOVERD_AGENT_LEASE_TTL", DEFAULT_LEASE_TTL_S),
        stop_grace_s=_seconds(environ, "RECOVERD_STOP_GRACE_S", 5.0),
        reset_json=environ.get("RECOVERD_RESET_JSON") or None,
        reset_json_mirror=environ.get("RECOVERD_RESET_JSON_MIRROR") or None,
        nvml=environ.get("RECOVERD_NVML") or "auto",
    )


async def _serve(callbacks: Mapping[str, Callable[..., Any]], environ: Mapping[str, str]) -> int:
    layout = layout_from_env(environ, callbacks["MONITOR"])
    settings = settings_from_env(environ, layout)
    poll_s = _seconds(environ, "RECOVERD_MSRUN_POLL_S", 0.1)
    runtimes: list[MsrunRuntime] = []

    def factory(on_exit: OnExit, _protected: Callable[[], set[int]]) -> MsrunRuntime:
        runtime = MsrunRuntime(callbacks, layout, on_exit, poll_s=poll_s)
        runtimes.append(runtime)
        return runtime

    try:
        async with Store(settings.etcd) as store:  # TLS and credentials: RECOVERD_ETCD_* (docs/security.md)
            await store.verify()
            agent = NodeAgent(store, Keyspace(settings.prefix), settings, runtime=factory)
            return await agent.run()
    finally:
        for runtime in runtimes:  # whatever happened: nothing msrun started outlives the plugin
            runtime.kill_strays()


def run_msrun_plugin(callbacks: Mapping[str, Callable[..., Any]], environ: Mapping[str, str] | None = None) -> int:
    """Supervise this node's msrun workers until the job ends; return msrun's exit status."""
    environ = os.environ if environ is None else environ
    try:
        return asyncio.run(_serve(callbacks, environ))
    except RecoverdError as err:
        log.error("MSRunPlugin: %s", err)
        print(f"recoverd MSRunPlugin: error: {err}", flush=True)
        kill_msrun_processes(callbacks)  # the scheduler msrun already started must not be orphaned
        return EXIT_CONFIG_ERROR
