"""`make bench-scale`: one recovery at 64 to 1,024 nodes, against a real etcd (docs/scale.md).

Per size (nodes x ranks per node) a fresh single-member etcd with stock flags (fsync on; or the
etcd given with ``--etcd``), one ``recoverd coordinator`` and one ``recoverd strategy`` process, and
the job's nodes as **simulated nodes** (``python -m recoverd.agent.simulated``: the real agent code,
one etcd connection and lease per node, in-memory ranks), ``--per-host`` nodes per OS process, plus
``--trials`` spare nodes. The job's strategies are ``recover-in-place, recover, exit``.

Scenarios, ``--trials`` each, one after the other in the same job (so the second and third fault of a
run are measured too):

* ``rank``: one rank's SIGKILL (simulated), recovered in place;
* ``node``: a whole node dies (its agent stops without revoking its lease): after the lease expires
  the coordinator declares the node lost and its ranks move to a spare (`recover`);
* ``exit``: the policy is switched to ``exit`` only and one rank is killed: every rank restarts.

For each recovery, from the records it leaves in etcd (one clock: every process runs here):
``decision`` fault -> the selector's decision, ``acked`` fault -> the last commanded node's ack,
``running`` fault -> the last restarted rank's start, ``done`` fault -> PHASE_DONE; for ``node``
also ``expired`` (the loss, as the node key's deletion reaches this process) -> decision. etcd's
own ``/metrics`` give the requests (by method), keys written, watch events and bytes of each
recovery (from the fault to 0.5 s after DONE), and the coordinator's and strategy selector's CPU
seconds are read from /proc.

``--concurrent J``: J jobs of 32 nodes x 8 ranks sharing one etcd, coordinator and selector, one rank
of every job killed at once; fault -> DONE per job. ``--real N``: the rank scenario with N real
``recoverd agent`` processes of ``sleep`` ranks, to check the simulation against real agents.

Results: ``bench/results/scale.json``, ``scale.md`` (the table) and ``scale.png`` (each figure
against the node count). ``python bench/scale.py --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

# bench/ is the script's directory: the node-loss bench's helpers are shared, not copied.
from node_loss import first_delete, pct

from recoverd.agent.simulated import node_name
from recoverd.cli.ctl import set_policy
from recoverd.etcd_server import EmbeddedEtcd
from recoverd.keys import Keyspace, RunRef
from recoverd.policy import parse_policy
from recoverd.records import decode, pb, ts_to_s
from recoverd.store import Resync, Store

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
STRATEGIES = "recover-in-place,recover,exit"
#: A bench kills ranks over and over: budgets that never run out (the default allows 3 exits in 10 min).
BUDGETS = "budgets: {exit: {max: 1000, window_s: 600}, recover-in-place: {max: 1000, window_s: 600}}\n"
METHODS = ("Range", "Put", "Txn", "DeleteRange")


# ---------------------------------------------------------------------- measuring etcd and CPU


def etcd_counters(endpoint: str) -> dict[str, float]:
    """etcd's request, write, watch-event and byte counters (from its /metrics)."""
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    out: dict[str, float] = dict.fromkeys(
        [*(f"req_{m}" for m in METHODS), "keys_put", "keys_deleted", "watch_events", "bytes_in", "bytes_out"], 0.0
    )
    simple = {
        "etcd_mvcc_put_total": "keys_put",
        "etcd_mvcc_delete_total": "keys_deleted",
        "etcd_debugging_mvcc_events_total": "watch_events",
        "etcd_network_client_grpc_received_bytes_total": "bytes_in",
        "etcd_network_client_grpc_sent_bytes_total": "bytes_out",
    }
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name, _, value = line.rpartition(" ")
        if name in simple:
            out[simple[name]] = float(value)
        elif name.startswith("grpc_server_handled_total{"):
            for method in METHODS:
                if f'grpc_method="{method}"' in name:
                    out[f"req_{method}"] += float(value)
    return out


