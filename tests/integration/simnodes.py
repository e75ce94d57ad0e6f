"""Simulated nodes in a test: :class:`recoverd.agent.simulated.SimHost` on a background thread.

Each simulated node is the real agent code with its own etcd connection and lease over in-memory
ranks (docs/scale.md). All agents run in one event loop on a background thread, so a test can
drive them while it reads etcd through the synchronous :class:`~tests.integration.cluster.Cluster`
helpers.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from typing import TypeVar

from recoverd.agent.detectors import DETECTORS, Detector
from recoverd.agent.simulated import SimHost, SimRuntime, node_name

__all__ = ["SimNodes", "SimRuntime"]

T = TypeVar("T")


class SimNodes:
    """``nodes`` simulated agents of one job, ``nproc`` ranks each, on a background event loop."""

    def __init__(
        self,
        endpoint: str,
        prefix: str,
        job: str,
        nodes: int,
        nproc: int,
        strategies: tuple[str, ...],
        detectors: Sequence[type[Detector]] = DETECTORS,
        spares: int = 0,
        lease_ttl_s: float = 5.0,
    ):
        self.host = SimHost(
            endpoint,
            prefix,
            job,
            range(nodes),
            nnodes=nodes,
            nproc=nproc,
            strategies=strategies,
            spares=range(nodes, nodes + spares),
            detectors=detectors,
            lease_ttl_s=lease_ttl_s,
            nvml="auto",  # a test may bind the NVML detector to a stand-in library
        )
        self.nproc = nproc
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="simnodes", daemon=True)

    @property
    def runtimes(self) -> dict[str, SimRuntime]:
        return self.host.runtimes

    @property
    def exit_codes(self) -> dict[str, int]:
        return self.host.exit_codes

    def node_name(self, index: int) -> str:
        return node_name(index)

    def start(self) -> None:
        self._thread.start()
        self._call(self.host.start(), timeout=60)

    def _call(self, coro: Coroutine[object, object, T], timeout: float) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout=timeout)

    def crash(self, rank: int) -> int:
        """SIGKILL (simulated) the rank where it runs; return the pid it had."""

        async def go() -> int:
            return self.host.crash(rank)

        return self._call(go(), timeout=10)

    def lose(self, node: str) -> None:
        """The node dies: its agent stops at once and its lease is left to expire."""
        self._call(self.host.lose(node), timeout=30)

    def close(self) -> None:
        if self._thread.is_alive():
            self._call(self.host.close(), timeout=60)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._loop.close()
