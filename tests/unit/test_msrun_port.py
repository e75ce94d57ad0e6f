"""Contract tests of the msrun port (``tests/msrun_port``): it must behave as msrun 2.10.0 does.

The port is what recoverd's ``MSRunPlugin`` is tested against, so these tests pin it to
``/work/shared/reference/msrun-contract.md`` (sections 3, 5, 7, 8), bugs included: KILL_WORKER
takes PIDs and ignores anything else, MONITOR loses exit codes and keeps stale entries,
START_WORKER_LIST neither de-duplicates nor range-checks, variables leak into the manager's own
environment, and restarts truncate the logs. Real processes throughout (the trivial worker).

Waiting: ``_wait_exit`` blocks in ``waitid(WNOWAIT)``, which returns when the child has exited but
leaves it unreaped, so MONITOR's own ``poll()`` is still the one that reaps, as in msrun.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.msrun_port import TRIVIAL_WORKER
from tests.msrun_port.fake_msrun import tft_enabled
from tests.msrun_port.process_manager import CALLBACK_ORDER, ProcessManager

ROOT = Path(__file__).resolve().parents[2]
LONG = ("--steps", "400", "--step-time", "0.05")  # runs ~20 s: always killed by the test
SHORT = ("--steps", "1", "--step-time", "0.2")  # outlives the spawn of its neighbours, then exits 0
_SCRUBBED = ("MS_", "RANK_", "DEVICE_ID", "MSRUN_TEST_", "STUB_")

MakeManager = Callable[..., ProcessManager]


@pytest.fixture(autouse=True)
def _restore_environ() -> Iterator[None]:
    """The port leaks MS_ROLE, RANK_ID, DEVICE_ID... into os.environ, like msrun: undo it."""
    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith(_SCRUBBED)]:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def make_manager(tmp_path: Path) -> Iterator[MakeManager]:
    managers: list[ProcessManager] = []

    def make(*worker_args: str, local_worker_num: int = 2, worker_num: int | None = None, **kw: Any) -> ProcessManager:
        manager = ProcessManager(
            str(TRIVIAL_WORKER),
            list(worker_args),
            worker_num=worker_num or local_worker_num,
            local_worker_num=local_worker_num,
            log_dir=tmp_path / f"logs{len(managers)}",
            master_port=8118,
            **kw,
        )
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        manager.cleanup()


def _wait_exit(pid: int) -> None:
    """Block until child ``pid`` has exited, without reaping it (it may already be reaped)."""
    with contextlib.suppress(ChildProcessError):
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _environ(pid: int) -> dict[str, str]:
    """A fresh child's environment. Popen returns once exec has begun (close-on-exec fired), but the
    kernel publishes the new environment a moment later; until then /proc/PID/environ reads empty."""
    deadline = time.monotonic() + 5.0
    while not (env := psutil.Process(pid).environ()) and time.monotonic() < deadline:
        time.sleep(0.005)
    return env


def _pids(manager: ProcessManager) -> dict[int, int]:
    return {rank: st["pid"] for rank, st in manager.monitor_rank_status([-1]).items()}


def _statuses(manager: ProcessManager) -> dict[int, int | None]:
    return {rank: st["status"] for rank, st in manager.monitor_rank_status([-1]).items()}


# ---------------------------------------------------------------------------- KILL_WORKER


def test_kill_worker_takes_pids_and_a_rank_number_is_a_silent_no_op(
    make_manager: MakeManager, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="msrun_port")
    manager = make_manager(*LONG)
    assert manager.start_all_workers() == 0
    pids = _pids(manager)
    for pid in pids.values():
        assert os.getsid(pid) == pid  # own session and process group (setsid)

    assert manager.kill_workers([0, 1]) == 0  # ranks passed by mistake
    assert "There's no active worker with pid: 0" in caplog.text
    assert "There's no active worker with pid: 1" in caplog.text
    assert _statuses(manager) == {0: None, 1: None}

    assert manager.kill_workers([pids[1]]) == 0
    _wait_exit(pids[1])
    status = manager.monitor_rank_status([-1])
    assert status[1] == {"pid": pids[1], "status": 300, "global_rank": 1, "local_rank": 1, "node_id": -1}
    assert status[0]["status"] is None
    assert manager.proc_rank_map[1].returncode == -signal.SIGKILL  # SIGKILL, by group

    caplog.clear()
    assert manager.kill_workers([pids[1]]) == 0  # stale pid: logged no-op
    assert f"There's no active worker with pid: {pids[1]}" in caplog.text
    assert manager.cgn_processes == [manager.proc_rank_map[0]]

    assert manager.kill_workers([5, -1]) == 0  # -1 anywhere: kill all
    _wait_exit(pids[0])
    assert manager.cgn_processes == [] and manager.tail_cgn_processes == []
    assert _pids(manager) == pids  # proc_rank_map is not cleared: stale entries
    assert _statuses(manager) == {0: 300, 1: 300}


def test_kill_worker_also_kills_the_log_followers_with_join(make_manager: MakeManager) -> None:
    manager = make_manager(*LONG, join=True)
    manager.start_all_workers()
    tails = list(manager.tail_cgn_processes)
    assert all(t is not None and t.poll() is None for t in tails)
    assert psutil.Process(tails[0].pid).cmdline()[-2:] == ["-f", str(manager.log_dir / "worker_0.log")]  # type: ignore[union-attr]

    manager.kill_workers([_pids(manager)[0]])
    assert tails[0].wait(timeout=5) == -signal.SIGKILL  # type: ignore[union-attr]
    assert tails[1].poll() is None  # type: ignore[union-attr]
    assert manager.tail_cgn_processes == [tails[1]]

    manager.kill_workers([-1])
    assert tails[1].wait(timeout=5) == -signal.SIGKILL  # type: ignore[union-attr]


# ---------------------------------------------------------------------------- MONITOR


def test_monitor_shows_300_for_any_failure_and_0_for_a_clean_exit(make_manager: MakeManager) -> None:
    manager = make_manager(*LONG, "--fail-rank", "1", local_worker_num=3)
    manager.start_all_workers()
    pids = _pids(manager)
    _wait_exit(pids[1])  # exits 3 (first attempt of rank 1)
    os.kill(pids[2], signal.SIGKILL)
    _wait_exit(pids[2])

    assert _statuses(manager) == {0: None, 1: 300, 2: 300}
    # poll() reaped them and saw the real codes, which MONITOR replaced by 300
    assert manager.proc_rank_map[1].returncode == 3
    assert manager.proc_rank_map[2].returncode == -signal.SIGKILL

    assert manager.start_worker_list([1]) == 0  # second attempt of rank 1 runs normally
    assert _pids(manager)[1] != pids[1]
    assert _statuses(manager) == {0: None, 1: None, 2: 300}  # rank 2 stays stale until restarted

    clean = make_manager("--steps", "0", local_worker_num=1)
    clean.start_all_workers()
    _wait_exit(_pids(clean)[0])
    assert _statuses(clean) == {0: 0}


def test_monitor_never_started_ranks_global_ranks_and_invalid_ranks(
    make_manager: MakeManager, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="msrun_port")
    manager = make_manager(*LONG, local_worker_num=3, worker_num=6, node_rank=1)
    assert manager.monitor_rank_status([-1]) == {r: {"pid": None, "status": 200, "global_rank": r} for r in range(3)}

    assert manager.start_worker_list([1]) == 0
    pid = manager.proc_rank_map[1].pid
    assert manager.monitor_rank_status([-1]) == {
        0: {"pid": None, "status": 200, "global_rank": 0},  # bare local rank, no local_rank/node_id
        1: {"pid": pid, "status": None, "global_rank": 4, "local_rank": 1, "node_id": 1},
        2: {"pid": None, "status": 200, "global_rank": 2},
    }
    env = _environ(pid)
    assert (env["RANK_ID"], env["DEVICE_ID"], env["MS_NODE_ID"], env["MS_ROLE"]) == ("4", "1", "4", "MS_WORKER")
    assert (env["MS_WORKER_NUM"], env["MS_SCHED_HOST"], env["MS_SCHED_PORT"]) == ("6", "127.0.0.1", "8118")

    assert manager.monitor_rank_status([3, -2, 7]) == {}
    assert caplog.text.count("Invalid rank id!") == 3

    # Without --node_rank on a multi-node job msrun knows no node id and sets neither RANK_ID nor
    # MS_NODE_ID: the worker inherits whatever leaked before (the scheduler's RANK_ID=0; here also
    # the previous spawn's MS_NODE_ID=4). MONITOR's global_rank is the local rank.
    os.environ["RANK_ID"] = "0"
    unknown = make_manager(*LONG, local_worker_num=2, worker_num=4)
    unknown.start_worker_list([1])
    env = _environ(unknown.proc_rank_map[1].pid)
    assert (env["RANK_ID"], env["DEVICE_ID"], env["MS_NODE_ID"]) == ("0", "1", "4")
    assert unknown.monitor_rank_status([1])[1] | {"pid": 0} == {
        "pid": 0,
        "status": None,
        "global_rank": 1,
        "local_rank": 1,
        "node_id": -1,
    }


# ---------------------------------------------------------------------------- START_WORKER_LIST


def test_start_worker_list_neither_deduplicates_nor_range_checks(make_manager: MakeManager) -> None:
    manager = make_manager(*LONG, local_worker_num=2)
    assert manager.start_worker_list([0]) == 0
    first = manager.proc_rank_map[0].pid
    assert manager.start_worker_list([0]) == 0
    second = manager.proc_rank_map[0].pid
    assert first != second
    assert psutil.Process(first).is_running() and psutil.Process(second).is_running()
    assert manager.monitor_rank_status([0])[0]["pid"] == second  # only the newest copy is visible
    assert [p.pid for p in manager.cgn_processes] == [first, second]

    with pytest.raises(KeyError) as excinfo:
        manager.start_worker_list([5])  # out of range: a stray worker, then KeyError
    assert excinfo.value.args == (5,)
    stray = manager.cgn_processes[-1]
    env = _environ(stray.pid)
    assert (env["RANK_ID"], env["DEVICE_ID"]) == ("5", "5")
    assert (manager.log_dir / "worker_5.log").exists()
    assert set(manager.monitor_rank_status([-1])) == {0, 1}

    for not_a_list in ((1,), 1, {1}):
        with pytest.raises(TypeError, match="must be a list"):
            manager.start_worker_list(not_a_list)  # type: ignore[arg-type]
    assert len(manager.cgn_processes) == 3  # nothing spawned

    assert manager.kill_workers([-1]) == 0  # the only callback that removes strays
    for pid in (first, second, stray.pid):
        _wait_exit(pid)
        assert _gone(pid)


# ---------------------------------------------------------------------------- START_ALL_WORKER


def test_start_all_workers_kills_the_previous_workers_first(
    make_manager: MakeManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = make_manager(*LONG, local_worker_num=2)
    kills: list[int] = []
    kill_all = manager.kill_all_workers

    def counting_kill_all() -> None:
        kills.append(len(manager.cgn_processes))
        kill_all()

    monkeypatch.setattr(manager, "kill_all_workers", counting_kill_all)
    assert manager.start_all_workers() == 0
    assert kills == []
    old = _pids(manager)

    assert manager.start_all_workers() == 0
    assert kills == [2]
    new = _pids(manager)
    assert set(old.values()).isdisjoint(new.values())
    for pid in old.values():
        _wait_exit(pid)
        assert _gone(pid)
    assert _statuses(manager) == {0: None, 1: None}

    # After KILL_WORKER([-1]) the list is empty: no second kill; stale 300s until the restart.
    manager.kill_workers([-1])
    assert kills == [2, 2]
    for pid in new.values():
        _wait_exit(pid)
    assert _statuses(manager) == {0: 300, 1: 300}
    assert manager.start_all_workers() == 0
    assert kills == [2, 2]

    # Workers that already exited still count as "started": START_ALL_WORKER kills (tries to) first.
    done = make_manager("--steps", "0", local_worker_num=1)
    done.start_all_workers()
    _wait_exit(_pids(done)[0])
    done_kills: list[int] = []

    def counting_done_kill_all() -> None:
        done_kills.append(len(done.cgn_processes))
        ProcessManager.kill_all_workers(done)

    monkeypatch.setattr(done, "kill_all_workers", counting_done_kill_all)
    done.start_all_workers()
    assert done_kills == [1]


# ---------------------------------------------------------------------------- scheduler, env, logs


def test_scheduler_runs_the_script_as_ms_sched_and_its_env_leaks(
    make_manager: MakeManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MSRUN_TEST_SCHED_S", "0")
    manager = make_manager(local_worker_num=2)
    scheduler = manager.start_scheduler()
    assert scheduler.wait(timeout=10) == 0
    text = (manager.log_dir / "scheduler.log").read_text()
    assert f"scheduler pid={scheduler.pid} MS_ROLE=MS_SCHED RANK_ID=0" in text
    leaked = {k: os.environ.get(k) for k in ("MS_ROLE", "RANK_ID", "MS_WORKER_NUM", "MS_SCHED_HOST", "MS_SCHED_PORT")}
    assert leaked == {
        "MS_ROLE": "MS_SCHED",
        "RANK_ID": "0",
        "MS_WORKER_NUM": "2",
        "MS_SCHED_HOST": "127.0.0.1",
        "MS_SCHED_PORT": "8118",
    }
    assert "DEVICE_ID" not in os.environ and "MS_NODE_ID" not in os.environ
    assert manager.cgn_processes == []  # the scheduler is no worker

    manager.start_all_workers()
    worker_env = {k: os.environ.get(k) for k in ("DEVICE_ID", "RANK_ID", "MS_NODE_ID", "MS_ROLE")}
    assert worker_env == {"DEVICE_ID": "1", "RANK_ID": "1", "MS_NODE_ID": "1", "MS_ROLE": "MS_WORKER"}

    # A real-like scheduler stays up; no callback touches it; cleanup() does.
    monkeypatch.delenv("MSRUN_TEST_SCHED_S")
    lasting = make_manager(*LONG, local_worker_num=1)
    sched = lasting.start_scheduler()
    lasting.start_all_workers()
    lasting.kill_workers([-1])
    assert sched.poll() is None
    lasting.cleanup()
    assert sched.returncode == -signal.SIGKILL


def test_logs_are_truncated_on_restart(make_manager: MakeManager) -> None:
    manager = make_manager("--steps", "1", "--step-time", "0", "--fail-rank", "0", local_worker_num=1)
    manager.start_all_workers()
    first = _pids(manager)[0]
    _wait_exit(first)
    log_file = manager.log_dir / "worker_0.log"
    text = log_file.read_text()
    assert f"pid={first}" in text and "failing on first attempt" in text

    manager.start_worker_list([0])
    second = _pids(manager)[0]
    _wait_exit(second)
    text = log_file.read_text()
    assert f"pid={second}" in text and "step 1/1" in text
    assert f"pid={first}" not in text and "failing" not in text
    assert _statuses(manager) == {0: 0}


def test_cleanup_leaves_no_process(make_manager: MakeManager) -> None:
    manager = make_manager(*LONG, local_worker_num=2, join=True)
    manager.start_scheduler()
    manager.start_all_workers()
    manager.start_worker_list([0])  # a duplicate
    with pytest.raises(KeyError):
        manager.start_worker_list([3])  # a stray
    manager.kill_workers([manager.proc_rank_map[1].pid])
    started = {p.pid for p in manager.cgn_processes}
    started |= {t.pid for t in manager.tail_cgn_processes if t is not None}
    started |= {p.pid for p in manager.proc_rank_map.values()}
    assert manager.msn_process is not None
    started.add(manager.msn_process.pid)
    assert len(started) == 1 + 4 + 3  # scheduler, 4 workers, 3 tails still up (one killed)

    manager.cleanup()
    manager.cleanup()  # idempotent
    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    assert started.isdisjoint(mine)
    assert _statuses(manager) == {0: 300, 1: 300}


def test_register_and_run_call_the_plugin_like_msrun(make_manager: MakeManager) -> None:
    class Recorder:
        def __init__(self, outcome: BaseException | None) -> None:
            self.names: list[str] = []
            self.funcs: dict[str, Callable[..., Any]] = {}
            self.env: dict[str, str | None] = {}
            self.outcome = outcome
            self.scheduler_running = False

        def register_callbacks(self, name: str, func: Callable[..., Any]) -> None:
            self.names.append(name)
            self.funcs[name] = func

        def start(self) -> str:
            keys = ("MS_ENABLE_RECOVERY", "RANK_SIZE", "MS_ROLE", "RANK_ID", "DEVICE_ID", "MS_WORKER_NUM")
            self.env = {k: os.environ.get(k) for k in keys}
            manager = self.funcs["MONITOR"].__self__  # type: ignore[attr-defined]
            self.scheduler_running = manager.msn_process is not None and manager.msn_process.poll() is None
            if self.outcome is not None:
                raise self.outcome
            return "ignored"

    outcomes: list[tuple[BaseException | None, int]] = [
        (None, 0),
        (RuntimeError("boom"), 1),
        (SystemExit(5), 5),
        (SystemExit(None), 0),
    ]
    for outcome, expected in outcomes:
        manager = make_manager(local_worker_num=2)
        plugin = Recorder(outcome)
        manager.register_with_plugin(plugin)
        assert plugin.names == list(CALLBACK_ORDER)
        assert plugin.funcs["KILL_WORKER"] == manager.kill_workers
        assert os.environ["MS_ENABLE_RECOVERY"] == "1"
        assert manager.run_to_exit_status(plugin) == expected
        assert plugin.names == list(CALLBACK_ORDER)  # not registered twice
        assert plugin.scheduler_running
        assert plugin.env == {
            "MS_ENABLE_RECOVERY": "1",
            "RANK_SIZE": "2",
            "MS_ROLE": "MS_SCHED",
            "RANK_ID": "0",
            "DEVICE_ID": None,
            "MS_WORKER_NUM": "2",
        }
        assert manager.cgn_processes == []  # msrun starts no worker in mindx mode
        assert manager.msn_process is not None and manager.msn_process.poll() is None  # orphaned
        manager.cleanup()

    other_node = make_manager(local_worker_num=2, worker_num=4, node_rank=1)
    other_node.run_to_exit_status(Recorder(None))
    assert other_node.msn_process is None  # the scheduler runs on the master node only


def test_tft_switch_is_a_plain_substring_test() -> None:
    for value in ("{TTP:1}", "{RSC:1}", "TTP:1,UCE:1", " {ARF:1} ", "{HCCE:1}", "TSP:1"):
        assert tft_enabled(value), value
    for value in ("", "{TTP: 1}", "TRE:1", "ATO:1", "{TTP:0}"):
        assert not tft_enabled(value), value


# ---------------------------------------------------------------------------- fake_msrun


_STUB_PLUGIN = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path

    import psutil


    class MSRunPlugin:
        def __init__(self):
            self.names, self.funcs = [], {}

        def register_callbacks(self, name, func):
            self.names.append(name)
            self.funcs[name] = func

        def start(self):
            keys = ("MS_ENABLE_RECOVERY", "RANK_SIZE", "MS_ROLE", "RANK_ID", "DEVICE_ID")
            env = {k: os.environ.get(k) for k in keys}
            first = self.funcs["START_ALL_WORKER"]()
            deadline = time.monotonic() + 30
            while True:
                status = self.funcs["MONITOR"]([-1])
                if all(v["status"] is not None for v in status.values()) or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            self.funcs["KILL_WORKER"]([-1])
            sched_log = Path(os.environ["STUB_SCHED_LOG"])  # killed only once it has said who it is:
            while not (sched_log.exists() and sched_log.stat().st_size) and time.monotonic() < deadline:
                time.sleep(0.02)  # on a loaded machine the workers can be done before it started
            children = psutil.Process().children()  # what is left: the scheduler
            for child in children:
                child.kill()
            psutil.wait_procs(children, timeout=5)
            record = {"names": self.names, "env": env, "first": first, "status": status}
            Path(os.environ["STUB_RECORD"]).write_text(json.dumps(record))
            outcome = os.environ.get("STUB_OUTCOME", "return")
            if outcome == "raise":
                raise RuntimeError("stub plugin failed")
            if outcome == "exit":
                sys.exit(7)
            return 42
    """
)


