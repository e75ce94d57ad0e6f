"""`make bench`: recoverd's recovery times, and recoverd against torchrun on the same DDP job.

Everything runs on this machine, one system at a time, alternating systems trial by trial so that
drifts in machine load hit every system alike. Figures are medians (and p99 where asked) of several
trials; results go to ``bench/results/results.json``, ``results.md`` and ``results.png``.

* **P1 detection**: SIGKILL of a sleeping rank (examples/worker.py) -> its fault record arrives in
  etcd (a watch on the run's ``faults/`` prefix, timestamped on arrival).
* **P2 control-plane MTTR**: recover-in-place of one of 8 plain ranks, SIGKILL -> recovery DONE,
  split into phases from the recovery record: detect (kill -> the agent saw the exit), collect (the
  fault window), stop, decide (GLOBAL_FAULT + DECIDING), restart (RECOVERING -> the command's ack:
  the new process is started), confirm (ack -> DONE).
* **P3**: 4 ranks, gloo on CPU, rank 1 SIGKILLed at a random moment mid-run: time from the kill to
  the next completed training step (the first step completed after the kill by a new process, or by
  a survivor after its group was re-formed), with ``recoverd run``'s defaults (fault window,
  warm starts) but for the strategies:

  - (a) torchrun ``--max-restarts 3`` (c10d rendezvous) and (b) recoverd ``exit`` (every rank
    restarts; forked from the warm-start server), both running examples/plain_ddp.py, a DDP script
    with no recoverd code that resumes from its own checkpoint every 10 steps; (b') the same with
    ``--no-warm-start``;
  - (c) recoverd ``recover-in-place`` on examples/ddp_train.py (``ResilientTrainer``; the
    replacement forked from the warm-start server), (c') the same with ``--no-warm-start``, (d) with
    a warm spare instead (``--warm-spares 1``, the script waits in ``wait_for_rank()``).
* **Goodput**: a SIGKILL of a random rank every 15 s for ``--goodput-s`` seconds: the highest step
  reached, as a fraction of a fault-free run of the same length, recoverd (c) against torchrun
  (``--max-restarts 20``); budgets are lifted for recoverd.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from recoverd.jobview import read_job
from recoverd.keys import Keyspace
from recoverd.records import pb, ts_to_s
from recoverd.store import Resync, Store

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PY = sys.executable
DDP = str(ROOT / "examples" / "ddp_train.py")
PLAIN = str(ROOT / "examples" / "plain_ddp.py")
WORKER = str(ROOT / "examples" / "worker.py")
TORCHRUN = str(Path(PY).with_name("torchrun"))
STEP_RE = re.compile(r"rank (\d+) step (\d+) done (\S+) pid (\d+)")
LIFTED = ("--max-rank-restarts", "1000", "--max-job-restarts", "1000")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def wait(what: str, predicate: Callable[[], Any], timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise SystemExit(f"bench: timed out waiting for {what}")


# ---------------------------------------------------------------------------- running a job


@dataclass
class Job:
    proc: subprocess.Popen[bytes]
    out: Path
    logs: Path
    endpoint: str = ""

    def text(self) -> str:
        parts = [self.out.read_text(errors="replace")] if self.out.exists() else []
        parts += [p.read_text(errors="replace") for p in self.rank_logs()]
        return "\n".join(parts)

    def rank_logs(self) -> list[Path]:
        """recoverd: logs/rank<R>.log; torchrun (--redirects 3): <run>/attempt_<n>/<R>/stdout.log."""
        return sorted([*self.logs.glob("rank*.log"), *self.logs.glob("**/stdout.log")])

    def victim_log(self, rank: int) -> Path:
        if self.endpoint:
            return self.logs / f"rank{rank}.log"
        attempts = sorted(self.logs.glob(f"**/attempt_*/{rank}/stdout.log"))
        return attempts[-1] if attempts else self.logs / "missing"

    def steps(self) -> list[tuple[int, int, float, int]]:
        """(rank, step, time, pid) of every completed step, in time order."""
        found = [(int(r), int(s), float(t), int(p)) for r, s, t, p in STEP_RE.findall(self.text())]
        return sorted(found, key=lambda x: x[2])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextmanager
def recoverd_job(
    workdir: Path,
    name: str,
    nproc: int,
    strategies: str,
    command: list[str],
    extra: tuple[str, ...] = (),
    fast: tuple[str, ...] = ("--fault-window", "0.05"),
) -> Iterator[Job]:
    """``recoverd run`` of ``command``; ``fast``: P1/P2's short fault window (P3 uses the defaults)."""
    logs = workdir / name / "logs"
    out = workdir / name / "out.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [PY, "-m", "recoverd.cli.main", "run", "--job", name, "--nproc-per-node", str(nproc),
            "--strategies", strategies, "--log-dir", str(logs), *fast, *LIFTED, *extra,
            "--", *command]  # fmt: skip
    with open(out, "w") as handle:
        proc = subprocess.Popen(
            argv, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, "GRPC_VERBOSITY": "ERROR"}
        )
    job = Job(proc, out, logs)
    try:
        line = wait(
            "the embedded etcd",
            lambda: next((w for w in out.read_text().splitlines() if w.startswith("recoverd run:")), None),
        )
        job.endpoint = line.split("etcd ", 1)[1].split(",")[0]
        yield job
    finally:
        job.stop()