def counter_delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    delta["writes"] = delta["req_Put"] + delta["req_Txn"] + delta["req_DeleteRange"]
    return delta


def cpu_seconds(pid: int) -> float:
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return math.nan
    return times.user + times.system


# ---------------------------------------------------------------------- processes


class SimHostProcess:
    """One ``python -m recoverd.agent.simulated`` process and its JSON-line control channel."""

    def __init__(self, args: Sequence[str], log_path: Path) -> None:
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "recoverd.agent.simulated", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
        )
        self.ready = self.read()

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"bench: a simulated host exited (rc {self.proc.poll()}); see {self.log.name}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, **request: object) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self.read()
        if not answer.get("ok"):
            raise SystemExit(f"bench: {request} failed: {answer}")
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


@dataclass
class Plane:
    """An etcd, a coordinator and a strategy selector (one per size, so CPU and metrics are its own)."""

    workdir: Path
    etcd_endpoint: str | None
    fast_etcd: bool
    etcd: EmbeddedEtcd | None = None
    endpoint: str = ""
    prefix: str = field(default_factory=lambda: f"/scale-{secrets.token_hex(4)}/v1")
    services: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self) -> None:
        if self.etcd_endpoint:
            self.endpoint = self.etcd_endpoint
        else:
            self.etcd = EmbeddedEtcd(
                data_dir=str(self.workdir / "etcd"), for_tests=self.fast_etcd, log_path=str(self.workdir / "etcd.log")
            )
            self.etcd.start()
            self.endpoint = self.etcd.endpoint
        common = ["--etcd", self.endpoint, "--prefix", self.prefix]
        for name in ("coordinator", "strategy"):
            with open(self.workdir / f"{name}.log", "wb") as log_file:
                self.services[name] = subprocess.Popen(
                    [sys.executable, "-m", "recoverd.cli.main", name, *common],
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
                )

    def cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(proc.pid) for name, proc in self.services.items()}

    def close(self) -> None:
        for proc in self.services.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self.etcd is not None:
            self.etcd.stop()