def _write_taskd(root: Path, *, plugin: bool = True, agent: str | None = None) -> Path:
    """A stand-in ``taskd`` package under ``root``: the stub plugin and optionally an agent module."""
    package = root / "taskd"
    ms_mgr = package / "python" / "framework" / "agent" / "ms_mgr"
    ms_mgr.mkdir(parents=True)
    for folder in (package, package / "python", package / "python" / "framework", ms_mgr.parent, ms_mgr):
        (folder / "__init__.py").write_text("")
    if plugin:
        (ms_mgr / "msrun_plugin.py").write_text(_STUB_PLUGIN)
    if agent is not None:
        (package / "api").mkdir()
        (package / "api" / "__init__.py").write_text("")
        (package / "api" / "taskd_agent_api.py").write_text(agent)
    return root


def _fake_msrun(tmp_path: Path, pkgs: Path, *worker_args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED)}
    clean.update(env)
    clean["PYTHONPATH"] = os.pathsep.join([str(pkgs), str(ROOT)])
    clean["STUB_RECORD"] = str(tmp_path / "record.json")
    clean["STUB_SCHED_LOG"] = str(tmp_path / "logs" / "scheduler.log")
    command = [sys.executable, "-P", "-m", "tests.msrun_port.fake_msrun", "--worker_num", "2"]
    command += ["--local_worker_num", "2", "--log_dir", str(tmp_path / "logs"), "--master_port", "8118"]
    command += [str(TRIVIAL_WORKER), *worker_args]
    return subprocess.run(command, cwd=ROOT, env=clean, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("outcome", "exit_status"), [("return", 0), ("raise", 1), ("exit", 7)])
