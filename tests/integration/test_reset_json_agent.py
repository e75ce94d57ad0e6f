"""reset.json on a node: a device plugin's file (a ConfigMap volume) becomes faults; state is mirrored."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from recoverd.records import pb
from recoverd.resetjson import read_file

from .cluster import Cluster

pytestmark = pytest.mark.etcd


def _publish(volume: Path, document: dict[str, object], version: int) -> None:
    """Update a ConfigMap volume the way the kubelet does: new timestamped dir, atomic ..data swap."""
    stamp = volume / f"..2026_{version}"
    stamp.mkdir()
    (stamp / "reset.json").write_text(json.dumps(document))
    tmp = volume / "..data_tmp"
    tmp.symlink_to(stamp.name)
    os.replace(tmp, volume / "..data")
    if not (volume / "reset.json").is_symlink():
        (volume / "reset.json").symlink_to("..data/reset.json")


def test_a_device_fault_in_reset_json_restarts_the_rank_and_is_mirrored(cluster: Cluster, tmp_path: Path) -> None:
    volume = tmp_path / "config"
    volume.mkdir()
    _publish(volume, {"status": "initializing"}, 1)
    mirror = tmp_path / "mirror" / "reset.json"
    mirror.parent.mkdir()
    cluster.coordinator()
    cluster.strategy()
    cluster.agent("job-reset", nproc=2, strategies="recover-in-place,exit",
                  extra=("--reset-json", str(volume / "reset.json"), "--reset-json-mirror", str(mirror)))  # fmt: skip
    before = cluster.wait_running("job-reset", 2)
    mirrored = cluster.wait_for("the first mirror", lambda: read_file(str(mirror)), timeout=10)
    assert mirrored.rank_list == ()

    # The device plugin marks rank 1's chip unrecovered (booleans as current writers emit them).
    _publish(volume, {"RankList": [{"RankId": 1, "LogicId": 1, "Status": "unrecovered", "Policy": "restart",
                                    "InitialPolicy": "restart", "ErrorCode": [], "ErrorCodeHex": "80E01801"}],
                      "UpdateTime": 1764400000, "RetryTime": 0, "FaultFlushing": False, "GracefulExit": 0,
                      "RestartFaultProcess": False}, 2)  # fmt: skip
    after = cluster.wait_for(
        "rank 1 restarted for the device fault",
        lambda: (r := cluster.ranks("job-reset"))[1].restart_count == 1 and r[1].state == pb.RANK_RUNNING and r,
    )
    assert after[0].pid == before[0].pid and after[1].pid != before[1].pid
    recovery = cluster.view("job-reset").recovery
    assert recovery is not None and "unrecovered (device fault)" in recovery.faults[0].detail

    # The mirror said what ClusterD would while recovering, and is clear again afterwards.
    cluster.wait_for("the recovery done", lambda: cluster.view("job-reset").recovery.phase == pb.PHASE_DONE)  # type: ignore[union-attr]
    time.sleep(0.3)
    final = read_file(str(mirror))
    assert final is not None and final.rank_list == () and not final.fault_flushing

    # A malformed file is reported and changes nothing; the watched volume is never written.
    listing = sorted(p.name for p in volume.iterdir())
    _publish(volume, {"RankList": [{"RankId": "one", "Status": "unrecovered"}]}, 3)
    cluster.wait_for(
        "the bad file to be reported",
        lambda: any(e.reason == "bad_record" and "RankId" in e.message for e in cluster.events("job-reset")),
    )
    assert cluster.ranks("job-reset")[1].restart_count == 1
    assert sorted(p.name for p in volume.iterdir()) == sorted([*listing, "..2026_3"])


def test_the_mirror_may_not_be_written_beside_the_watched_file(cluster: Cluster, tmp_path: Path) -> None:
    cluster.agent("job-mirror", nproc=1, extra=("--reset-json", str(tmp_path / "reset.json"),
                                                "--reset-json-mirror", str(tmp_path / "mirror.json")))  # fmt: skip
    assert cluster.wait_exit("agent-node0") == 2
    assert "never writes into the watched" in cluster.procs["agent-node0"].log_path.read_text()  # type: ignore[attr-defined]