@contextmanager
def torchrun_job(workdir: Path, name: str, nproc: int, command: list[str], max_restarts: int) -> Iterator[Job]:
    out = workdir / name / "out.txt"
    logs = workdir / name / "logs"
    out.parent.mkdir(parents=True, exist_ok=True)
    with socket_port() as port:
        argv = [TORCHRUN, "--nnodes", "1", "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--log-dir", str(logs), "--redirects", "3", *command]  # fmt: skip
    with open(out, "w") as handle:
        proc = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    job = Job(proc, out, logs)
    try:
        yield job
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@contextmanager
def socket_port() -> Iterator[int]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    yield port


def rank_pid(job: Job, rank: int) -> int:
    """The pid of ``rank`` now: from etcd for recoverd (a warm spare's environment does not show its
    rank), from the process table for torchrun's workers."""
    if job.endpoint:

        def running() -> int | None:
            view = ctl_view(job.endpoint, job.logs.parent.name)
            for table in view.ranks.values():
                for status in table.ranks:
                    if status.rank == rank and status.state == pb.RANK_RUNNING:
                        return int(status.pid)
            return None

        return int(wait(f"rank {rank} running", running, 30))

    def worker() -> int | None:
        # torchrun may be between attempts (its workers restarting): looked for until it is back.
        for child in psutil.Process(job.proc.pid).children(recursive=True):
            try:
                env = child.environ()
                if env.get("RANK") != str(rank) or "RECOVERD_WARM_SPARE_FD" in env:
                    continue
                if child.name().startswith("python") and any(
                    part.endswith(("ddp_train.py", "plain_ddp.py", "fsdp_train.py", "worker.py"))
                    for part in child.cmdline()
                ):
                    return int(child.pid)
            except psutil.Error:
                continue
        return None

    return int(wait(f"torchrun's rank {rank}", worker, 60))


def ctl_view(endpoint: str, job: str) -> Any:
    async def go() -> Any:
        async with Store(endpoint) as store:
            return await read_job(store, Keyspace(), job)

    return asyncio.run(go())


# ---------------------------------------------------------------------------- P1, P2


