"""A test cluster: recoverd services as real processes against a real etcd, and sync etcd readers.

Every service runs as its own ``python -m recoverd.cli.main ...`` process (the same entry point as
the ``recoverd`` console script), with sub-second timings, in a test-unique key prefix. Reads go
through the real store and keyspace modules. Waiting for a condition polls etcd: a test observes
from outside, where there is no event to wait on; the services under test never poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from recoverd.etcd_security import EtcdSecurity
from recoverd.jobview import JobView, read_job
from recoverd.keys import Keyspace
from recoverd.records import decode, pb
from recoverd.store import Store

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(ROOT / "examples" / "worker.py")
#: The harness's rank programs whose ranks never talk to each other (ADR 0041): an agent running
#: them says --independent-ranks, so that one is restarted alone as the tests expect.
INDEPENDENT_RANKS = frozenset(
    {
        WORKER,
        str(ROOT / "examples" / "client_worker.py"),  # its clients report; its ranks do not talk
        str(Path(__file__).with_name("warm_rank.py")),
        str(Path(__file__).with_name("tls_rank.py")),
        "sleep",
    }
)

FAST_COORDINATOR = [
    "--fault-window", "0.05",
    "--stop-timeout", "3",
    "--strategies-timeout", "3",
    "--decide-timeout", "60",
    "--recover-timeout", "5",
    "--coordinator-lease-ttl", "1",
]  # fmt: skip
# The production node lease (2 s, ADR 0025): a 1 s lease has a 0.5 s stall margin, which a 2-core
# machine running two test suites at once exceeded (a torch job's node was lost and its survivors
# restarted while its agent was merely starved).
FAST_AGENT = ["--agent-lease-ttl", "2", "--stop-grace", "1"]


@contextlib.contextmanager
def owned(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A fixture's cluster: closed at the end (every process stopped and reaped), its services'
    logs printed when the test failed."""
    try:
        yield cluster
    finally:
        cluster.close()
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(cluster.logs())


