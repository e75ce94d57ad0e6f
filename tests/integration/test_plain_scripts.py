"""The paths users take with scripts that carry no recoverd code (docs/adr/0041, 0042).

* The README's first example, ``recoverd run --strategies recover-in-place,exit -- python
  train.py``, over a plain torch DDP script: a SIGKILLed rank must not be restarted alone (it would
  wait in ``init_process_group`` for good while every survivor dies or waits too); every rank is
  restarted, the decision says why, and the job ends 0.
* A rank of a plain script that prints its steps and is then SIGSTOPped is found hung with the
  defaults: its output is its progress.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from .cluster import WORKER

pytestmark = pytest.mark.etcd

HERE = Path(__file__).resolve().parent
PLAIN_DDP = str(HERE / "plain_torch_ddp.py")
T = TypeVar("T")


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    """``recoverd run`` as a user starts it (its embedded etcd), output in a file."""
    out = tmp_path / "run.out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECOVERD_")}
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "recoverd.cli.main", "run", "--log-dir", str(tmp_path / "logs"), *args],
            stdout=sink, stderr=subprocess.STDOUT, env={**env, "GRPC_VERBOSITY": "ERROR"},
        )  # fmt: skip
    return proc, out


def _wait(what: str, found: Callable[[], T | None], timeout: float, proc: subprocess.Popen[bytes], out: Path) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := found()) is not None:
            return value
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {timeout}s; recoverd run said:\n{out.read_text()[-3000:]}")


def _last(log: Path, pattern: str) -> re.Match[str] | None:
    text = log.read_text() if log.exists() else ""
    found = list(re.finditer(pattern, text))
    return found[-1] if found else None


def _finish(proc: subprocess.Popen[bytes], timeout: float = 120) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_plain_ddp_script_under_recover_in_place_is_restarted_whole_and_ends_0(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install -r requirements-torch.txt)")
    proc, out = _run(
        tmp_path, "--job", "plain-ddp", "--nproc-per-node", "4", "--strategies", "recover-in-place,exit",
        "--", sys.executable, PLAIN_DDP, "--steps", "30",
    )  # fmt: skip
    try:
        log1 = tmp_path / "logs" / "rank1.log"
        found = _wait("rank 1 at step 3", lambda: _last(log1, r"rank 1 step ([3-9]|\d\d+) pid (\d+)"), 120, proc, out)
        os.kill(int(found.group(2)), signal.SIGKILL)
        code = _finish(proc, timeout=180)
    finally:
        _finish(proc, timeout=0.1) if proc.poll() is None else None
    said = out.read_text()
    assert code == 0, said[-3000:]
    # Every rank was started twice and finished: the job restarted whole (exit), not rank 1 alone.
    # The round's epoch is 1, or 2 when a survivor's crash (its gloo peer gone) came after the
    # first round had stopped collecting: one restart either way (under load, seen with 2).
    for rank in range(4):
        log = (tmp_path / "logs" / f"rank{rank}.log").read_text()
        assert re.search(r"restart \(exit\) generation [12] restart 1 ", log), log[-2000:]
        assert "restart 2" not in log and f"rank {rank} done" in log, log[-2000:]
    decided = re.search(r"job plain-ddp epoch [12]: exit; recover-in-place: no, [^\n]*", said)
    assert decided is not None and "run no recoverd client" in decided.group(0), said[-3000:]


def test_a_sigstopped_rank_of_a_plain_script_that_prints_its_steps_is_a_hang(tmp_path: Path) -> None:
    proc, out = _run(
        tmp_path, "--job", "plain-hang", "--nproc-per-node", "2", "--strategies", "recover-in-place,exit",
        "--", sys.executable, WORKER, "--steps", "2000", "--step-time", "0.05",
    )  # fmt: skip
    try:
        log1 = tmp_path / "logs" / "rank1.log"
        pid = _wait("rank 1's pid", lambda: _last(log1, r"rank 1 pid (\d+)"), 60, proc, out).group(1)
        # Past its warm-up (the first few lines are start-up, allowed 300 s): 100 steps, 5 s.
        _wait("rank 1 at step 100", lambda: _last(log1, r"rank 1 step (\d{3,})\b"), 60, proc, out)
        os.kill(int(pid), signal.SIGSTOP)
        stopped_at = time.monotonic()
        hang = _wait(
            "the hang fault",
            lambda: _last(out, r"rank 1 hang fault: rank 1 \(pid \d+\) made no progress for [^\n]*"),
            90,
            proc,
            out,
        )
        took = time.monotonic() - stopped_at
        print(f"SIGSTOP -> hang fault seen in recoverd run's output: {took:.1f}s; {hang.group(0)}")
        assert "process stopped" in hang.group(0)
    finally:
        proc.send_signal(signal.SIGINT)
        _finish(proc, timeout=60)
