"""recoverctl's ``jobs``, ``timeline --recovery/--plot`` and every read command's ``--json`` against
its schema (docs/recoverctl-schemas/), after a real recovery (the services' own records).

recoverctl runs in this process here (``ctl.main``, the console script's entry point): the output is
the same as a subprocess's, for a fraction of the time. test_ctl.py and test_ctl_live.py run it as
a subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from recoverd.cli import ctl
from recoverd.records import encode, pb

from .cluster import Cluster
from .ctl_schemas import check, schemas
from .recovered import JOB, Recovered, recover_one_rank, wait_recovered

pytestmark = pytest.mark.etcd

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class Ctl:
    """recoverctl in this process against the test's etcd and prefix."""

    def __init__(self, cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
        self.cluster = cluster
        self.capsys = capsys

    def run(self, *args: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as stop:
            ctl.main(["--etcd", self.cluster.endpoint, "--prefix", self.cluster.prefix, *args])
        out, err = self.capsys.readouterr()
        assert "Traceback" not in err
        return int(stop.value.code or 0), out, err

    def __call__(self, *args: str) -> str:
        code, out, err = self.run(*args)
        assert code == 0, f"recoverctl {' '.join(args)} exited {code}: {err}"
        return out

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "--json"))


@pytest.fixture
def recovered(cluster: Cluster) -> Recovered:
    return recover_one_rank(cluster, JOB)


def test_the_schemas_are_valid_and_each_read_command_has_one() -> None:
    known = schemas()
    assert set(known) == {"jobs", "status", "event", "events", "decisions", "timeline", "stacks", "policy"}
    for name, schema in known.items():
        Draft202012Validator.check_schema(schema)
        assert schema["$id"] == f"urn:recoverd:recoverctl:{name}"


def test_every_read_command_json_matches_its_schema(recovered: Recovered, capsys: pytest.CaptureFixture[str]) -> None:
    run = Ctl(recovered.cluster, capsys)
    status = check("status", run.json("status", JOB))
    assert status["recovery"]["phase"] == "DONE" and status["revision"] > 0
    jobs = check("jobs", run.json("jobs"))
    assert jobs == [
        {
            "job": JOB,
            "run": recovered.run,
            "state": "RUNNING",
            "error": "",
            "ranks_running": 4,
            "world_size": 4,
            "nodes": ["node0"],
            "nnodes": 1,
            "recovery": {"id": 1, "epoch": recovered.epoch, "phase": "DONE", "strategy": "recover-in-place"},
        }
    ]
    events = check("events", run.json("events", JOB))
    assert {"fault_detected", "recovery_opened", "phase", "recovery_done"} <= {e["reason"] for e in events}
    check("decisions", run.json("decisions", JOB))
    timeline = check("timeline", run.json("timeline", JOB))
    assert [row["phase"] for row in timeline["phases"]][:2] == ["DETECTED", "COLLECTING"]
    assert timeline["phases"][-1] == {**timeline["phases"][-1], "phase": "DONE", "duration_ms": None}
    check("stacks", run.json("stacks", JOB))
    policy = check("policy", run.json("policy", "show", JOB))
    assert policy["strategies"] == ["recover-in-place", "exit"]


def test_json_of_a_job_without_recovery_and_of_a_bad_spec(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """Records written here, no services: the nulls and empty lists of a quiet job, and a job whose
    spec is garbage listed by ``jobs`` with the reason."""
    keys = cluster.keys
    spec = pb.JobSpec(name="quiet", uid="run-q", world_size=2, nnodes=1, nproc_per_node=2)
    cluster.put(keys.job_spec("quiet"), encode(spec))
    cluster.put(keys.job_spec("broken"), b"{not json")
    run = Ctl(cluster, capsys)
    status = check("status", run.json("status", "quiet"))
    assert status["recovery"] is None and status["ranks"] == []
    assert check("timeline", run.json("timeline", "quiet")) is None
    assert check("events", run.json("events", "quiet")) == []
    assert check("decisions", run.json("decisions", "quiet")) == []
    assert check("stacks", run.json("stacks", "quiet")) == []
    jobs = check("jobs", run.json("jobs"))
    assert [(j["job"], j["state"]) for j in jobs] == [("broken", "BAD_SPEC"), ("quiet", "RUNNING")]
    assert jobs[0]["error"] and jobs[1]["recovery"] is None
    assert run("jobs").splitlines()[1].split()[:4] == ["broken", "BAD_SPEC", "0/0", "0/0"]
    code, _, err = run.run("timeline", "quiet", "--plot", "never.png")
    assert (code, err.strip()) == (1, "recoverctl: job quiet has had no recovery so far: nothing to plot")


def test_jobs_text_timeline_of_the_last_recovery_only_and_its_plot(
    recovered: Recovered, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run = Ctl(recovered.cluster, capsys)
    header, row = run("jobs").splitlines()
    assert header.split() == ["JOB", "STATE", "RANKS", "NODES", "RECOVERY"]
    assert row.split() == [
        JOB,
        "RUNNING",
        "4/4",
        "1/1",
        "1",
        "DONE",
        "recover-in-place",
        "(epoch",
        f"{recovered.epoch})",
    ]

    assert run("timeline", JOB, "--recovery", "1") == run("timeline", JOB)
    code, _, err = run.run("timeline", JOB, "--recovery", "2")
    assert (code, err.strip()) == (1, "recoverctl: no recovery 2: the job's recoveries are 1 to 1")

    png = tmp_path / "recovery-1.png"
    code, out, err = run.run("timeline", JOB, "--plot", str(png), "--json")
    assert code == 0 and json.loads(out)["recovery"] == 1  # stdout stays the JSON document
    assert err.strip() == f"recoverctl: timeline of recovery 1 drawn in {png}"
    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 1000
    code, _, err = run.run("timeline", JOB, "--plot", str(tmp_path / "no-such-dir" / "x.png"))
    assert (
        code == 2 and "cannot write the plot to " in err and err.rstrip().endswith("x.png: No such file or directory")
    )

    # A second recovery overwrites the record; recovery 1's timeline comes from its outcome in the history.
    first = json.loads(run("timeline", JOB, "--json"))
    os.kill(recovered.after[1].pid, signal.SIGKILL)
    wait_recovered(recovered.cluster, JOB, 2)
    assert json.loads(run("timeline", JOB, "--recovery", "1", "--json")) == first
    assert run("timeline", JOB, "--recovery", "2").startswith("recovery 2: ranks [1], strategy recover-in-place")
    assert json.loads(run("timeline", JOB, "--json"))["recovery"] == 2
    assert run("jobs").splitlines()[1].split()[4:6] == ["2", "DONE"]


def test_plot_without_matplotlib_exits_2_and_names_the_package(tmp_path: Path) -> None:
    """Checked before etcd is touched: the endpoint here answers nothing."""
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no matplotlib here (test)')\n")
    env = {**os.environ, "PYTHONPATH": str(shadow.parent), "GRPC_VERBOSITY": "ERROR"}
    proc = subprocess.run(
        [sys.executable, "-m", "recoverd.cli.ctl", "--etcd", "127.0.0.1:9", "timeline", "j", "--plot", "x.png"],
        capture_output=True,
        text=True,
        timeout=15,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert "pip install matplotlib" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.png").exists()