class Fleet:
    """The simulated nodes of one job, spread over host processes."""

    def __init__(
        self, plane: Plane, job: str, nodes: int, nproc: int, spares: int, per_host: int, lease_ttl: float
    ) -> None:
        self.plane = plane
        self.job = job
        self.nodes = nodes
        self.nproc = nproc
        self.spares = spares
        self.per_host = per_host
        self.lease_ttl = lease_ttl
        self.hosts: list[SimHostProcess] = []
        self.log_level = os.environ.get("SCALE_LOG_LEVEL", "WARNING")
        #: Seconds between two agents' starts in one host process (see SimHost.start).
        self.stagger = 0.05
        self.host_of: dict[str, SimHostProcess] = {}

    def _host(self, index: int, indices: Sequence[int], spares: Sequence[int], first: bool) -> SimHostProcess:
        ranges = ",".join(str(i) for i in indices)
        args = [
            "--etcd", self.plane.endpoint, "--prefix", self.plane.prefix, "--job", self.job,
            "--nnodes", str(self.nodes), "--nproc", str(self.nproc), "--nodes", ranges,
            "--spares", ",".join(str(i) for i in spares), "--strategies", STRATEGIES,
            "--lease-ttl", str(self.lease_ttl), "--log-level", self.log_level, "--stagger", str(self.stagger),
        ]  # fmt: skip
        if not first:
            args.append("--no-first-alone")
        host = SimHostProcess(args, self.plane.workdir / f"{self.job}-host{index}.log")
        for i in (*indices, *spares):
            self.host_of[node_name(i)] = host
        self.hosts.append(host)
        return host

    async def start(self, store: Store) -> RunRef:
        groups = [list(range(i, min(i + self.per_host, self.nodes))) for i in range(0, self.nodes, self.per_host)]
        spare_ids = list(range(self.nodes, self.nodes + self.spares))
        self._host(0, groups[0], spare_ids if len(groups) == 1 else [], first=True)
        keys = Keyspace(self.plane.prefix)
        while await store.get(keys.job_spec(self.job)) is None:  # noqa: ASYNC110 - polling etcd from outside
            await asyncio.sleep(0.05)
        for index, group in enumerate(groups[1:], start=1):
            self._host(index, group, spare_ids if index == len(groups) - 1 else [], first=False)
        return await wait_running(store, keys, self.job, self.nodes * self.nproc, self.nodes + self.spares)

    def crash(self, rank: int) -> dict[str, Any]:
        return self.host_of[node_name(rank // self.nproc)].ask(op="crash", rank=rank)

    def lose(self, node: str) -> dict[str, Any]:
        return self.host_of[node].ask(op="lose", node=node)

    def cpu(self) -> float:
        return sum(cpu_seconds(h.proc.pid) for h in self.hosts)

    def close(self) -> None:
        for host in self.hosts:
            host.close()


async def wait_running(
    store: Store, keys: Keyspace, job: str, world: int, agents: int, timeout_s: float = 600
) -> RunRef:
    """Every node registered and every rank running (polled once a second)."""
    deadline = time.monotonic() + timeout_s
    spec_kv = await store.get(keys.job_spec(job))
    assert spec_kv is not None
    run = RunRef(job, decode(pb.JobSpec, spec_kv.value, keys.job_spec(job)).uid)
    while time.monotonic() < deadline:
        nodes = await store.get_prefix(keys.run_prefix(run) + "nodes/", keys_only=True)
        tables = await store.get_prefix(keys.run_prefix(run) + "ranks/")
        running = sum(
            1 for kv in tables.kvs for r in decode(pb.NodeRanks, kv.value, kv.key).ranks if r.state == pb.RANK_RUNNING
        )
        if len(nodes.kvs) >= agents and running == world:
            return run
        await asyncio.sleep(1.0)
    raise SystemExit(f"bench: job {job} did not reach {world} running ranks on {agents} agents in {timeout_s:.0f}s")


# ---------------------------------------------------------------------- one recovery


async def recovery_after(store: Store, key: str, start: int, after_id: int, timeout_s: float) -> pb.Recovery:
    """The first recovery record with a recovery id above ``after_id`` that is DONE or FAILED."""
    async with asyncio.timeout(timeout_s):
        async for item in store.watch_key(key, start):
            kv = await store.get(key) if isinstance(item, Resync) else item
            if kv is None or not kv.value:
                continue
            rec = decode(pb.Recovery, kv.value, key)
            if rec.recovery_id > after_id and rec.phase in (pb.PHASE_DONE, pb.PHASE_FAILED):
                return rec
    raise AssertionError("unreachable")


async def measure(
    store: Store,
    plane: Plane,
    fleet: Fleet,
    run: RunRef,
    scenario: str,
    act: Any,
    node_key: str | None = None,
) -> dict[str, Any]:
    """Carry out ``act`` (a fault) and measure the recovery it causes, from the records it leaves."""
    keys = Keyspace(plane.prefix)
    current = await store.get(keys.recovery(run))
    after_id = decode(pb.Recovery, current.value, current.key).recovery_id if current else 0
    start = await store.revision() + 1
    before, cpu_before, hosts_before = etcd_counters(plane.endpoint), plane.cpu(), fleet.cpu()
    waiter = asyncio.create_task(recovery_after(store, keys.recovery(run), start, after_id, 120))
    expiry = asyncio.create_task(first_delete(store, node_key, start)) if node_key else None
    acted = await asyncio.to_thread(act)
    rec = await waiter
    await asyncio.sleep(0.5)
    after, cpu_after, hosts_after = etcd_counters(plane.endpoint), plane.cpu(), fleet.cpu()
    row: dict[str, Any] = {"scenario": scenario, "ok": rec.phase == pb.PHASE_DONE, "strategy": rec.strategy}
    row["commanded"] = len(rec.command_nodes)
    fault_at = min(ts_to_s(f.detected_at) for f in rec.faults)
    row["fault_ranks"] = len({f.rank for f in rec.faults})
    decisions = await store.get_prefix(keys.run_prefix(run) + "decisions/")
    decided = [decode(pb.Decision, kv.value, kv.key) for kv in decisions.kvs]
    decided = [d for d in decided if d.epoch <= rec.epoch and ts_to_s(d.decided_at) >= fault_at - 1]
    if decided:
        row["decision_s"] = ts_to_s(max(decided, key=lambda d: d.epoch).decided_at) - fault_at
    acks = await store.get_prefix(keys.run_prefix(run) + "acks/")
    acked = [decode(pb.CommandAck, kv.value, kv.key) for kv in acks.kvs]
    acked = [a for a in acked if a.epoch == rec.epoch]
    if acked:
        row["acked_s"] = max(ts_to_s(a.done_at) for a in acked) - fault_at
    tables = await store.get_prefix(keys.run_prefix(run) + "ranks/")
    starts = [
        ts_to_s(r.started_at)
        for kv in tables.kvs
        for r in decode(pb.NodeRanks, kv.value, kv.key).ranks
        if r.state == pb.RANK_RUNNING and ts_to_s(r.started_at) >= fault_at
    ]
    if starts:
        row["running_s"] = max(starts) - fault_at
    row["restarted_ranks"] = len(starts)
    done = [ts_to_s(e.at) for e in rec.phase_log if e.phase == pb.PHASE_DONE]
    if done:
        row["done_s"] = done[-1] - fault_at
    row["phases"] = [
        [pb.Phase.Name(e.phase).removeprefix("PHASE_"), round(ts_to_s(e.at) - fault_at, 4)] for e in rec.phase_log
    ]
    if expiry is not None:
        expired_at = await expiry
        row["expired_after_loss_s"] = expired_at - acted["at"]
        if "decision_s" in row:
            row["expired_to_decision_s"] = fault_at + row["decision_s"] - expired_at
    row["etcd"] = counter_delta(after, before)
    row["cpu_s"] = {name: cpu_after[name] - cpu_before[name] for name in cpu_after}
    row["cpu_s"]["sim_hosts"] = hosts_after - hosts_before
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"trials": len(rows), "failed": sum(1 for r in rows if not r["ok"])}
    for name in ("decision_s", "acked_s", "running_s", "done_s", "expired_to_decision_s", "expired_after_loss_s"):
        values = [r[name] for r in rows if name in r]
        if values:
            out[name] = {"p50": statistics.median(values), "p99": pct(values, 99), "max": max(values)}
    for name in ("writes", "req_Range", "keys_put", "watch_events", "bytes_out", "bytes_in"):
        out[f"etcd_{name}"] = statistics.median(r["etcd"][name] for r in rows)
    out["commanded"] = statistics.median(r["commanded"] for r in rows)
    for name in ("coordinator", "strategy", "sim_hosts"):
        out[f"cpu_{name}_s"] = statistics.median(r["cpu_s"][name] for r in rows)
    return out


# ---------------------------------------------------------------------- one size


async def run_size(args: argparse.Namespace, nodes: int, nproc: int) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"scale-{nodes}x{nproc}-"))
    plane = Plane(workdir, args.etcd, args.fast_etcd)
    plane.start()
    job = f"scale{nodes}x{nproc}"
    fleet = Fleet(plane, job, nodes, nproc, spares=args.trials, per_host=args.per_host, lease_ttl=args.lease_ttl)
    rows: list[dict[str, Any]] = []
    rng = random.Random(nodes * 1000 + nproc)
    started = time.monotonic()
    try:
        async with Store(plane.endpoint, op_timeout_s=30) as store:
            run = await fleet.start(store)
            startup_s = time.monotonic() - started
            print(f"{nodes}x{nproc}: {nodes * nproc} ranks running in {startup_s:.1f}s", flush=True)
            await set_policy(store, Keyspace(plane.prefix), job, parse_policy(f"strategies: [{STRATEGIES}]\n{BUDGETS}"))
            await asyncio.sleep(2.0)
            lost: set[int] = set()
            for trial in range(args.trials):
                rank = rng.randrange(nodes * nproc)
                rows.append(await measure(store, plane, fleet, run, "rank", lambda r=rank: fleet.crash(r)))
                show(nodes, nproc, trial, rows[-1])
            if "node" in args.scenarios:
                for trial in range(args.trials):
                    index = rng.choice([i for i in range(nodes) if i not in lost])
                    lost.add(index)
                    node = node_name(index)
                    row = await measure(
                        store,
                        plane,
                        fleet,
                        run,
                        "node",
                        lambda n=node: fleet.lose(n),
                        Keyspace(plane.prefix).node(run, node),
                    )
                    rows.append(row)
                    show(nodes, nproc, trial, row)
            if "exit" in args.scenarios:
                await set_policy(store, Keyspace(plane.prefix), job, parse_policy(f"strategies: [exit]\n{BUDGETS}"))
                await asyncio.sleep(1.0)
                for trial in range(args.trials):
                    index = rng.choice([i for i in range(nodes) if i not in lost])
                    rank = index * nproc + rng.randrange(nproc)
                    rows.append(await measure(store, plane, fleet, run, "exit", lambda r=rank: fleet.crash(r)))
                    show(nodes, nproc, trial, rows[-1])
    finally:
        fleet.close()
        plane.close()
    return {
        "nodes": nodes,
        "nproc": nproc,
        "startup_s": startup_s,
        "trials": rows,
        "summary": {s: summarize([r for r in rows if r["scenario"] == s]) for s in {r["scenario"] for r in rows}},
    }


