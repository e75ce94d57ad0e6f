"""Simulated nodes: the real node agent over ranks that live in memory, hundreds per OS process.

What is real: every simulated node is a :class:`~recoverd.agent.agent.NodeAgent` with its own etcd
connection (:class:`~recoverd.store.Store`) and its own lease, exactly as on a machine of its own. It
joins the job, registers, publishes its rank table, watches its keys, reports faults, answers the
recovery protocol, executes commands, acknowledges them and keeps its lease alive, against a real
etcd, coordinator and strategy selector. What is simulated: the ranks (:class:`SimRuntime`). A rank
"runs" until it is crashed or the agent stops it; nothing is forked, so a 512-node job of 8 ranks a
node costs a few OS processes instead of 4,608. The delays a real node adds are modelled
(:class:`SimTiming`): the exit detector's wake-up after a kill, and a rank's exit after SIGTERM.
Starting a rank is instant here; on a real node a spawn costs a few milliseconds per rank, paid in
parallel on every node.

What it is for: measuring the control plane at the sizes users run (``make bench-scale``,
docs/scale.md) and integration tests of many-node jobs. What it is not: a test of the launcher, of
process groups or of signals (the process tests cover those), and the agents share their host's
CPU and event loop, so at a few hundred nodes per process they are *slower* than real nodes
would be, never faster.

Run one host process with ``python -m recoverd.agent.simulated --help``. It takes commands as JSON
lines on stdin and answers each with one JSON line on stdout:

* ``{"op": "crash", "rank": R}``: the rank dies as a SIGKILL would (its agent sees it after
  ``detect_s``); answers ``{"ok": true, "pid": <the dead incarnation's pid>, "at": <unix time>}``;
* ``{"op": "lose", "node": "sim0003"}``: the node dies: its agent stops at once, without revoking its
  lease (which then expires, as when a machine loses power); answers ``{"ok": true, "at": ...}``;
* ``{"op": "stats"}``: ``{"ok": true, "cpu_s": <this process's CPU seconds>, "nodes": N}``.

End of input stops every agent (ranks stopped, leases revoked) and the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from recoverd.agent.agent import AgentSettings, NodeAgent
from recoverd.agent.detectors import DETECTORS, Detector
from recoverd.agent.launcher import ExitInfo, RankLaunch, RankProcess
from recoverd.keys import DEFAULT_PREFIX, Keyspace
from recoverd.store import Store

__all__ = ["SimHost", "SimRuntime", "SimTiming", "main", "node_name"]

log = logging.getLogger(__name__)

#: Simulated PIDs start above Linux's largest pid_max, so they can never name a real process.
_PIDS = itertools.count(10_000_000 + 100_000 * (os.getpid() % 10_000))


def node_name(index: int) -> str:
    """The name of simulated node ``index`` (sorts in index order up to 10,000 nodes)."""
    return f"sim{index:04d}"


@dataclass(frozen=True, slots=True)
class SimTiming:
    """The delays of a real node that a simulated one reproduces (seconds)."""

    #: From a rank's death to its agent knowing (a pidfd wakes the agent in about 4 ms).
    detect_s: float = 0.004
    #: From SIGTERM to the exit of a rank that stops promptly.
    stop_s: float = 0.02


class SimRuntime:
    """Ranks that live in memory: started at once, ended by :meth:`crash` or :meth:`stop`."""

    starts_any_rank = True
    #: Simulated ranks form no group.
    rejoins_alone = True

    def __init__(
        self,
        on_exit: Callable[[RankProcess, ExitInfo], None],
        _protected: Callable[[], set[int]],
        timing: SimTiming = SimTiming(),
    ) -> None:
        self._on_exit = on_exit
        self._timing = timing
        self._procs: set[RankProcess] = set()
        self._loop = asyncio.get_running_loop()

    @property
    def processes(self) -> frozenset[RankProcess]:
        return frozenset(self._procs)

    def start(self, launch: RankLaunch) -> RankProcess:
        pid = next(_PIDS)
        proc = RankProcess(launch.rank, pid, pid, time.time(), None, self._loop.create_future())
        self._procs.add(proc)
        return proc

    def crash(self, rank: int) -> int:
        """End the running incarnation of ``rank`` as a SIGKILL would; return its pid.

        The process is gone at once (a second crash of the rank finds none); its agent hears of it
        ``detect_s`` later, as from a pidfd.
        """
        proc = next(p for p in self._procs if p.rank == rank and p.is_running)
        self._procs.discard(proc)
        info = ExitInfo(proc.pid, None, signal.SIGKILL)
        if self._timing.detect_s > 0:
            self._loop.call_later(self._timing.detect_s, self._end, proc, info)
        else:
            self._end(proc, info)
        return proc.pid

    async def stop(self, proc: RankProcess, grace_s: float) -> ExitInfo:
        if proc.is_running:
            if self._timing.stop_s > 0:
                await asyncio.sleep(self._timing.stop_s)
            self._end(proc, ExitInfo(proc.pid, None, signal.SIGTERM))
        return await proc.exited

    def _end(self, proc: RankProcess, info: ExitInfo) -> None:
        self._procs.discard(proc)
        if not proc.exited.done():
            proc.exited.set_result(info)
            self._on_exit(proc, info)

    async def watch(self) -> None:
        return

    def kill_strays(self) -> list[int]:
        return []

    def reap_strays(self) -> list[int]:
        return []


@dataclass(slots=True)
class _Node:
    name: str
    store: Store
    task: asyncio.Task[int] | None = None
    runtime: SimRuntime | None = None


class SimHost:
    """Simulated agents of one job, run on the current event loop (one Store and lease each).

    ``indices`` are the node indices hosted here (node ``i`` is ``sim<i>`` with node rank ``i``);
    ``spares`` are indices of spare nodes (``--spare`` agents: no ranks until a `recover` moves some
    there). ``detectors`` is the agents' detector registry (tests bind one to a stand-in library);
    ``nvml`` the agents' ``--nvml`` (off: simulated nodes have no GPUs).
    """

    def __init__(
        self,
        endpoint: str,
        prefix: str,
        job: str,
        indices: Sequence[int],
        *,
        nnodes: int,
        nproc: int,
        strategies: tuple[str, ...],
        spares: Sequence[int] = (),
        lease_ttl_s: float = 5.0,
        timing: SimTiming = SimTiming(),
        detectors: Sequence[type[Detector]] = DETECTORS,
        op_timeout_s: float = 10.0,
        nvml: str = "off",
    ) -> None:
        self.endpoint = endpoint
        self.keys = Keyspace(prefix)
        self.job = job
        self.indices = tuple(indices)
        self.spares = tuple(spares)
        self.nnodes = nnodes
        self.nproc = nproc
        self.strategies = strategies
        self.lease_ttl_s = lease_ttl_s
        self.timing = timing
        self.detectors = detectors
        self.op_timeout_s = op_timeout_s
        self.nvml = nvml
        self.nodes: dict[str, _Node] = {}
        self.exit_codes: dict[str, int] = {}

    @property
    def runtimes(self) -> dict[str, SimRuntime]:
        return {name: node.runtime for name, node in self.nodes.items() if node.runtime is not None}

    async def start(self, *, first_creates_job: bool = True, stagger_s: float = 0.0) -> None:
        """Start every agent; with ``first_creates_job`` the first one runs alone for a moment, so
        that it creates the job and the others join it (instead of racing to create it).

        ``stagger_s`` between two agents' starts: hundreds of agents joining at once on one CPU
        starve each other's lease keep-alives, which real nodes, each on its own CPU, do not.
        """
        for position, index in enumerate((*self.indices, *self.spares)):
            self._launch(index, spare=index in self.spares)
            if position == 0 and first_creates_job:
                await asyncio.sleep(0.3)
            elif stagger_s > 0:
                await asyncio.sleep(stagger_s)

    def _settings(self, index: int, spare: bool) -> AgentSettings:
        return AgentSettings(
            job=self.job,
            node=node_name(index),
            argv=("simulated-rank",),
            hang_detection=False,  # simulated ranks send no progress reports
            nvml=self.nvml,
            etcd=self.endpoint,
            nproc_per_node=self.nproc,
            nnodes=self.nnodes,
            node_rank=0 if spare else index,
            spare=spare,
            strategies=self.strategies,
            master_addr="127.0.0.1",
            master_port=29500,
            prefix=self.keys.prefix,
            lease_ttl_s=self.lease_ttl_s,
            stop_grace_s=0.5,
            exit_signals={},
        )

    def _launch(self, index: int, spare: bool) -> None:
        settings = self._settings(index, spare)
        store = Store(self.endpoint, op_timeout_s=self.op_timeout_s)
        node = _Node(settings.node, store)
        self.nodes[node.name] = node

        def runtime(on_exit: Callable[[RankProcess, ExitInfo], None], protected: Callable[[], set[int]]) -> SimRuntime:
            node.runtime = SimRuntime(on_exit, protected, self.timing)
            return node.runtime

        async def run() -> int:
            async with store:
                agent = NodeAgent(store, self.keys, settings, runtime=runtime, detectors=self.detectors)
                code = await agent.run()
                self.exit_codes[node.name] = code
                return code

        node.task = asyncio.create_task(run(), name=f"sim-agent-{node.name}")

    def node_of_rank(self, rank: int) -> str:
        """The node running ``rank`` now (a `recover` may have moved it to a spare)."""
        for name, node in self.nodes.items():
            if node.runtime is not None and any(p.rank == rank and p.is_running for p in node.runtime.processes):
                return name
        raise KeyError(f"rank {rank} runs on no simulated node here")

    def crash(self, rank: int) -> int:
        """SIGKILL (simulated) the rank where it runs now; return the pid it had."""
        runtime = self.nodes[self.node_of_rank(rank)].runtime
        assert runtime is not None
        return runtime.crash(rank)

    async def lose(self, name: str) -> None:
        """The node dies: its agent stops touching etcd at once and its lease is left to expire."""
        node = self.nodes[name]
        await node.store.aclose()  # every later call fails: no revoke, no last writes
        if node.task is not None:
            node.task.cancel()
            with contextlib.suppress(BaseException):
                await node.task

    async def close(self) -> None:
        """Stop every agent (ranks stopped, leases revoked), as at the end of a job."""
        tasks = [node.task for node in self.nodes.values() if node.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# ---------------------------------------------------------------------- the host process


def _indices(text: str) -> list[int]:
    """``0-127`` or ``3,5,9`` or a mix: the node indices."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m recoverd.agent.simulated",
        description="Run simulated nodes (the real node agent over in-memory ranks) against a real etcd."
        " Commands come as JSON lines on stdin (crash, lose, stats); see the module's documentation.",
    )
    parser.add_argument("--etcd", required=True, help="etcd endpoint(s), host:port[,host:port]")
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="key prefix (default %(default)s)")
    parser.add_argument("--job", required=True, help="job name")
    parser.add_argument("--nnodes", type=int, required=True, help="nodes in the job (all hosts together)")
    parser.add_argument("--nproc", type=int, default=8, help="ranks per node (default %(default)s)")
    parser.add_argument("--nodes", required=True, help="node indices hosted here: 0-127 or 1,3,5")
    parser.add_argument("--spares", default="", help="indices of spare nodes hosted here (above nnodes-1)")
    parser.add_argument("--strategies", default="recover-in-place,exit", help="the job's strategies, cheapest first")
    parser.add_argument("--lease-ttl", type=float, default=2.0, help="each agent's lease TTL, s (default %(default)s)")
    parser.add_argument("--detect-s", type=float, default=SimTiming().detect_s, help="death -> agent knows, s")
    parser.add_argument("--stop-s", type=float, default=SimTiming().stop_s, help="SIGTERM -> rank exit, s")
    parser.add_argument(
        "--no-first-alone", action="store_true", help="the job exists already: start every agent at once"
    )
    parser.add_argument("--stagger", type=float, default=0.0, help="seconds between two agents' starts")
    parser.add_argument("--log-level", default="WARNING", help="log level of the agents (default %(default)s)")
    return parser


