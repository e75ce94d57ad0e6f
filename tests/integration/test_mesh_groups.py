"""FSDP2 on an HSDP mesh (2 x 2, replicate x shard) over recoverd's stable process groups
(taskd_client.pytorch.mesh, issue 26): the same bits as over torch's own gloo groups, the twins (the
ranks holding the same shard in the two replicas) equal, and every group of the mesh moved to a new
generation of gloo groups mid-training, under the live model and optimizer, changing nothing; and
a rank that lost its whole shard healed from its twin's (``mesh.local_state``), bitwise.

Four real processes on the CPU (examples/hsdp_train.py); no etcd, no agent: this is the mechanism
the twin healing of issue 26 is to be built on.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "hsdp_train.py")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _train(*args: str) -> dict[int, str]:
    """Run the example on 4 ranks; each rank's final hash of its shards."""
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, EXAMPLE, *args],
            env={**os.environ, "RANK": str(r), "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(4)
    ]
    outputs = [proc.communicate(timeout=180)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 4, "\n".join(outputs)
    return {int(r): h for out in outputs for r, h in re.findall(r"rank (\d) final sha256 (\w+)", out)}


@pytest.mark.slow  # 12 torch processes: make test-slow
def test_hsdp_over_stable_groups_is_bitwise_torch_s_and_survives_a_rebind() -> None:
    plain = _train("--groups", "plain")
    assert plain[0] == plain[2] and plain[1] == plain[3], "twins must hold the same shard, bit for bit"
    assert plain[0] != plain[1]
    assert _train("--groups", "stable") == plain
    assert _train("--groups", "stable", "--rebind-at", "4") == plain
    # Rank 2 loses its whole shard (parameters, Adam's state, RNG) before step 5 and takes its
    # twin's: the run ends bitwise as if nothing had happened.
    assert _train("--groups", "stable", "--rebind-at", "5", "--heal-at", "5") == plain