class Cluster:
    """Starts and owns service processes; every one is stopped and reaped by :meth:`close`."""

    def __init__(self, endpoint: str, prefix: str, workdir: Path, security: EtcdSecurity | None = None) -> None:
        self.endpoint = endpoint
        #: How the harness's own reads connect (default: plaintext, whatever the environment says).
        self.security = security or EtcdSecurity()
        #: Added to every service's environment (a service's own ``env`` wins).
        self.env: dict[str, str] = {}
        self.prefix = prefix
        self.keys = Keyspace(prefix)
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: set[str] = set()
        self.paused: set[str] = set()
        self._argv: dict[str, tuple[list[str], dict[str, str] | None]] = {}
        self._counter = 0

    # ---------------------------------------------------------------- processes
    def spawn(self, name: str, args: Sequence[str], *, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        self._counter += 1
        log_path = self.workdir / f"{name}.{self._counter}.log"
        full_env = {**os.environ, "RECOVERD_LOG_LEVEL": "INFO", "GRPC_VERBOSITY": "ERROR", **self.env, **(env or {})}
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "recoverd.cli.main", *args],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=full_env,
            )
        proc.log_path = log_path  # type: ignore[attr-defined]
        self.procs[name] = proc
        self._argv[name] = (list(args), env)
        return proc

    def respawn(self, name: str) -> subprocess.Popen[bytes]:
        """Start ``name`` again with the arguments it was first started with (a restart after a crash).

        The previous process must be gone (reaped); its log stays, the new one gets its own file.
        """
        previous = self.procs.get(name)
        if previous is not None and previous.poll() is None:
            raise RuntimeError(f"{name} (pid {previous.pid}) is still running")
        args, env = self._argv[name]
        self.killed.discard(name)
        return self.spawn(name, args, env=env)

    def coordinator(
        self, name: str = "coordinator", extra: Sequence[str] = (), env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        return self.spawn(
            name, ["coordinator", "--etcd", self.endpoint, "--prefix", self.prefix, *FAST_COORDINATOR, *extra], env=env
        )

    def strategy(self, name: str = "strategy", env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        return self.spawn(name, ["strategy", "--etcd", self.endpoint, "--prefix", self.prefix], env=env)

    def agent(
        self,
        job: str,
        node: str = "node0",
        *,
        nproc: int = 4,
        strategies: str | None = None,
        nnodes: int = 1,
        node_rank: int = 0,
        worker: Sequence[str] = ("--steps", "600", "--step-time", "0.1"),
        extra: Sequence[str] = (),
        command: Sequence[str] | None = None,
        env: dict[str, str] | None = None,
        independent: bool | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start the agent of ``node``; its ranks run examples/worker.py with ``worker``, or ``command``.

        ``independent``: pass ``--independent-ranks`` (ADR 0041). By default it is passed for the
        ranks that are independent processes (:data:`INDEPENDENT_RANKS`), so that a plain rank is
        restarted alone as these tests expect; a command of ranks that form a group never gets it.
        """
        args = [
            "agent", "--etcd", self.endpoint, "--prefix", self.prefix, "--job", job, "--node", node,
            "--nproc-per-node", str(nproc), "--nnodes", str(nnodes), "--node-rank", str(node_rank),
            "--log-dir", str(self.workdir / f"logs-{job}-{node}"), *FAST_AGENT, *extra,
        ]  # fmt: skip
        if strategies:
            args += ["--strategies", strategies]
        if nnodes > 1:
            args += ["--master-addr", "127.0.0.1"]
        rank_argv = list(command) if command is not None else [sys.executable, WORKER, *worker]
        if independent is None:
            independent = any(part in INDEPENDENT_RANKS for part in rank_argv)
        if independent:
            args.append("--independent-ranks")
        return self.spawn(f"agent-{node}", [*args, "--", *rank_argv], env=env)

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        proc = self.procs[name]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
        return proc.wait(timeout=timeout)

    def kill(self, name: str) -> None:
        """SIGKILL a service on purpose (a crash, not a shutdown) and reap it."""
        self.killed.add(name)
        self.procs[name].kill()
        self.procs[name].wait(timeout=5)

    def pause(self, name: str) -> None:
        """SIGSTOP a service: it holds its state but does nothing (a network partition, seen from etcd)."""
        self.paused.add(name)
        self.procs[name].send_signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        """SIGCONT a paused service: the partition heals."""
        self.paused.discard(name)
        with contextlib.suppress(ProcessLookupError):
            self.procs[name].send_signal(signal.SIGCONT)

    def wait_exit(self, name: str, timeout: float = 30.0) -> int:
        return self.procs[name].wait(timeout=timeout)

    def logs(self) -> str:
        out = []
        for name, proc in self.procs.items():
            path = getattr(proc, "log_path", None)
            if path and Path(path).exists():
                out.append(f"----- {name} (rc={proc.poll()}) -----\n{Path(path).read_text(errors='replace')[-4000:]}")
        return "\n".join(out)

    def close(self) -> None:
        """Stop every service (SIGTERM, then SIGKILL), agents first so their ranks are stopped too."""
        for name in list(self.paused):  # a stopped process cannot act on SIGTERM
            self.resume(name)
        order = sorted(self.procs, key=lambda n: not n.startswith("agent"))
        for name in order:
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)

    # ---------------------------------------------------------------- etcd reads
    def _run(self, fn: Callable[[Store], Any]) -> Any:
        async def go() -> Any:
            async with Store(self.endpoint, op_timeout_s=3, security=self.security, warn_version=False) as store:
                return await fn(store)

        return asyncio.run(go())

    def view(self, job: str) -> JobView:
        return self._run(lambda store: read_job(store, self.keys, job))  # type: ignore[no-any-return]

    def ranks(self, job: str) -> dict[int, pb.RankStatus]:
        view = self.view(job)
        return {r.rank: r for nr in view.ranks.values() for r in nr.ranks}

    def events(self, job: str) -> list[pb.Event]:
        view = self.view(job)
        if view.run is None:
            return []
        run = view.run

        async def read(store: Store) -> list[pb.Event]:
            snap = await store.get_prefix(self.keys.events_prefix(run))
            return [decode(pb.Event, kv.value, kv.key) for kv in snap.kvs]

        return self._run(read)  # type: ignore[no-any-return]

    def put(self, key: str, value: bytes) -> None:
        self._run(lambda store: store.put(key, value))

    def txn(self, ops: Sequence[Any]) -> None:
        """Commit ``ops`` (store.Put/Delete) in one transaction with no compare: a writer that ignores fencing."""
        self._run(lambda store: store.txn([], list(ops)))

    def get(self, key: str) -> bytes | None:
        async def read(store: Store) -> bytes | None:
            kv = await store.get(key)
            return kv.value if kv else None

        return self._run(read)  # type: ignore[no-any-return]

    # ---------------------------------------------------------------- waiting
    def wait_for(self, what: str, predicate: Callable[[], T | None], timeout: float = 20.0) -> T:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = predicate()
            except Exception as err:  # etcd may be restarting in some tests
                last = err
            if last and not isinstance(last, Exception):
                return last  # type: ignore[no-any-return]
            for name, proc in self.procs.items():
                if (
                    name.startswith(("coordinator", "strategy"))
                    and name not in self.killed
                    and proc.poll() not in (None, 0)
                ):
                    raise AssertionError(f"{name} died (rc={proc.returncode}) waiting for {what}\n{self.logs()}")
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}\n{self.logs()}")

    def wait_running(self, job: str, world: int, timeout: float = 20.0) -> dict[int, pb.RankStatus]:
        def ready() -> dict[int, pb.RankStatus] | None:
            ranks = self.ranks(job)
            ok = len(ranks) == world and all(r.state == pb.RANK_RUNNING for r in ranks.values())
            return ranks if ok else None

        return self.wait_for(f"{world} running ranks of {job}", ready, timeout)