def test_fake_msrun_hands_the_workers_to_the_plugin(tmp_path: Path, outcome: str, exit_status: int) -> None:
    # The agent module exists but declines (init returns False): msrun falls back to MSRunPlugin.
    agent = "def init_taskd_agent(config, cls=None):\n    return False\n"
    agent += "def register_func(operator, func):\n    raise AssertionError\n"
    agent += "def start_taskd_agent():\n    raise AssertionError\n"
    pkgs = _write_taskd(tmp_path / "pkgs", agent=agent)
    result = _fake_msrun(tmp_path, pkgs, *SHORT, MS_ENABLE_TFT="{TTP:1}", STUB_OUTCOME=outcome)
    assert result.returncode == exit_status, result.stderr
    assert "Mindx enabled, process controlled by mindx." in result.stderr
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["names"] == list(CALLBACK_ORDER)
    assert record["env"] == {
        "MS_ENABLE_RECOVERY": "1",
        "RANK_SIZE": "2",
        "MS_ROLE": "MS_SCHED",
        "RANK_ID": "0",
        "DEVICE_ID": None,
    }
    assert record["first"] == 0
    assert {rank: st["status"] for rank, st in record["status"].items()} == {"0": 0, "1": 0}
    assert "MS_ROLE=MS_SCHED" in (tmp_path / "logs" / "scheduler.log").read_text()


