"""``recoverd.agent.stacks.capture_stacks`` on real processes: py-spy, faulthandler, stopped and strangers.

Each process runs tests/fixtures/stacks/scenario.py (it blocks where a training rank can hang). The
captures must name where each one is, record why when they cannot, and leave every process as it
was: running ones running, the stopped one stopped, none signalled that did not arm faulthandler.
"""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from recoverd.agent.stacks import PERMISSION, STOPPED, StackTarget, capture_stacks, find_py_spy
from recoverd.records import pb

SCENARIO = Path(__file__).resolve().parents[1] / "fixtures" / "stacks" / "scenario.py"


@dataclass
class Proc:
    popen: subprocess.Popen[str]
    signum: int | None
    path: str | None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def target(self, rank: int) -> StackTarget:
        return StackTarget(rank=rank, pid=self.pid, stack_signal=self.signum, dump_path=self.path)

    def state(self) -> str:
        raw = Path(f"/proc/{self.pid}/stat").read_text()
        return raw[raw.rfind(")") + 1 :].split()[0]


Spawn = Callable[..., Proc]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Spawn]:
    procs: list[Proc] = []

    def spawn(name: str, arm: int | None = None) -> Proc:
        argv = [sys.executable, str(SCENARIO), name] + ([] if arm is None else ["--arm", str(arm)])
        env = {**os.environ, "RECOVERD_STACK_DIR": str(tmp_path / "stacks")}
        popen = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
        assert popen.stdout is not None
        _, signum, path = popen.stdout.readline().split()
        proc = Proc(popen, None if signum == "-" else int(signum), None if path == "-" else path)
        procs.append(proc)
        time.sleep(0.3)  # from "ready" to blocked where the scenario says
        return proc

    yield spawn
    for proc in procs:
        if proc.popen.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        proc.popen.kill()
        proc.popen.wait(timeout=10)


def _capture(targets: list[StackTarget], *, py_spy: str | bool = True, timeout_s: float = 5.0) -> list[pb.RankStack]:
    return asyncio.run(capture_stacks(targets, timeout_s, py_spy=py_spy))


def _needs_py_spy() -> str:
    tool = find_py_spy()
    if tool is None:
        pytest.skip("py-spy is not installed (pip install 'recoverd[stacks]')")
    probe = subprocess.run([tool, "dump", "--nonblocking", "--pid", str(os.getpid())], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"py-spy cannot read processes here: {probe.stderr.strip()[:200]}")
    return tool


def test_without_py_spy_faulthandler_answers_and_nobody_else_is_signalled(start: Spawn) -> None:
    waiting = start("event_wait")  # did not arm faulthandler
    stopped = start("queue_get", arm=1)
    os.kill(stopped.pid, signal.SIGSTOP)
    armed = start("all_reduce", arm=2)
    impostor = start("sleep")  # claims a dump file it never opened (a reused pid, a lying heartbeat)
    claimed = armed.target(3)
    fake = StackTarget(rank=3, pid=impostor.pid, stack_signal=signal.SIGUSR2, dump_path=claimed.dump_path)

    started = time.monotonic()
    out = _capture([armed.target(2), waiting.target(0), stopped.target(1), fake], py_spy=False, timeout_s=5)
    took = time.monotonic() - started

    assert [s.rank for s in out] == [2, 0, 1, 3]
    by_rank = {s.rank: s for s in out}
    got = by_rank[2]
    assert (got.tool, got.where, got.error, got.pid) == ("faulthandler", "all_reduce", "", armed.pid)
    assert got.text.startswith("Thread ") and "distributed_c10d.py" in got.text
    assert "no tool" in by_rank[0].error and "did not arm faulthandler" in by_rank[0].error
    assert not by_rank[0].text
    assert by_rank[1].error == STOPPED and not by_rank[1].text
    assert "does not hold" in by_rank[3].error and "not signalled" in by_rank[3].error
    assert took < 2.0, took  # nothing waited for the stopped process

    for proc in (waiting, armed, impostor):
        assert proc.popen.poll() is None and proc.state() != "T"
    assert stopped.popen.poll() is None and stopped.state() == "T"
    # The stopped one was never signalled: once continued it does not dump (and does not die).
    assert stopped.path is not None
    size_before = os.path.getsize(stopped.path)
    os.kill(stopped.pid, signal.SIGCONT)
    time.sleep(0.3)
    assert stopped.popen.poll() is None and os.path.getsize(stopped.path) == size_before


def test_py_spy_reads_running_and_stopped_processes_without_pausing_them(start: Spawn) -> None:
    _needs_py_spy()
    names = ["event_wait", "data_loading", "thread_join", "barrier"]
    procs = [start(name) for name in names]
    stopped = start("event_wait")
    os.kill(stopped.pid, signal.SIGSTOP)
    targets = [p.target(r) for r, p in enumerate([*procs, stopped])]

    started = time.monotonic()
    out = _capture(targets, timeout_s=10)
    took = time.monotonic() - started

    assert [s.where for s in out] == ["Event.wait", "data loading", "Thread.join", "barrier", "Event.wait"]
    assert all(s.tool == "py-spy" and not s.error and s.text.startswith("Process ") for s in out)
    assert took < 3.0, f"5 py-spy dumps in parallel took {took:.2f}s"
    assert all(p.popen.poll() is None and p.state() != "T" for p in procs)
    assert stopped.state() == "T"  # --nonblocking: read as it is, still stopped