def p1_detection(workdir: Path, trials: int) -> dict[str, Any]:
    """SIGKILL of a sleeping rank -> the fault key's arrival through an etcd watch."""
    samples: list[float] = []
    with recoverd_job(
        workdir, "p1", 4, "recover-in-place,exit", [PY, WORKER, "--steps", "100000", "--step-time", "0.5"]
    ) as job:
        wait(
            "4 ranks",
            lambda: (
                (v := ctl_view(job.endpoint, "p1")).ranks
                and len([r for t in v.ranks.values() for r in t.ranks if r.state == pb.RANK_RUNNING]) == 4
            ),
        )
        run = ctl_view(job.endpoint, "p1").run
        keys = Keyspace()
        arrivals: list[float] = []
        arrived = asyncio.Event()

        async def watch(ready: asyncio.Event, stop: asyncio.Event) -> None:
            async with Store(job.endpoint) as store:
                start = await store.revision()
                ready.set()
                async for item in store.watch_prefix(keys.faults_prefix(run), start + 1):
                    if not isinstance(item, Resync) and not item.is_delete:
                        arrivals.append(time.time())
                        arrived.set()
                    if stop.is_set():
                        return

        async def drive() -> None:
            ready, stop = asyncio.Event(), asyncio.Event()
            watcher = asyncio.create_task(watch(ready, stop))
            await ready.wait()
            for _ in range(trials):
                await asyncio.sleep(0.8 + random.random() * 0.4)
                rank = random.randrange(4)
                pid = await asyncio.to_thread(rank_pid, job, rank)
                seen = len(arrivals)
                arrived.clear()
                killed = time.time()
                os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(10):
                        await arrived.wait()
                if len(arrivals) > seen:
                    samples.append(arrivals[seen] - killed)
                await asyncio.sleep(0.5)  # let the recovery finish before the next kill
            stop.set()
            watcher.cancel()

        asyncio.run(drive())
    ms = [1000 * s for s in samples]
    return {"trials": len(ms), "p50_ms": statistics.median(ms), "p99_ms": pct(ms, 99), "samples_ms": ms}


def p2_mttr(workdir: Path, trials: int) -> dict[str, Any]:
    """recover-in-place of one of 8 plain ranks: kill -> DONE, by phase."""
    phases: dict[str, list[float]] = {
        k: [] for k in ("detect", "collect", "stop", "decide", "restart", "confirm", "total")
    }
    with recoverd_job(
        workdir, "p2", 8, "recover-in-place,exit", [PY, WORKER, "--steps", "100000", "--step-time", "0.5"]
    ) as job:
        wait(
            "8 ranks",
            lambda: (
                len(
                    [
                        r
                        for t in ctl_view(job.endpoint, "p2").ranks.values()
                        for r in t.ranks
                        if r.state == pb.RANK_RUNNING
                    ]
                )
                == 8
            ),
        )
        for trial in range(trials):
            time.sleep(0.5 + random.random() * 0.3)
            rank = random.randrange(8)
            pid = rank_pid(job, rank)
            expected = trial + 1
            killed = time.time()
            os.kill(pid, signal.SIGKILL)
            view = wait(
                "the recovery",
                lambda expected=expected: (
                    (v := ctl_view(job.endpoint, "p2")).recovery is not None
                    and v.recovery.recovery_id == expected
                    and v.recovery.phase == pb.PHASE_DONE
                    and v
                ),
                30,
            )
            rec = view.recovery
            entered = {pb.Phase.Name(e.phase).removeprefix("PHASE_"): ts_to_s(e.at) for e in rec.phase_log}
            ack = view.acks.get(next(iter(view.acks)))
            acked = ts_to_s(ack.done_at) if ack is not None else entered["DONE"]
            detected = min(ts_to_s(f.detected_at) for f in rec.faults)
            phases["detect"].append(detected - killed)
            phases["collect"].append(entered["STOPPING"] - entered["COLLECTING"])
            phases["stop"].append(entered["GLOBAL_FAULT"] - entered["STOPPING"])
            phases["decide"].append(entered["RECOVERING"] - entered["GLOBAL_FAULT"])
            phases["restart"].append(acked - entered["RECOVERING"])
            phases["confirm"].append(entered["DONE"] - acked)
            phases["total"].append(entered["DONE"] - killed)
    return {k: {"p50_ms": 1000 * statistics.median(v), "p99_ms": 1000 * pct(v, 99)} for k, v in phases.items()} | {
        "trials": trials
    }