async def run_concurrent(args: argparse.Namespace, jobs: int, nodes: int, nproc: int) -> dict[str, Any]:
    """``jobs`` jobs sharing one etcd, coordinator and selector; one rank of each killed at once."""
    workdir = Path(tempfile.mkdtemp(prefix=f"scale-{jobs}jobs-"))
    plane = Plane(workdir, args.etcd, args.fast_etcd)
    plane.start()
    keys = Keyspace(plane.prefix)
    fleets = [
        Fleet(plane, f"job{j:02d}", nodes, nproc, spares=0, per_host=nodes, lease_ttl=args.lease_ttl)
        for j in range(jobs)
    ]
    done: list[float] = []
    failed = 0
    rng = random.Random(jobs)
    try:
        async with Store(plane.endpoint, op_timeout_s=30) as store:
            runs = [await fleet.start(store) for fleet in fleets]
            print(f"{jobs} jobs of {nodes}x{nproc}: running", flush=True)
            await asyncio.sleep(2.0)
            for round_ in range(args.trials):
                waits = []
                start = await store.revision() + 1
                for run in runs:
                    current = await store.get(keys.recovery(run))
                    after = decode(pb.Recovery, current.value, current.key).recovery_id if current else 0
                    waits.append(asyncio.create_task(recovery_after(store, keys.recovery(run), start, after, 120)))
                ranks = [rng.randrange(nodes * nproc) for _ in fleets]
                await asyncio.gather(*(asyncio.to_thread(f.crash, r) for f, r in zip(fleets, ranks, strict=True)))
                for rec in await asyncio.gather(*waits):
                    fault_at = min(ts_to_s(f.detected_at) for f in rec.faults)
                    ends = [ts_to_s(e.at) for e in rec.phase_log if e.phase == pb.PHASE_DONE]
                    if rec.phase == pb.PHASE_DONE and ends:
                        done.append(ends[-1] - fault_at)
                    else:
                        failed += 1
                print(
                    f"{jobs} jobs, round {round_ + 1}: fault -> DONE p50 {statistics.median(done[-jobs:]):.3f}s"
                    f" max {max(done[-jobs:]):.3f}s",
                    flush=True,
                )
    finally:
        for fleet in fleets:
            fleet.close()
        plane.close()
    return {
        "jobs": jobs,
        "nodes": nodes,
        "nproc": nproc,
        "rounds": args.trials,
        "failed": failed,
        "done_s": {"p50": statistics.median(done), "p99": pct(done, 99), "max": max(done)},
    }


