"""`make bench-node-loss`: how soon a dead node is declared, and whether a live one ever is (docs/adr/0025).

Everything runs with the defaults a user gets: a single-member etcd with **stock flags**
(:class:`~recoverd.etcd_server.EmbeddedEtcd` without ``for_tests``, so fsync is on and the election
timeout is 1 s, which makes etcd's minimum lease TTL 2 s), or the etcd given with ``--etcd``; a
``recoverd coordinator`` and a ``recoverd strategy`` process; ``recoverd agent`` processes with the
default lease, each running one ``sleep`` rank.

* **Detection** (``--trials N``): per trial a fresh job of ``--nodes`` agents. Once every rank runs,
  after a random 2-4 s (so the kill falls anywhere between two keep-alives), one agent is SIGKILLed
  and then its rank (each rank leads its own process group): a dead machine, as etcd sees it. Measured
  from the kill's wall time: ``expired``, the node key's deletion arriving at this process's watch
  (the lease ran out and etcd revoked it); ``declared``, the ``detected_at`` of the coordinator's
  lost-node fault in the recovery record (the coordinator's clock when its pass saw the node gone).
* **Soak** (``--soak S``): ``--agents`` agents of one job for S seconds, no kill. A false node loss
  is any deletion of a node key, any lost-node fault or recovery, or an agent's "lease ... lost";
  keep-alives confirmed close to the lease's end are counted from the agents' warnings, and a probe
  process holding one more such lease reports the least margin any of its keep-alives had. Meant to run
  beside a loaded machine (``make bench``, CPU hogs); the load average is sampled and reported.

Results are merged into ``bench/results/node_loss.json`` (each mode updates its own section).
Usage: ``python bench/node_loss.py --trials 10`` and ``python bench/node_loss.py --trials 0 --soak 600``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import ctypes.util
import json
import os
import platform
import random
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recoverd.agent.settings import DEFAULT_LEASE_TTL_S
from recoverd.etcd_server import EmbeddedEtcd
from recoverd.jobview import read_job
from recoverd.keys import Keyspace, RunRef
from recoverd.records import decode, pb, ts_to_s
from recoverd.store import KEEPALIVE_FRACTION, Resync, Store

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "node_loss.json"
LATE_RE = re.compile(r"keep-alive confirmed only ([0-9.]+)s before")
LOST_RE = re.compile(r"lease \w+ (lost|expired)|lease lost; registering again")


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (nearest rank), as bench/bench.py reports them."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def become_subreaper() -> None:
    """Killed agents' ranks re-parent to this process, which reaps them (no zombies left behind)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