# ---------------------------------------------------------------------------- P3 and goodput


def ddp_command(steps: int, ckpt: Path, launcher: str) -> list[str]:
    return [PY, DDP, "--launcher", launcher, "--steps", str(steps), "--ckpt-dir", str(ckpt), "--ckpt-every", "10"]


def plain_command(steps: int, ckpt: Path) -> list[str]:
    return [PY, PLAIN, "--steps", str(steps), "--ckpt-dir", str(ckpt), "--ckpt-every", "10"]


#: P3's systems: label, and whether the replacement comes from the warm-start server.
SYSTEMS = {
    "torchrun": ("(a) torchrun --max-restarts 3, plain DDP script", False),
    "recoverd-exit": ("(b) recoverd exit, the same plain script (warm start)", True),
    "recoverd-exit-cold": ("(b') recoverd exit, --no-warm-start", False),
    "recoverd-in-place": ("(c) recoverd recover-in-place, ResilientTrainer (warm start)", True),
    "recoverd-in-place-cold": ("(c') recoverd recover-in-place, --no-warm-start", False),
    "recoverd-warm-spare": ("(d) recoverd recover-in-place, --warm-spares 1", False),
}


def start_system(workdir: Path, system: str, name: str, steps: int, max_restarts: int = 3):  # type: ignore[no-untyped-def]
    ckpt = workdir / name / "ckpt"
    if system == "torchrun":
        command = plain_command(steps, ckpt)[1:]  # torchrun runs the script with its own python
        return torchrun_job(workdir, name, 4, command, max_restarts)
    if system.startswith("recoverd-exit"):
        strategies, command = "exit", plain_command(steps, ckpt)
    else:
        strategies, command = "recover-in-place,exit", ddp_command(steps, ckpt, "recoverd")
    extra: tuple[str, ...] = ()
    if system.endswith("-cold"):
        extra = ("--no-warm-start",)
    elif system == "recoverd-warm-spare":
        extra = ("--warm-spares", "1", "--no-warm-start")
    return recoverd_job(workdir, name, 4, strategies, command, extra, fast=())


FORMED_RE = re.compile(r"generation (\d+) formed .*\(at (\S+)\)")


def time_to_next_step(job: Job, killed: float, victim_pid: int) -> float | None:
    """Seconds from the kill to the first step completed on the recovery's far side: by a new
    process (a restart), or by a survivor after its group was re-formed. (A step whose all-reduce the
    victim finished just before dying can complete right after the kill without any recovery.)"""
    text = job.text()
    steps = job.steps()
    old_pids = {pid for _r, _s, at, pid in steps if at <= killed}
    reformed = min(
        (float(at) for gen, at in FORMED_RE.findall(text) if int(gen) > 0 and float(at) > killed), default=None
    )
    for _rank, _step, at, pid in steps:
        if at <= killed or pid == victim_pid:
            continue
        if pid not in old_pids or (reformed is not None and at >= reformed):
            return at - killed
    return None


def kill_after_step(job: Job, rank: int, step: int, jitter_s: float) -> tuple[int, float]:
    """SIGKILL ``rank`` within ``jitter_s`` after it printed ``step`` done: it is then computing the
    next step and has not joined its all-reduce, so no rank can complete that step without a
    recovery. Returns (pid, kill time)."""
    marker = f"rank {rank} step {step} done"
    path = wait(f"rank {rank}'s log", lambda: job.victim_log(rank).exists() and job.victim_log(rank), 180)
    pid = rank_pid(job, rank)  # before the marker: looking it up takes longer than a step
    deadline = time.monotonic() + 180
    while marker not in path.read_text(errors="replace"):  # a tight poll: the kill lands early in the step
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: rank {rank} never reached step {step}")
        time.sleep(0.001)
    time.sleep(random.random() * jitter_s)
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    return pid, killed