def test_fake_msrun_plain_mode_when_the_switch_is_off(tmp_path: Path) -> None:
    pkgs = _write_taskd(tmp_path / "pkgs")
    result = _fake_msrun(tmp_path, pkgs, "--steps", "1", "--step-time", "0", MS_ENABLE_TFT="{TTP: 1}")
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "record.json").exists()  # the plugin was never used
    assert "step 1/1" in (tmp_path / "logs" / "worker_1.log").read_text()


def test_fake_msrun_falls_back_to_plain_mode_when_the_plugin_does_not_import(tmp_path: Path) -> None:
    pkgs = _write_taskd(tmp_path / "pkgs", plugin=False)
    result = _fake_msrun(tmp_path, pkgs, "--steps", "0", "--fail-rank", "1", MS_ENABLE_TFT="{ARF:1}")
    assert result.returncode == 1  # plain mode: a failed worker fails the job
    assert "Import mindx failed" in result.stderr
    assert "process controlled by msrun" in result.stderr
    assert "Distributed job exited with exception" in result.stderr


def test_fake_msrun_dies_when_the_agent_module_raises_a_non_import_error(tmp_path: Path) -> None:
    pkgs = _write_taskd(tmp_path / "pkgs", agent="raise OSError('libtaskd.so: cannot open shared object')\n")
    result = _fake_msrun(tmp_path, pkgs, "--steps", "0", MS_ENABLE_TFT="{TTP:1}")
    assert result.returncode == 1
    assert "OSError: libtaskd.so" in result.stderr
    assert not (tmp_path / "logs" / "scheduler.log").exists()  # died before starting anything
    assert not (tmp_path / "record.json").exists()