class Bench:
    """The control plane and the agents of one bench run; every process is stopped by :meth:`close`."""

    def __init__(self, endpoint: str, workdir: Path, lease_ttl: int | None) -> None:
        self.endpoint = endpoint
        self.prefix = f"/nodeloss-{secrets.token_hex(4)}/v1"
        self.keys = Keyspace(self.prefix)
        self.workdir = workdir
        self.lease_ttl = lease_ttl
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: dict[str, Path] = {}

    def spawn(self, name: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        log_path = self.workdir / f"{name}.log"
        env = {**os.environ, "RECOVERD_LOG_LEVEL": "INFO", "GRPC_VERBOSITY": "ERROR"}
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "recoverd.cli.main", *args],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=env,
            )
        self.procs.append(proc)
        self.logs[name] = log_path
        return proc

    def control_plane(self) -> None:
        common = ["--etcd", self.endpoint, "--prefix", self.prefix]
        self.spawn("coordinator", ["coordinator", *common])
        self.spawn("strategy", ["strategy", *common])

    def agent(self, job: str, node: str, node_rank: int, nnodes: int) -> subprocess.Popen[bytes]:
        args = [
            "agent", "--etcd", self.endpoint, "--prefix", self.prefix, "--job", job, "--node", node,
            "--nproc-per-node", "1", "--nnodes", str(nnodes), "--node-rank", str(node_rank),
            "--master-addr", "127.0.0.1", "--log-dir", str(self.workdir / f"ranks-{job}-{node}"),
        ]  # fmt: skip
        if self.lease_ttl is not None:
            args += ["--agent-lease-ttl", str(self.lease_ttl)]
        return self.spawn(f"agent-{job}-{node}", [*args, "--", "sleep", "86400"])

    def probe(self, seconds: float) -> subprocess.Popen[str]:
        """This script's ``--probe``: one more agent-like lease, held for ``seconds``."""
        argv = [sys.executable, __file__, "--probe", str(seconds), "--etcd", self.endpoint]
        if self.lease_ttl is not None:
            argv += ["--agent-lease-ttl", str(self.lease_ttl)]
        return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)

    @staticmethod
    def stop(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def close(self) -> None:
        # Agents first (they stop their ranks), then the control plane.
        for proc in reversed(self.procs):
            self.stop(proc)


async def wait_running(store: Store, keys: Keyspace, job: str, nnodes: int, timeout_s: float = 120.0) -> RunRef:
    """Every node registered and its rank running (polled: the bench watches from outside)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = await read_job(store, keys, job)
        running = [r for t in view.ranks.values() for r in t.ranks if r.state == pb.RANK_RUNNING]
        if view.run is not None and len(view.nodes) == nnodes and len(running) == nnodes:
            return view.run
        await asyncio.sleep(0.1)
    raise SystemExit(f"bench: job {job} did not reach {nnodes} running ranks in {timeout_s:.0f}s")


async def first_delete(store: Store, key: str, start: int) -> float:
    """Wall time at which the deletion of ``key`` arrives."""
    async for item in store.watch_key(key, start):
        if isinstance(item, Resync):
            if await store.get(key) is None:
                return time.time()
        elif item.is_delete:
            return time.time()
    raise AssertionError("unreachable")


async def lost_fault(store: Store, keys: Keyspace, run: RunRef, node: str, start: int) -> tuple[float, float]:
    """(the lost-node fault's detected_at, the recovery's opened_at) once the recovery record holds one."""
    key = keys.recovery(run)
    async for item in store.watch_key(key, start):
        kv = await store.get(key) if isinstance(item, Resync) else item
        if kv is None or not kv.value:
            continue
        rec = decode(pb.Recovery, kv.value, key)
        for fault in rec.faults:
            if fault.node == node and fault.source == pb.SOURCE_LEASE:
                return ts_to_s(fault.detected_at), ts_to_s(rec.opened_at)
    raise AssertionError("unreachable")


async def forget_job(store: Store, keys: Keyspace, job: str) -> None:
    """Remove a finished trial's job, so the coordinator does not keep recovering it."""
    for prefix in (keys.job_prefix(job), keys.job_events_prefix(job), keys.job_rendezvous_prefix(job)):
        await store.delete_prefix(prefix)


def kill_node(agent: subprocess.Popen[bytes], rank_pids: Sequence[int]) -> float:
    """SIGKILL the agent, then its ranks' groups (ranks first would let the agent report their exit)."""
    killed_at = time.time()
    agent.kill()
    for pid in rank_pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    agent.wait(timeout=10)
    for pid in rank_pids:  # re-parented to this subreaper
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return killed_at


async def detection(bench: Bench, trials: int, nnodes: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    print(f"{'trial':>5} {'expired s':>10} {'declared s':>11} {'opened s':>9} {'load 1m':>8}", flush=True)
    async with Store(bench.endpoint) as store:
        for trial in range(trials):
            job = f"trial{trial}-{secrets.token_hex(3)}"
            agents = [bench.agent(job, f"n{i}", i, nnodes) for i in range(nnodes)]
            run = await wait_running(store, bench.keys, job, nnodes)
            await asyncio.sleep(random.uniform(2.0, 4.0))
            victim = f"n{nnodes - 1}"
            view = await read_job(store, bench.keys, job)
            pids = [r.pid for r in view.ranks[victim].ranks if r.pid > 0]
            start = view.revision + 1
            expired = asyncio.create_task(first_delete(store, bench.keys.node(run, victim), start))
            declared = asyncio.create_task(lost_fault(store, bench.keys, run, victim, start))
            killed_at = kill_node(agents[-1], pids)
            async with asyncio.timeout(60):
                expired_at = await expired
                detected_at, opened_at = await declared
            row = {
                "trial": trial,
                "killed_at": killed_at,
                "expired_s": round(expired_at - killed_at, 3),
                "declared_s": round(detected_at - killed_at, 3),
                "opened_s": round(opened_at - killed_at, 3),
                "load_1m": round(os.getloadavg()[0], 2),
            }
            rows.append(row)
            print(
                f"{trial:>5} {row['expired_s']:>10.3f} {row['declared_s']:>11.3f} {row['opened_s']:>9.3f}"
                f" {row['load_1m']:>8.2f}",
                flush=True,
            )
            for agent in agents[:-1]:
                bench.stop(agent)
            await forget_job(store, bench.keys, job)

    def stats(name: str) -> dict[str, float]:
        values = [r[name] for r in rows]
        return {
            "median_s": round(statistics.median(values), 3),
            "p90_s": round(pct(values, 90), 3),
            "max_s": round(max(values), 3),
            "min_s": round(min(values), 3),
        }

    summary = {"expired": stats("expired_s"), "declared": stats("declared_s")}
    print(
        "declared: median {median_s:.3f} s, p90 {p90_s:.3f} s, max {max_s:.3f} s".format(**summary["declared"]),
        flush=True,
    )
    return {"trials": trials, "nodes_per_job": nnodes, "summary": summary, "rows": rows}


async def probe(endpoint: str, seconds: float, lease_ttl: int | None) -> None:
    """``--probe``: hold one lease as an agent does (same LeaseKeeper, same TTL) and print how close
    its keep-alives came to the lease's end: the agents only log the near misses."""
    ttl = lease_ttl or DEFAULT_LEASE_TTL_S
    async with Store(endpoint) as store, store.lease(ttl) as lease:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await lease.lost.wait()
        result = {
            "ttl_s": lease.ttl,
            "interval_s": lease.interval_s,
            "renewals": lease.renewals,
            "resends": lease.resends,
            "least_margin_s": round(lease.min_margin_s, 3),
            "lost": lease.lost.is_set(),
        }
    print(json.dumps(result), flush=True)


async def write_load(store: Store, per_s: float, prefix: str) -> None:
    """``--etcd-writes``: puts to the same etcd (outside the jobs), each one fsynced by etcd, so its
    raft log and disk are busy too (a lease is revoked through raft; a renewal waits for the apply)."""
    n = 0
    value = secrets.token_bytes(256)
    while True:
        await store.put(f"{prefix}/write-load/{n % 1000}", value)
        n += 1
        await asyncio.sleep(1 / per_s)


async def soak(bench: Bench, seconds: float, nnodes: int, etcd_writes: float) -> dict[str, Any]:
    job = f"soak-{secrets.token_hex(3)}"
    agents = [bench.agent(job, f"n{i}", i, nnodes) for i in range(nnodes)]
    prober = bench.probe(seconds)
    loads: list[float] = []
    deletions: list[tuple[float, str]] = []
    async with Store(bench.endpoint) as store:
        run = await wait_running(store, bench.keys, job, nnodes)
        start = await store.revision() + 1
        began = time.time()

        async def watch_nodes() -> None:
            async for item in store.watch_prefix(bench.keys.nodes_prefix(run), start):
                if not isinstance(item, Resync) and item.is_delete:
                    deletions.append((time.time() - began, item.key.rsplit("/", 1)[1]))
                    print(f"  FALSE NODE LOSS: {item.key} deleted at {time.time() - began:.1f}s", flush=True)

        watcher = asyncio.create_task(watch_nodes())
        writer = asyncio.create_task(write_load(store, etcd_writes, bench.prefix)) if etcd_writes > 0 else None
        try:
            while (elapsed := time.time() - began) < seconds:
                await asyncio.sleep(min(10.0, seconds - elapsed))
                loads.append(os.getloadavg()[0])
                print(
                    f"  soak {time.time() - began:5.0f}s: load {loads[-1]:.2f}, node keys deleted {len(deletions)}",
                    flush=True,
                )
        finally:
            for task in (watcher, writer):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        view = await read_job(store, bench.keys, job)
        crashed = [i for i, agent in enumerate(agents) if agent.poll() is not None]
        out, _ = await asyncio.to_thread(prober.communicate, timeout=60)
        probed = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"error": prober.returncode}
        for agent in agents:
            bench.stop(agent)
        await forget_job(store, bench.keys, job)
    rec = view.recovery
    lease_faults = [f.fault_id for f in rec.faults if f.source == pb.SOURCE_LEASE] if rec is not None else []
    recoveries = rec.recovery_id if rec is not None else 0
    margins: list[float] = []
    lost_lines: list[str] = []
    for name, path in bench.logs.items():
        if not name.startswith(f"agent-{job}-"):
            continue
        for line in path.read_text(errors="replace").splitlines():
            if match := LATE_RE.search(line):
                margins.append(float(match.group(1)))
            if LOST_RE.search(line):
                lost_lines.append(f"{name}: {line}")
    false_losses = len(deletions) + len(lost_lines) + len(lease_faults) + int(bool(probed.get("lost")))
    result = {
        "seconds": seconds,
        "agents": nnodes,
        "etcd_writes_per_s": etcd_writes,
        "false_node_losses": false_losses,
        "node_keys_deleted": [{"at_s": round(at, 1), "node": node} for at, node in deletions],
        "lease_lost_log_lines": lost_lines,
        "lease_faults": lease_faults,
        "recoveries_opened": recoveries,
        "agents_crashed": crashed,
        "late_keepalives": len(margins),
        "least_margin_s": min(margins) if margins else None,
        "probe": probed,
        "load_avg_1m": {
            "mean": round(statistics.mean(loads), 2) if loads else None,
            "max": round(max(loads), 2) if loads else None,
        },
    }
    print(
        f"soak: {false_losses} false node loss(es) in {seconds:.0f}s of {nnodes} agents; recoveries opened"
        f" {recoveries}; late keep-alives {len(margins)}; probe {probed}; load avg {result['load_avg_1m']}",
        flush=True,
    )
    return result


def merge_results(section: str, data: dict[str, Any], out: Path) -> None:
    results: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    results[section] = data
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


async def main_async(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="recoverd-nodeloss-"))
    etcd: EmbeddedEtcd | None = None
    bench: Bench | None = None
    try:
        if args.etcd:
            endpoint = args.etcd
            etcd_desc = f"given: {endpoint}"
        else:
            # Stock flags on purpose: the tests' fast etcd (for_tests) has a 1 s minimum TTL and no fsync.
            etcd = EmbeddedEtcd(data_dir=str(workdir / "etcd"))
            await etcd.async_start()
            endpoint = etcd.endpoint
            etcd_desc = f"embedded, stock flags: {etcd.etcd_binary.describe()}"
        bench = Bench(endpoint, workdir, args.agent_lease_ttl)
        bench.control_plane()
        meta = {
            "when": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}",
            "etcd": etcd_desc,
            "agent_lease_ttl_s": args.agent_lease_ttl or "default",
            "keepalive_fraction": KEEPALIVE_FRACTION,
            "command": " ".join(["python", "bench/node_loss.py", *sys.argv[1:]]),
            "load": args.load,
        }
        print(f"bench node-loss: {meta['etcd']}; agent lease TTL {meta['agent_lease_ttl_s']}", flush=True)
        if args.trials > 0:
            result = await detection(bench, args.trials, args.nodes)
            merge_results(args.section or "detection", {**meta, **result}, args.out)
        if args.soak > 0:
            result = await soak(bench, args.soak, args.agents, args.etcd_writes)
            merge_results(args.section or "soak", {**meta, **result}, args.out)
        print(f"results: {args.out}", flush=True)
    finally:
        if bench is not None:
            bench.close()
        if etcd is not None:
            await etcd.async_stop()
        if args.keep:
            print(f"logs kept in {workdir}", flush=True)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10, help="detection trials (0: none)")
    parser.add_argument("--nodes", type=int, default=3, help="agents per detection job")
    parser.add_argument("--soak", type=float, default=0.0, metavar="S", help="soak seconds (0: none)")
    parser.add_argument("--agents", type=int, default=8, help="agents in the soak")
    parser.add_argument("--etcd", default=None, help="an etcd to use (default: an embedded one, stock flags)")
    parser.add_argument("--agent-lease-ttl", type=int, default=None, help="default: the agent's own default")
    parser.add_argument("--etcd-writes", type=float, default=0.0, metavar="N", help="soak: N puts/s to the etcd too")
    parser.add_argument("--load", default="", help="what loads the machine, recorded with the results")
    parser.add_argument("--section", default=None, help="results section (default: detection, soak)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--keep", action="store_true", help="keep the logs (a temp dir)")
    parser.add_argument("--probe", type=float, default=0.0, help=argparse.SUPPRESS)  # the soak's lease probe
    args = parser.parse_args()
    if args.probe:
        asyncio.run(probe(args.etcd, args.probe, args.agent_lease_ttl))
        return
    become_subreaper()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