def _spawn_logged(argv: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log_file:
        return subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT)


async def run_real(args: argparse.Namespace, nodes: int, nproc: int) -> dict[str, Any]:
    """The rank scenario with real ``recoverd agent`` processes (``sleep`` ranks): the simulation's check."""
    workdir = Path(tempfile.mkdtemp(prefix=f"scale-real-{nodes}x{nproc}-"))
    plane = Plane(workdir, args.etcd, args.fast_etcd)
    plane.start()
    keys = Keyspace(plane.prefix)
    job = f"real{nodes}x{nproc}"
    agents: list[subprocess.Popen[bytes]] = []
    done: list[float] = []
    rng = random.Random(nodes)
    try:
        for index in range(nodes):
            argv = [
                sys.executable, "-m", "recoverd.cli.main", "agent", "--etcd", plane.endpoint, "--prefix", plane.prefix,
                "--job", job, "--node", node_name(index), "--nproc-per-node", str(nproc), "--nnodes", str(nodes),
                "--node-rank", str(index), "--strategies", STRATEGIES, "--master-addr", "127.0.0.1",
                "--log-dir", str(workdir / f"ranks-{index}"), "--agent-lease-ttl", str(args.lease_ttl),
                "--", "sleep", "86400",
            ]  # fmt: skip
            agents.append(_spawn_logged(argv, workdir / f"agent{index}.log"))
            if index == 0:
                await asyncio.sleep(1.0)  # the first agent creates the job
        async with Store(plane.endpoint, op_timeout_s=30) as store:
            run = await wait_running(store, keys, job, nodes * nproc, nodes)
            print(f"real {nodes}x{nproc}: running", flush=True)
            await asyncio.sleep(2.0)
            for trial in range(args.trials):
                tables = await store.get_prefix(keys.run_prefix(run) + "ranks/")
                pids = {
                    r.rank: r.pid
                    for kv in tables.kvs
                    for r in decode(pb.NodeRanks, kv.value, kv.key).ranks
                    if r.state == pb.RANK_RUNNING
                }
                rank = rng.randrange(nodes * nproc)
                current = await store.get(keys.recovery(run))
                after = decode(pb.Recovery, current.value, current.key).recovery_id if current else 0
                waiter = asyncio.create_task(
                    recovery_after(store, keys.recovery(run), await store.revision() + 1, after, 120)
                )
                os.kill(pids[rank], signal.SIGKILL)
                rec = await waiter
                fault_at = min(ts_to_s(f.detected_at) for f in rec.faults)
                ends = [ts_to_s(e.at) for e in rec.phase_log if e.phase == pb.PHASE_DONE]
                done.append(ends[-1] - fault_at)
                print(
                    f"real {nodes}x{nproc} rank #{trial + 1}: {rec.strategy} fault -> DONE {done[-1]:.3f}s", flush=True
                )
                await asyncio.sleep(0.5)
    finally:
        for agent in agents:
            agent.send_signal(signal.SIGTERM)
        for agent in agents:
            try:
                agent.wait(timeout=30)
            except subprocess.TimeoutExpired:
                agent.kill()
        plane.close()
    return {"nodes": nodes, "nproc": nproc, "done_s": {"p50": statistics.median(done), "p99": pct(done, 99)}}


