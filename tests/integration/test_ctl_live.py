"""``recoverctl status --watch`` and ``events --follow`` as an operator runs them: subprocesses whose
stdout is read line by line, against a real etcd.

* A real recovery, start to end: a job whose rank 1 fails once (examples/worker.py) is watched and
  followed from before the fault until the job succeeds. The watch shows the recovery's phases in
  order and exits 0 after showing SUCCEEDED; the follow shows each new event; Ctrl-C ends a follow
  with 130.
* Writes made here (no services): each put shows up as one line, and Ctrl-C ends a watch with 130.
* In this process: the updates come from the watch; etcd is read once.

Latency (the time from a phase transition, an event or a put to its line on the subprocess's
stdout) is measured and printed (``pytest -s``, or the report's properties), not asserted: the
project measures speed in benchmarks, and timed assertions fail on a loaded machine. What is
asserted is order and arrival, with generous timeouts; and that nothing is read again (no polling).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from recoverd.cli.watchview import watch_status
from recoverd.jobview import JobView
from recoverd.keys import Keyspace, RunRef
from recoverd.records import encode, pb, ts_from_s, ts_to_s
from recoverd.store import Store

from .cluster import Cluster

pytestmark = pytest.mark.etcd

ARRIVAL_TIMEOUT_S = 30.0


class Lines:
    """A recoverctl subprocess whose stdout lines are collected with their arrival time (wall clock,
    as the records' timestamps), by a thread that does nothing but read."""

    def __init__(self, endpoint: str, prefix: str, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("RECOVERD_ETCD", "RECOVERD_PREFIX")}
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "recoverd.cli.ctl", "--etcd", endpoint, "--prefix", prefix, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            env={**env, "GRPC_VERBOSITY": "ERROR"},
        )
        self.lines: list[tuple[float, str]] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append((time.time(), line.rstrip("\n")))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, what: str, predicate: Callable[[str], bool], timeout: float = ARRIVAL_TIMEOUT_S) -> float:
        """The arrival time of the first line that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for at, line in self.lines:
                    if predicate(line):
                        return at
                left = deadline - time.monotonic()
                if left <= 0 or (not self._reader.is_alive() and self.proc.poll() is not None):
                    raise AssertionError(f"recoverctl {' '.join(self.args)}: no line with {what}: {self.lines[-5:]}")
                self._changed.wait(left)

    def interrupt(self) -> int:
        """Ctrl-C: SIGINT, then the exit status."""
        self.proc.send_signal(signal.SIGINT)
        return self.finish()

    def finish(self, timeout: float = ARRIVAL_TIMEOUT_S) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        assert self.proc.stderr is not None
        stderr = self.proc.stderr.read()
        assert "Traceback" not in stderr, stderr
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@contextmanager
def ctl_lines(endpoint: str, prefix: str, *commands: tuple[str, ...]) -> Iterator[list[Lines]]:
    procs = [Lines(endpoint, prefix, *command) for command in commands]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.close()


def _report(what: str, latencies_ms: list[float], record: Callable[[str, Any], None]) -> None:
    """Print (and record in the test report) what was measured; nothing is asserted on it."""
    record(what, [round(x, 1) for x in latencies_ms])
    print(
        f"\n{what}: median {statistics.median(latencies_ms):.1f} ms, max {max(latencies_ms):.1f} ms"
        f" over {len(latencies_ms)} updates ({', '.join(f'{x:.1f}' for x in latencies_ms)})"
    )


def _json_lines(proc: Lines, since: float) -> list[tuple[float, dict[str, Any]]]:
    return [(at, json.loads(line)) for at, line in proc.lines if at >= since]


def test_watch_and_follow_show_a_real_recovery_as_it_happens(
    cluster: Cluster, tmp_path: Path, record_property: Callable[[str, Any], None]
) -> None:
    job = "job-live"
    go = tmp_path / "go"
    cluster.coordinator()
    cluster.strategy()
    worker = (
        "--steps",
        "20",
        "--step-time",
        "0.05",
        "--fail-once-rank",
        "1",
        "--fail-at",
        "3",
        "--start-file",
        str(go),
    )
    cluster.agent(job, nproc=2, strategies="recover-in-place,exit", worker=worker)
    cluster.wait_running(job, 2)  # waiting for the start file: no step, no fault yet
    commands = [
        ("status", job, "--watch", "--json"),
        ("status", job, "--watch"),
        ("events", job, "--follow", "--json"),
        ("events", job, "--follow"),
    ]
    with ctl_lines(cluster.endpoint, cluster.prefix, *commands) as (watch, watch_text, follow, follow_text):
        for proc in (watch, follow):
            proc.wait_for("the first output", lambda line: True)
        watch_text.wait_for("the first table", lambda line: line.startswith("--- revision"))
        follow_text.wait_for("the stored events", lambda line: "job_created" in line)
        started = time.time()
        go.touch()

        # The watch ends by itself once the job has ended, after showing it.
        assert watch.finish() == 0
        assert watch_text.finish() == 0
        follow.wait_for("job_succeeded", lambda line: json.loads(line)["reason"] == "job_succeeded")
        follow_text.wait_for("job_succeeded", lambda line: " job_succeeded " in line)
        assert follow.interrupt() == 130
        assert follow_text.interrupt() == 130

    view = cluster.view(job)
    assert view.recovery is not None and view.status is not None and view.status.state == pb.JOB_SUCCEEDED

    # status --watch --json: one object per update, revisions rising, the recovery's phases in order.
    updates = _json_lines(watch, 0.0)
    revisions = [data["revision"] for _, data in updates]
    assert revisions == sorted(set(revisions))
    assert updates[-1][1]["state"] == "SUCCEEDED" and updates[0][1]["state"] == "RUNNING"
    seen: dict[str, float] = {}
    for at, data in updates:
        rec = data["recovery"]
        if rec is not None and rec["id"] == 1:
            seen.setdefault(rec["phase"], at)
    logged = [(pb.Phase.Name(e.phase).removeprefix("PHASE_"), ts_to_s(e.at)) for e in view.recovery.phase_log]
    order = [phase for phase, _ in logged]
    assert "DONE" in seen and list(seen) == [p for p in order if p in seen], (list(seen), order)
    latencies = [(seen[phase] - at) * 1000 for phase, at in logged if phase in seen]
    latencies.append((updates[-1][0] - ts_to_s(view.status.finished_at)) * 1000)
    _report("status --watch: phase transition (and the job's end) -> its line", latencies, record_property)

    # events --follow --json: every event written after the start, in order, each once.
    followed = _json_lines(follow, started)
    reasons = [data["reason"] for _, data in followed]
    expected = ["fault_detected", "recovery_opened", "strategy_decided", "recovery_done", "job_succeeded"]
    assert [r for r in reasons if r in expected] == expected, reasons
    stored = [e for e in cluster.events(job) if ts_to_s(e.at) >= started]
    assert [e.reason for e in stored] == reasons
    text = [line for at, line in follow_text.lines if at >= started]
    assert [line.split()[2] for line in text] == reasons
    _report(
        "events --follow: event written -> its line",
        [(at - _parse_rfc3339(data["at"])) * 1000 for at, data in followed],
        record_property,
    )

    # status --watch (text, to a pipe): one table per update, the last one the ended job's.
    blocks = "\n".join(line for _, line in watch_text.lines).split("--- revision ")[1:]
    assert len(blocks) == len(updates) and view.spec is not None
    assert blocks[-1].splitlines()[1] == f"job {job}  run {view.spec.uid}  state SUCCEEDED (every rank exited 0)"


def _parse_rfc3339(text: str) -> float:
    """Seconds since the epoch of proto3 JSON's UTC timestamp."""
    stamp = pb.Event().at
    stamp.FromJsonString(text)
    return ts_to_s(stamp)