def p3_trial(workdir: Path, system: str, trial: int, steps: int) -> float:
    name = f"p3-{system}-{trial}"
    with start_system(workdir, system, name, steps) as job:
        if system == "recoverd-warm-spare":
            ready = job.logs / "warm-spares.log"
            wait("a warm spare ready", lambda: ready.exists() and " ready" in ready.read_text(), 120)
        if SYSTEMS[system][1]:
            wait("the warm-start server", lambda: " ready in " in job.out.read_text(), 120)
        pid, killed = kill_after_step(job, 1, random.randrange(30, 60), 0.004)
        took = wait(f"{name}: the next step", lambda: time_to_next_step(job, killed, pid), 120)
        return float(took)


def goodput_run(workdir: Path, system: str, seconds: float, faults: bool) -> int:
    name = f"goodput-{system}-{'faults' if faults else 'clean'}"
    with start_system(workdir, system, name, 10**7, max_restarts=20) as job:
        wait(f"{name}: first step", lambda: job.steps(), 180)
        start = time.monotonic()
        next_kill = start + 15.0
        while time.monotonic() - start < seconds:
            time.sleep(0.05)
            if faults and time.monotonic() >= next_kill:
                next_kill += 15.0
                try:
                    os.kill(rank_pid(job, random.randrange(4)), signal.SIGKILL)
                except (SystemExit, ProcessLookupError):
                    pass  # mid-restart: no such rank at this instant; the next kill comes in 15 s
        return max((s[1] for s in job.steps()), default=-1) + 1


# ---------------------------------------------------------------------------- report


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def table(results: dict[str, Any]) -> list[str]:
    """The Markdown table of results.md (and of the README)."""
    p1, p2, p3 = results.get("p1"), results.get("p2"), results["p3"]
    rows = ["| Measure | Result | Target | Met |", "|---|---|---|---|"]
    if p1 is not None and p2 is not None:
        rows += [
            f"| P1 detection, p50 / p99 ({p1['trials']} kills) | {p1['p50_ms']:.1f} / {p1['p99_ms']:.1f} ms"
            f" | ≤ 10 / ≤ 50 ms | {_yes(p1['p50_ms'] <= 10 and p1['p99_ms'] <= 50)} |",
            f"| P2 recover-in-place MTTR, 8 ranks, p50 / p99 ({p2['trials']} kills)"
            f" | {p2['total']['p50_ms']:.0f} / {p2['total']['p99_ms']:.0f} ms | p50 ≤ 300 ms"
            f" | {_yes(p2['total']['p50_ms'] <= 300)} |",
        ]
    for system, entry in p3.items():
        target, met = "", ""
        if system == "recoverd-exit":
            target, met = "≤ 0.3 x (a)", _yes(entry["ratio"] <= 0.3)
        elif system == "recoverd-in-place":
            target, met = "p50 ≤ 0.15 s", _yes(entry["median_s"] <= 0.15)
        rows.append(
            f"| P3 SIGKILL → next step, {entry['label']} (median of {entry['trials']})"
            f" | {entry['median_s']:.2f} s (x {entry['ratio']:.2f}) | {target} | {met} |"
        )
    if "goodput" in results:
        g = results["goodput"]
        rows.append(
            f"| Goodput, a SIGKILL every 15 s for {g['seconds']:.0f} s (vs. fault-free)"
            f" | recoverd {g['recoverd']:.0%}, torchrun {g['torchrun']:.0%} | recoverd > torchrun"
            f" | {_yes(g['recoverd'] > g['torchrun'])} |"
        )
    if p2 is None:
        return rows
    phases = ", ".join(f"{k} {v['p50_ms']:.0f}" for k, v in p2.items() if isinstance(v, dict) and k != "total")
    return [*rows, "", f"P2 phases, p50 in ms: {phases}."]