async def _serve(args: argparse.Namespace) -> int:
    host = SimHost(
        args.etcd,
        args.prefix,
        args.job,
        _indices(args.nodes),
        nnodes=args.nnodes,
        nproc=args.nproc,
        strategies=tuple(filter(None, args.strategies.split(","))),
        spares=_indices(args.spares),
        lease_ttl_s=args.lease_ttl,
        timing=SimTiming(detect_s=args.detect_s, stop_s=args.stop_s),
    )
    await host.start(first_creates_job=not args.no_first_alone, stagger_s=args.stagger)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def answer(payload: dict[str, object]) -> None:
        sys.stdout.write(json.dumps(payload) + "\n")
        sys.stdout.flush()

    answer({"ok": True, "ready": True, "nodes": len(host.nodes)})
    try:
        while line := await reader.readline():
            try:
                request = json.loads(line)
                op = request["op"]
                if op == "crash":
                    pid = host.crash(int(request["rank"]))
                    answer({"ok": True, "pid": pid, "at": time.time()})
                elif op == "lose":
                    at = time.time()
                    await host.lose(str(request["node"]))
                    answer({"ok": True, "at": at})
                elif op == "stats":
                    times = os.times()
                    answer({"ok": True, "cpu_s": times.user + times.system, "nodes": len(host.nodes)})
                else:
                    answer({"ok": False, "error": f"unknown op {op!r}"})
            except (KeyError, ValueError, TypeError, StopIteration) as err:
                answer({"ok": False, "error": f"{type(err).__name__}: {err}"})
    finally:
        await host.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return asyncio.run(_serve(args))


if __name__ == "__main__":
    sys.exit(main())