def _spec(job: str, uid: str) -> bytes:
    return encode(pb.JobSpec(name=job, uid=uid, world_size=1, nnodes=1, nproc_per_node=1))


def _recovery(phase: int) -> bytes:
    return encode(pb.Recovery(epoch=1, recovery_id=1, uuid="u", phase=phase))


PHASES = [pb.PHASE_STOPPING, pb.PHASE_GLOBAL_FAULT, pb.PHASE_DECIDING, pb.PHASE_RECOVERING, pb.PHASE_DONE]


async def _put(store: Store, key: str, value: bytes) -> float:
    """Put ``key``; the wall-clock time just before the request (so the latency is an upper bound)."""
    before = time.time()
    await store.put(key, value)
    return before


async def _put_event(store: Store, keys: Keyspace, run: RunRef, reason: str) -> float:
    event = pb.Event(at=ts_from_s(time.time()), source="test", reason=reason, message="a put")
    return await _put(store, keys.event(run, f"{time.time_ns():020d}-test-{reason}"), encode(event))


async def _arrival(proc: Lines, what: str, predicate: Callable[[str], bool]) -> float:
    return await asyncio.to_thread(proc.wait_for, what, predicate)


async def test_each_put_is_one_line_and_ctrl_c_or_the_jobs_end_stops_the_watch(
    store: Store, keys: Keyspace, etcd_endpoint: str, key_prefix: str, record_property: Callable[[str, Any], None]
) -> None:
    job, run = "static", RunRef("static", "run-s")
    await store.put(keys.job_spec(job), _spec(job, run.uid))
    await store.put(keys.recovery(run), _recovery(pb.PHASE_COLLECTING))
    await _put_event(store, keys, run, "stored")  # its line says the follow has read the log
    commands = [("status", job, "--watch", "--json"), ("status", job, "--watch"), ("events", job, "--follow", "--json")]
    with ctl_lines(etcd_endpoint, key_prefix, *commands) as (watch, watch_text, follow):
        await _arrival(watch, "COLLECTING", lambda line: '"phase":"COLLECTING"' in line)
        await _arrival(watch_text, "the first table", lambda line: line.startswith("--- revision"))
        await _arrival(follow, "the stored event", lambda line: json.loads(line)["reason"] == "stored")

        watch_ms = []
        for phase in PHASES:
            name = pb.Phase.Name(phase).removeprefix("PHASE_")
            put_at = await _put(store, keys.recovery(run), _recovery(phase))
            arrived = await _arrival(watch, name, lambda line, name=name: json.loads(line)["recovery"]["phase"] == name)
            watch_ms.append((arrived - put_at) * 1000)
        assert [json.loads(line)["recovery"]["phase"] for _, line in watch.lines] == [
            "COLLECTING",
            *(pb.Phase.Name(p).removeprefix("PHASE_") for p in PHASES),
        ]
        _report("status --watch: put -> its line", watch_ms, record_property)

        follow_ms = []
        for n in range(5):
            put_at = await _put_event(store, keys, run, f"probe_{n}")
            arrived = await _arrival(follow, f"probe_{n}", lambda line, n=n: json.loads(line)["reason"] == f"probe_{n}")
            follow_ms.append((arrived - put_at) * 1000)
        _report("events --follow: put -> its line", follow_ms, record_property)

        assert await asyncio.to_thread(watch.interrupt) == 130
        assert await asyncio.to_thread(follow.interrupt) == 130
        await store.put(keys.status(run), encode(pb.JobStatus(uid=run.uid, state=pb.JOB_FAILED, reason="test")))
        assert await asyncio.to_thread(watch_text.finish) == 0
        last = max(i for i, (_, line) in enumerate(watch_text.lines) if line.startswith("--- revision"))
        assert watch_text.lines[last + 1][1] == f"job {job}  run {run.uid}  state FAILED (test)"