def plot(p3: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench: matplotlib not installed (requirements-bench.txt); no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for i, entry in enumerate(p3.values()):
        ax.scatter([i] * len(entry["samples_s"]), entry["samples_s"], alpha=0.6)
        ax.hlines(entry["median_s"], i - 0.25, i + 0.25)
    ax.set_xticks(range(len(p3)), [e["label"].replace(" recover", "\nrecover") for e in p3.values()], fontsize=7)
    ax.set_ylabel("SIGKILL → next step (s)")
    ax.set_title("DDP toy, 4 ranks, gloo on CPU: time from a rank's SIGKILL to the next completed step", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_results(results: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)  # RESULTS: --results-dir
    (RESULTS / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    header = [f"# recoverd bench ({results['when']}, {results['machine']})", "", f"Command: `{results['command']}`", ""]
    (RESULTS / "results.md").write_text("\n".join([*header, *table(results)]) + "\n")
    plot(results["p3"], RESULTS / "results.png")


def main(argv: list[str] | None = None) -> int:
    global RESULTS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10, help="P3 trials per system (alternated)")
    parser.add_argument("--detection-trials", type=int, default=30)
    parser.add_argument("--mttr-trials", type=int, default=20)
    parser.add_argument("--goodput-s", type=float, default=180.0, help="0 skips the goodput runs")
    parser.add_argument(
        "--systems",
        type=lambda text: text.split(","),
        default=list(SYSTEMS),
        help=f"P3's systems, comma-separated (default: all: {','.join(SYSTEMS)}; torchrun is the ratios' base)",
    )
    parser.add_argument("--skip-p1-p2", action="store_true", help="P3 (and goodput) only")
    parser.add_argument(
        "--results-dir", type=Path, default=RESULTS, help="where results.{json,md,png} go (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    RESULTS = args.results_dir
    workdir = Path(tempfile.mkdtemp(prefix="recoverd-bench-"))
    print(f"bench: work in {workdir}", flush=True)
    results: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "command": "make bench  # python bench/bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    unknown = sorted(set(args.systems) - set(SYSTEMS))
    if unknown or "torchrun" not in args.systems:
        parser.error(f"--systems: unknown {unknown}" if unknown else "--systems: torchrun is the base of the ratios")
    if not args.skip_p1_p2:
        results["p1"] = p1_detection(workdir, args.detection_trials)
        print(f"P1: {results['p1']['p50_ms']:.1f} ms p50", flush=True)
        results["p2"] = p2_mttr(workdir, args.mttr_trials)
        print(f"P2: {results['p2']['total']['p50_ms']:.0f} ms p50", flush=True)
    labels = {system: label for system, (label, _warm) in SYSTEMS.items() if system in args.systems}
    samples: dict[str, list[float]] = {s: [] for s in labels}
    for trial in range(args.trials):
        for system in labels:  # alternate the systems within every round
            took = p3_trial(workdir, system, trial, 10**6)
            samples[system].append(took)
            print(f"P3 {system} trial {trial}: {took:.3f} s", flush=True)
    base = statistics.median(samples["torchrun"])
    results["p3"] = {
        s: {
            "label": labels[s],
            "trials": len(v),
            "median_s": statistics.median(v),
            "ratio": statistics.median(v) / base,
            "samples_s": v,
        }
        for s, v in samples.items()
    }
    if args.goodput_s > 0:
        steps = {}
        for system in ("recoverd-in-place", "torchrun"):
            clean = goodput_run(workdir, system, args.goodput_s, faults=False)
            faulty = goodput_run(workdir, system, args.goodput_s, faults=True)
            steps[system] = {"clean": clean, "faults": faulty}
            print(f"goodput {system}: {faulty}/{clean}", flush=True)
        results["goodput"] = {
            "seconds": args.goodput_s,
            "recoverd": steps["recoverd-in-place"]["faults"] / steps["recoverd-in-place"]["clean"],
            "torchrun": steps["torchrun"]["faults"] / steps["torchrun"]["clean"],
            "steps": steps,
        }
    write_results(results)
    print((RESULTS / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