def _fake_py_spy(tmp_path: Path, body: str) -> str:
    path = tmp_path / "py-spy"
    path.write_text(f"#!{sys.executable}\nimport os, sys, time\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_py_spy_refused_falls_back_to_faulthandler_and_says_why(start: Spawn, tmp_path: Path) -> None:
    denied = _fake_py_spy(
        tmp_path,
        "sys.stderr.write('Permission Denied: Try running again with elevated permissions by going "
        "\\'sudo env \"PATH=$PATH\" !!\\'\\n'); sys.exit(1)",
    )
    armed = start("data_loading", arm=0)
    plain = start("event_wait")
    out = _capture([armed.target(0), plain.target(1)], py_spy=denied)
    assert (out[0].tool, out[0].where, out[0].error) == ("faulthandler", "data loading", "")
    assert out[1].error == f"{PERMISSION}; faulthandler: not armed by the process (taskd_client.stackdump.arm)"
    assert "CAP_SYS_PTRACE" in out[1].error
    (missing,) = _capture([plain.target(1)], py_spy=str(tmp_path / "no-such-py-spy"))
    assert missing.error.startswith("py-spy: cannot run ") and "No such file" in missing.error
    assert armed.popen.poll() is None and plain.popen.poll() is None


def test_py_spy_is_retried_once_and_timed_out(start: Spawn, tmp_path: Path) -> None:
    real = _needs_py_spy()
    marker = tmp_path / "tried"
    flaky = _fake_py_spy(
        tmp_path,
        f"if not os.path.exists({str(marker)!r}):\n"
        f"    open({str(marker)!r}, 'w').close()\n"
        "    sys.stderr.write('Error: Failed to find python version from target process\\n')\n"
        "    sys.stderr.write('\\nStack backtrace:\\n  0: x\\n')\n"
        "    sys.exit(1)\n"
        f"os.execv({real!r}, [{real!r}, *sys.argv[1:]])",
    )
    proc = start("select")
    (stack,) = _capture([proc.target(0)], py_spy=flaky)
    assert (stack.tool, stack.where, stack.error) == ("py-spy", "select", "")
    assert marker.exists()

    marker.unlink()
    failing = _fake_py_spy(tmp_path, "sys.stderr.write('Error: Failed to find python version\\n'); sys.exit(1)")
    (stack,) = _capture([proc.target(0)], py_spy=failing)
    assert stack.error.startswith("py-spy: Failed to find python version;")

    hanging = _fake_py_spy(tmp_path, "time.sleep(60)")
    started = time.monotonic()
    (stack,) = _capture([proc.target(0)], py_spy=hanging, timeout_s=0.5)
    assert time.monotonic() - started < 2.0
    assert stack.error.startswith("py-spy: no answer within 0.5s")
    assert proc.popen.poll() is None  # the fake py-spy was killed and reaped (the leak check sees it otherwise)


def test_gone_and_zombie_processes(start: Spawn) -> None:
    proc = start("sleep")
    proc.popen.kill()
    time.sleep(0.2)  # a zombie until reaped
    (zombie,) = _capture([proc.target(0)], py_spy=False)
    assert "has exited" in zombie.error
    proc.popen.wait()
    (gone,) = _capture([proc.target(0)], py_spy=False)
    assert gone.error == f"process {proc.pid} is gone"
    assert _capture([], py_spy=False) == []


def test_a_claimed_dump_file_is_touched_only_through_the_process_that_appends_to_it(tmp_path: Path) -> None:
    """The dump path comes from the rank's client: a file the process only reads, or one of another
    user, is neither truncated nor read, and the process is not signalled."""
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    holders = []
    try:
        for mode in ("r", "a"):
            code = f"import time; f = open({str(victim)!r}, {mode!r}); print('ready', flush=True); time.sleep(60)"
            proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            holders.append(proc)
        reader, appender = holders

        def claim(pid: int) -> StackTarget:
            return StackTarget(rank=0, pid=pid, stack_signal=signal.SIGUSR2, dump_path=str(victim))

        (read_only,) = _capture([claim(reader.pid)], py_spy=False)
        assert "does not hold" in read_only.error and "not signalled" in read_only.error
        if os.getuid() == 0:  # a file of another user, appended to by a root process
            os.chown(victim, 65534, 65534)
            (foreign,) = _capture([claim(appender.pid)], py_spy=False)
            assert "not a regular file of the process's user" in foreign.error
        assert victim.read_text() == "keep me\n"
        assert all(p.poll() is None for p in holders)  # SIGUSR2 was never sent: it would have killed them
    finally:
        for proc in holders:
            proc.kill()
            proc.wait()
