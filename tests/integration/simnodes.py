"""Simulated nodes for tests at the sizes users run: the real agent code over in-memory ranks.

Each simulated node is a real :class:`~recoverd.agent.agent.NodeAgent` with its own etcd connection
and lease, as on a real machine: it joins, registers, publishes its rank table, reports faults,
answers the recovery protocol and executes commands against the real etcd. Only the ranks are
simulated (:class:`SimRuntime`, a ``RankRuntime``): they "run" until the test crashes one or the
agent stops it, so hundreds of ranks cost no processes. All agents run in one event loop on a
background thread, so a test can drive them while it reads etcd through the synchronous
:class:`~tests.integration.cluster.Cluster` helpers.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from recoverd.agent.agent import AgentSettings, NodeAgent
from recoverd.agent.detectors import DETECTORS, Detector
from recoverd.agent.launcher import ExitInfo, RankLaunch, RankProcess
from recoverd.keys import Keyspace
from recoverd.store import Store

__all__ = ["SimNodes", "SimRuntime"]

#: Simulated PIDs start above Linux's largest pid_max, so they can never name a real process.
_PIDS = itertools.count(10_000_000)


class SimRuntime:
    """Ranks that live in memory: started at once, ended by :meth:`crash` or :meth:`stop`."""

    starts_any_rank = True

    def __init__(self, on_exit: Callable[[RankProcess, ExitInfo], None], _protected: Callable[[], set[int]]) -> None:
        self._on_exit = on_exit
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
        """End the running incarnation of ``rank`` as a SIGKILL would; return its pid."""
        proc = next(p for p in self._procs if p.rank == rank)
        self._end(proc, ExitInfo(proc.pid, None, signal.SIGKILL))
        return proc.pid

    async def stop(self, proc: RankProcess, grace_s: float) -> ExitInfo:
        if proc.is_running:
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


class SimNodes:
    """``nodes`` simulated agents of one job, ``nproc`` ranks each, on a background event loop.

    ``detectors`` is the agents' detector registry: the real one, or one with a detector bound to
    a stand-in library (e.g. ``NvmlDetector.with_library(...)``).
    """

    def __init__(
        self,
        endpoint: str,
        prefix: str,
        job: str,
        nodes: int,
        nproc: int,
        strategies: tuple[str, ...],
        detectors: Sequence[type[Detector]] = DETECTORS,
    ):
        self.endpoint = endpoint
        self.detectors = detectors
        self.keys = Keyspace(prefix)
        self.job = job
        self.nodes = nodes
        self.nproc = nproc
        self.strategies = strategies
        self.runtimes: dict[str, SimRuntime] = {}
        self.exit_codes: dict[str, int] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="simnodes", daemon=True)
        self._tasks: list[asyncio.Task[None]] = []

    def node_name(self, index: int) -> str:
        return f"sim{index:04d}"

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start_all(), self._loop).result(timeout=60)

    async def _start_all(self) -> None:
        for index in range(self.nodes):
            self._tasks.append(asyncio.create_task(self._run_agent(index)))
            if index == 0:
                await asyncio.sleep(0.2)  # the first agent creates the job; the others join it

    async def _run_agent(self, index: int) -> None:
        node = self.node_name(index)
        settings = AgentSettings(
            job=self.job,
            node=node,
            argv=("simulated-rank",),
            hang_detection=False,  # simulated ranks send no progress; hundreds of sockets would cost CPU
            etcd=self.endpoint,
            nproc_per_node=self.nproc,
            nnodes=self.nodes,
            node_rank=index,
            strategies=self.strategies,
            master_addr="127.0.0.1",
            master_port=29500,
            prefix=self.keys.prefix,
            lease_ttl_s=5.0,
            stop_grace_s=0.5,
            exit_signals={},
        )

        def runtime(on_exit: Callable[[RankProcess, ExitInfo], None], protected: Callable[[], set[int]]) -> SimRuntime:
            sim = SimRuntime(on_exit, protected)
            self.runtimes[node] = sim
            return sim

        async with Store(self.endpoint, op_timeout_s=10.0) as store:
            agent = NodeAgent(store, self.keys, settings, runtime=runtime, detectors=self.detectors)
            self.exit_codes[node] = await agent.run()

    def crash(self, rank: int) -> int:
        """SIGKILL (simulated) the rank, on its node's loop; return the pid it had."""
        node = self.node_name(rank // self.nproc)

        async def go() -> int:
            return self.runtimes[node].crash(rank)

        future: Future[int] = asyncio.run_coroutine_threadsafe(go(), self._loop)
        return future.result(timeout=10)

    def close(self) -> None:
        async def cancel() -> None:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(cancel(), self._loop).result(timeout=60)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._loop.close()