class CountingStore:
    """A store whose reads are counted: the watch's updates must not come from reads."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.reads = 0

    async def get_prefix(self, prefix: str, **kwargs: Any) -> Any:
        self.reads += 1
        return await self.store.get_prefix(prefix, **kwargs)

    def watch_prefix(self, prefix: str, start_revision: int) -> Any:
        return self.store.watch_prefix(prefix, start_revision)


async def test_the_watch_reads_etcd_once_and_updates_from_the_watch(store: Store, keys: Keyspace) -> None:
    job, run = "counted", RunRef("counted", "run-c")
    await store.put(keys.job_spec(job), _spec(job, run.uid))
    counting = CountingStore(store)
    shown: asyncio.Queue[JobView] = asyncio.Queue()
    task = asyncio.create_task(watch_status(counting, keys, job, shown.put_nowait))  # type: ignore[arg-type]
    try:
        assert (await asyncio.wait_for(shown.get(), ARRIVAL_TIMEOUT_S)).recovery is None
        for phase in PHASES:
            await store.put(keys.recovery(run), _recovery(phase))
            view = await asyncio.wait_for(shown.get(), ARRIVAL_TIMEOUT_S)
            assert view.recovery is not None and view.recovery.phase == phase
        assert counting.reads == 1
    finally:
        task.cancel()
        await asyncio.wait({task})


def _tgkill(pid: int, tid: int, signum: int) -> None:
    """Send ``signum`` to one thread of ``pid`` (os.kill lets the kernel pick the thread)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(234, pid, tid, signum) != 0:  # SYS_tgkill on x86-64
        raise OSError(ctypes.get_errno(), "tgkill")


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the tgkill syscall number is x86-64's")
async def test_ctrl_c_ends_an_idle_follow_whichever_thread_takes_it(
    store: Store, keys: Keyspace, etcd_endpoint: str, key_prefix: str
) -> None:
    """A SIGINT the kernel hands to one of gRPC's threads must still end an idle follow (issue 25:
    asyncio.run's own handler waited for the next I/O, which an ended job never sends)."""
    job, run = "idle", RunRef("idle", "run-i")
    await store.put(keys.job_spec(job), _spec(job, run.uid))
    await _put_event(store, keys, run, "stored")
    with ctl_lines(etcd_endpoint, key_prefix, ("events", job, "--follow", "--json")) as (follow,):
        await _arrival(follow, "the stored event", lambda line: json.loads(line)["reason"] == "stored")
        threads = sorted(int(t) for t in os.listdir(f"/proc/{follow.proc.pid}/task") if int(t) != follow.proc.pid)
        assert threads, "recoverctl runs gRPC's threads beside its main one"
        await asyncio.sleep(1.0)  # idle, as after its job's end: nothing will wake its loop
        sent = time.monotonic()
        _tgkill(follow.proc.pid, threads[-1], signal.SIGINT)
        assert await asyncio.to_thread(follow.finish, 15.0) == 130
        print(f"SIGINT to thread {threads[-1]} -> exit: {time.monotonic() - sent:.2f}s")