def show(nodes: int, nproc: int, trial: int, row: dict[str, Any]) -> None:
    def f(name: str) -> str:
        return f"{row[name]:6.3f}" if name in row else "     -"

    print(
        f"{nodes:>5}x{nproc} {row['scenario']:<5} #{trial + 1} {'ok ' if row['ok'] else 'BAD'} {row['strategy']:<17}"
        f" decision {f('decision_s')} acked {f('acked_s')} running {f('running_s')} done {f('done_s')}"
        f" writes {row['etcd']['writes']:5.0f} ranges {row['etcd']['req_Range']:6.0f}"
        f" watch-events {row['etcd']['watch_events']:6.0f} coord-cpu {row['cpu_s']['coordinator']:.2f}s",
        flush=True,
    )


SCENARIOS = (("rank", "one rank killed: recover-in-place"), ("node", "a node lost: recover to a spare"),
             ("exit", "one rank killed, policy exit: every rank restarts"))  # fmt: skip


def table(results: dict[str, Any]) -> str:
    """The results as a Markdown table (bench/results/scale.md)."""
    lines = [
        "| nodes x ranks | scenario | trials (failed) | decision p50 / p99 | acked p50 / p99 | running p50 / p99"
        " | DONE p50 / p99 | expiry → decision p50 | etcd writes | etcd range reads | watch events"
        " | etcd bytes out | coordinator CPU | selector CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def both(summary: dict[str, Any], name: str) -> str:
        if name not in summary:
            return "—"
        return f"{summary[name]['p50']:.2f} / {summary[name]['p99']:.2f} s"

    for size in sorted(results["sizes"].values(), key=lambda r: (r["nodes"] * r["nproc"], r["nodes"])):
        for scenario, _ in SCENARIOS:
            summary = size["summary"].get(scenario)
            if summary is None:
                continue
            expiry = summary.get("expired_to_decision_s")
            expiry_text = f"{expiry['p50']:.2f} s" if expiry else "—"
            lines.append(
                f"| {size['nodes']} x {size['nproc']} | {scenario} | {summary['trials']} ({summary['failed']})"
                f" | {both(summary, 'decision_s')} | {both(summary, 'acked_s')} | {both(summary, 'running_s')}"
                f" | {both(summary, 'done_s')} | {expiry_text}"
                f" | {summary['etcd_writes']:.0f} | {summary['etcd_req_Range']:.0f}"
                f" | {summary['etcd_watch_events']:.0f}"
                f" | {summary['etcd_bytes_out'] / 1e6:.1f} MB | {summary['cpu_coordinator_s']:.2f} s"
                f" | {summary['cpu_strategy_s']:.2f} s |"
            )
    for name, extra in sorted(results.get("concurrent", {}).items()):
        lines.append("")
        lines.append(
            f"{name}: {extra['jobs']} jobs of {extra['nodes']} x {extra['nproc']} on one etcd and one coordinator,"
            f" one rank of every job killed at once, {extra['rounds']} rounds: fault → DONE per job p50"
            f" {extra['done_s']['p50']:.2f} s, p99 {extra['done_s']['p99']:.2f} s, max {extra['done_s']['max']:.2f} s;"
            f" {extra['failed']} not recovered."
        )
    for name, extra in sorted(results.get("real", {}).items()):
        lines.append("")
        lines.append(
            f"{name}: real `recoverd agent` processes ({extra['nodes']} x {extra['nproc']} `sleep` ranks),"
            f" recover-in-place fault → DONE p50 {extra['done_s']['p50']:.2f} s (p99 {extra['done_s']['p99']:.2f} s)"
            f" against {extra['simulated_p50_s']:.2f} s simulated: ratio {extra['ratio']:.2f}."
        )
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    """Each figure against the node count (bench/results/scale.png); skipped without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench: matplotlib not installed (requirements-bench.txt); no plot", file=sys.stderr)
        return
    sizes = sorted(results["sizes"].values(), key=lambda r: r["nodes"])
    figures = (
        ("done_s", "fault → DONE (s)"),
        ("acked_s", "fault → every node acked (s)"),
        ("decision_s", "fault → decision (s)"),
        ("etcd_writes", "etcd writes per recovery"),
        ("etcd_watch_events", "watch events per recovery"),
        ("cpu_coordinator_s", "coordinator CPU (s)"),
    )
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (name, label) in zip(axes.flat, figures, strict=True):
        for scenario, title in SCENARIOS:
            xs, ys, lows, highs = [], [], [], []
            for size in sizes:
                summary = size["summary"].get(scenario)
                if summary is None or name not in summary:
                    continue
                value = summary[name]
                xs.append(size["nodes"])
                if isinstance(value, dict):
                    ys.append(value["p50"])
                    highs.append(value["p99"] - value["p50"])
                else:
                    ys.append(value)
                    highs.append(0.0)
                lows.append(0.0)
            if xs:
                ax.errorbar(xs, ys, yerr=[lows, highs], marker="o", capsize=3, label=title)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("nodes (p50, bar to p99)")
        ax.set_title(label)
        ax.grid(True, alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("recoverd at scale: simulated nodes (real agent code) against one real etcd, 2 cores")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        nodes, _, nproc = part.strip().partition("x")
        out.append((int(nodes), int(nproc or 8)))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--sizes", default="64x8,128x8,256x8,512x8,1024x4", help="nodes x ranks per node, comma-separated"
    )
    parser.add_argument("--trials", type=int, default=5, help="trials per scenario (default %(default)s)")
    parser.add_argument("--scenarios", default="rank,node,exit", help="which scenarios (rank always runs)")
    parser.add_argument(
        "--per-host", type=int, default=128, help="simulated nodes per OS process (default %(default)s)"
    )
    parser.add_argument(
        "--lease-ttl",
        type=float,
        default=5.0,
        help="the simulated agents' lease TTL, s (default %(default)s: docs/scale.md says why not 2)",
    )
    parser.add_argument("--etcd", default=None, help="use this etcd instead of a fresh embedded one per size")
    parser.add_argument("--fast-etcd", action="store_true", help="embedded etcd without fsync (tests' settings)")
    parser.add_argument("--out", default=str(RESULTS / "scale.json"), help="results file (merged by size)")
    parser.add_argument("--concurrent", type=int, default=20, help="jobs of 32x8 sharing the control plane (0: none)")
    parser.add_argument("--real", type=int, default=64, help="nodes of real agents to check the simulation (0: none)")
    args = parser.parse_args()
    # A SIGTERM ends the run like Ctrl-C: every process it started is stopped (the finally blocks).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.scenarios = set(args.scenarios.split(","))
    results: dict[str, Any] = {}
    out = Path(args.out)
    if out.exists():
        results = json.loads(out.read_text())
    results.setdefault("sizes", {})
    results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    for nodes, nproc in parse_sizes(args.sizes) if args.sizes else ():
        result = asyncio.run(run_size(args, nodes, nproc))
        results["sizes"][f"{nodes}x{nproc}"] = result
        save(results, out)
    if args.concurrent:
        extra = asyncio.run(run_concurrent(args, args.concurrent, 32, 8))
        results.setdefault("concurrent", {})[f"{args.concurrent} jobs"] = extra
        save(results, out)
    if args.real:
        extra = asyncio.run(run_real(args, args.real, 8))
        simulated = results["sizes"].get(f"{args.real}x8", {}).get("summary", {}).get("rank", {}).get("done_s")
        extra["simulated_p50_s"] = simulated["p50"] if simulated else math.nan
        extra["ratio"] = extra["done_s"]["p50"] / extra["simulated_p50_s"] if simulated else math.nan
        results.setdefault("real", {})[f"{args.real} real agents"] = extra
        save(results, out)
    return 0


def save(results: dict[str, Any], out: Path) -> None:
    """The JSON, the table next to it (.md) and the plot (.png)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    out.with_suffix(".md").write_text(table(results))
    plot(results, out.with_suffix(".png"))


if __name__ == "__main__":
    sys.exit(main())
