"""scripts/gpu_check.sh where there is no GPU (docs/gpu.md): it must say so, check by check, and
exit 0 within seconds; its shell must parse; its CPU rehearsal (slow: torch) must pass.

What it does on a GPU cannot be tested here: the device tool runs it (docs/gpu.md).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
BUNDLE = ROOT / "scripts" / "gpu_check_bundle.sh"

#: Every check the script reports on, in its order (nccl_peer_hang: always SKIP with one GPU).
CHECKS = [
    "deps",
    "nvml_raw",
    "nvml_detector",
    "nccl_raw_abort_reinit",
    "nccl_group_abort_reinit",
    "job_world1_kill",
    "job_shared_gpu_2ranks",
    "job_world1_bitwise",
    "job_world1_bitwise_equal",
    "nccl_group_abort_pending",
    "nccl_two_ranks_one_gpu",
    "nccl_peer_hang",
]


def _run(tmp_path: Path, *args: str, timeout: float = 60, **env: str) -> tuple[int, list[dict[str, Any]], str]:
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env={**os.environ, "OUT": str(out), "TMPDIR": str(tmp_path), **env},
    )
    lines = [json.loads(line) for line in (out / "gpu_check.jsonl").read_text().splitlines() if line.strip()]
    return proc.returncode, lines, proc.stdout + proc.stderr


def _no_driver() -> bool:
    return shutil.which("nvidia-smi") is None and not glob.glob("/dev/nvidia[0-9]*")


def test_the_scripts_parse_and_pass_shellcheck_where_it_is_installed() -> None:
    for script in (SCRIPT, BUNDLE):
        subprocess.run(["bash", "-n", str(script)], check=True)
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (bash -n passed)")
    subprocess.run([shellcheck, str(SCRIPT), str(BUNDLE)], check=True)


def test_no_gpu_mode_says_skip_for_every_check_and_exits_0_in_seconds(tmp_path: Path) -> None:
    started = time.monotonic()
    code, lines, output = _run(tmp_path, "--no-gpu")
    assert time.monotonic() - started < 30, output  # ~1 s; a loaded CI machine is slower
    assert code == 0, output
    assert [line["check"] for line in lines] == CHECKS
    assert all(line["status"] == "SKIP" and line["mode"] == "no-gpu" for line in lines), lines
    assert all(line["reason"].startswith("no CUDA device") for line in lines[:-1]), lines
    assert "needs 2 GPUs or more" in lines[-1]["reason"]
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert summary.startswith("GPU CHECK, NO GPU: 0 PASS, 0 FAIL, 12 SKIP"), summary
    assert (tmp_path / "out" / "logs.tar.gz").exists()
    assert not list(tmp_path.glob("gpu-check.*")), "its work folder was left behind"


@pytest.mark.skipif(not _no_driver(), reason="an NVIDIA driver is here: the script would look for a GPU")
def test_without_a_driver_the_default_mode_finds_no_gpu_by_itself(tmp_path: Path) -> None:
    code, lines, output = _run(tmp_path)
    assert code == 0, output
    assert [line["check"] for line in lines] == CHECKS
    assert all(line["status"] == "SKIP" for line in lines), lines
    assert "no NVIDIA driver here" in lines[0]["reason"]


def test_a_budget_over_8_minutes_or_an_unknown_flag_is_refused(tmp_path: Path) -> None:
    for args in (("--budget", "481"), ("--frobnicate",)):
        proc = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30, cwd=tmp_path)
        assert proc.returncode == 2, proc.stdout + proc.stderr


@pytest.mark.slow
def test_the_cpu_rehearsal_of_the_nvml_and_group_checks_passes(tmp_path: Path) -> None:
    """The harness itself, with the CPU for the GPU and tests/nvml_standin.py for NVML (torch,
    etcd): `make gpu-check-rehearsal` runs every step this way, the jobs included (~4 min here)."""
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install -r requirements-torch.txt)")
    code, lines, output = _run(
        tmp_path, "--rehearse-on-cpu", "--only", "deps,nvml,nccl", timeout=300, GPU_CHECK_PYTHON=sys.executable
    )
    status = {line["check"]: line["status"] for line in lines}
    assert code == 0, output
    for check in ("deps", "nvml_raw", "nvml_detector", "nccl_raw_abort_reinit", "nccl_group_abort_reinit"):
        assert status[check] == "PASS", (check, output)
    assert all(line["mode"] == "rehearsal" for line in lines if line["check"] != "bundle")
    assert "REHEARSAL ON THE CPU (no GPU result)" in (tmp_path / "out" / "summary.txt").read_text()
