"""recoverctl's new views without etcd: the watch and follow loops against a scripted store (what
they read, when they show, how a resync and a repeated event are handled), and the pure parts
(jobs rows, the timeline's --recovery rule, the plot's bars, the completion script run by bash)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from recoverd.cli import completion, plot
from recoverd.cli.ctl import build_parser
from recoverd.cli.follow import follow_events
from recoverd.cli.reads import UnknownJob
from recoverd.cli.render import format_jobs, job_row, status_dict
from recoverd.cli.timeline import timeline_dict, unavailable
from recoverd.cli.watchview import frame, watch_status
from recoverd.jobview import JobView
from recoverd.keys import Keyspace, RunRef
from recoverd.records import encode, pb, ts_from_s
from recoverd.store import KV, Resync, Snapshot, WatchEvent

KEYS = Keyspace("/t/v1")
JOB = "j"
RUN = RunRef(JOB, "run-1")


class ScriptedStore:
    """The two Store calls the loops make: ``get_prefix`` answers from ``kvs`` (and counts), and
    ``watch_prefix`` yields what the test puts in ``feed``."""

    def __init__(self) -> None:
        self.kvs: dict[str, KV] = {}
        self.revision = 0
        self.reads = 0
        self.watched_from: list[int] = []
        self.feed: asyncio.Queue[WatchEvent | Resync] = asyncio.Queue()

    def put(self, key: str, value: bytes) -> WatchEvent:
        """Store a value at the next revision (as etcd would) and return its watch event."""
        self.revision += 1
        self.kvs[key] = KV(key, value, self.revision, self.revision, 0)
        return WatchEvent(key, value, self.revision, False)

    def delete(self, key: str) -> WatchEvent:
        self.revision += 1
        self.kvs.pop(key, None)
        return WatchEvent(key, b"", self.revision, True)

    async def get_prefix(self, prefix: str) -> Snapshot:
        self.reads += 1
        return Snapshot(self.revision, [kv for k, kv in sorted(self.kvs.items()) if k.startswith(prefix)])

    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[WatchEvent | Resync]:
        self.watched_from.append(start_revision)
        while True:
            yield await self.feed.get()


def _spec() -> bytes:
    return encode(pb.JobSpec(name=JOB, uid=RUN.uid, world_size=2, nnodes=1, nproc_per_node=2))


def _ranks(*states: int) -> bytes:
    return encode(
        pb.NodeRanks(
            node="n0", ranks=[pb.RankStatus(rank=r, node="n0", pid=100 + r, state=s) for r, s in enumerate(states)]
        )
    )


def _recovery(rid: int, phase: int) -> bytes:
    return encode(pb.Recovery(epoch=rid, recovery_id=rid, phase=phase, uuid="u"))


def _event(n: int, reason: str) -> tuple[str, bytes]:
    return KEYS.event(RUN, f"{n:020d}-t-1-{n}"), encode(pb.Event(at=ts_from_s(1000 + n), source="t", reason=reason))


async def _next(queue: asyncio.Queue[Any]) -> Any:
    return await asyncio.wait_for(queue.get(), timeout=5)


def _job_store() -> ScriptedStore:
    store = ScriptedStore()
    store.put(KEYS.job_spec(JOB), _spec())
    store.put(KEYS.ranks(RUN, "n0"), _ranks(pb.RANK_RUNNING, pb.RANK_RUNNING))
    return store


# ---------------------------------------------------------------------------- status --watch


async def test_watch_reads_once_then_shows_each_watch_response_as_one_update() -> None:
    store = _job_store()
    shown: asyncio.Queue[JobView] = asyncio.Queue()
    task = asyncio.create_task(watch_status(store, KEYS, JOB, shown.put_nowait))  # type: ignore[arg-type]
    first = await _next(shown)
    assert first.recovery is None and store.reads == 1
    assert store.watched_from == [store.revision + 1]  # from right after the read: nothing missed

    # One transaction's keys arrive together: one update, never half of it.
    store.feed.put_nowait(store.put(KEYS.recovery(RUN), _recovery(1, pb.PHASE_STOPPING)))
    store.feed.put_nowait(store.put(KEYS.ranks(RUN, "n0"), _ranks(pb.RANK_FAILED, pb.RANK_RUNNING)))
    update = await _next(shown)
    assert update.recovery is not None and update.recovery.phase == pb.PHASE_STOPPING
    assert [r.state for r in update.ranks["n0"].ranks] == [pb.RANK_FAILED, pb.RANK_RUNNING]
    assert update.revision == store.revision
    assert shown.empty()

    store.feed.put_nowait(store.put(KEYS.recovery(RUN), _recovery(1, pb.PHASE_DONE)))
    assert (await _next(shown)).recovery.phase == pb.PHASE_DONE
    assert store.reads == 1  # every update came from the watch, none from a re-read
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_watch_rereads_after_a_resync_and_skips_what_the_reread_already_has() -> None:
    store = _job_store()
    shown: asyncio.Queue[JobView] = asyncio.Queue()
    task = asyncio.create_task(watch_status(store, KEYS, JOB, shown.put_nowait))  # type: ignore[arg-type]
    await _next(shown)
    # Written while the watch was away: only the re-read sees it.
    old = store.put(KEYS.recovery(RUN), _recovery(1, pb.PHASE_DECIDING))
    store.put(KEYS.recovery(RUN), _recovery(1, pb.PHASE_RECOVERING))
    store.feed.put_nowait(Resync("reconnected"))
    store.feed.put_nowait(old)  # the resumed watch repeats an older revision: not applied over the re-read
    update = await _next(shown)
    assert store.reads == 2
    assert update.recovery is not None and update.recovery.phase == pb.PHASE_RECOVERING
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_watch_returns_after_showing_the_ended_job() -> None:
    store = _job_store()
    shown: list[JobView] = []
    task = asyncio.create_task(watch_status(store, KEYS, JOB, shown.append))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    store.feed.put_nowait(store.put(KEYS.status(RUN), encode(pb.JobStatus(uid=RUN.uid, state=pb.JOB_FAILED))))
    final = await asyncio.wait_for(task, timeout=5)
    assert final.status is not None and final.status.state == pb.JOB_FAILED
    assert shown[-1] is final and len(shown) == 2

    # A job that has already ended: one update, and no watch at all.
    ended = await watch_status(store, KEYS, JOB, shown.append)  # type: ignore[arg-type]
    assert ended.status is not None and len(store.watched_from) == 1


async def test_watch_of_an_unknown_job_or_a_watch_failure_raises() -> None:
    with pytest.raises(UnknownJob, match="no job named 'j'"):
        await watch_status(ScriptedStore(), KEYS, JOB, lambda view: None)  # type: ignore[arg-type]

    class Broken(ScriptedStore):
        async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[WatchEvent | Resync]:
            raise RuntimeError("watch lost for good")
            yield  # an async generator

    with pytest.raises(RuntimeError, match="watch lost for good"):
        store = Broken()
        store.put(KEYS.job_spec(JOB), _spec())
        await asyncio.wait_for(watch_status(store, KEYS, JOB, lambda view: None), timeout=5)  # type: ignore[arg-type]


def test_watch_frames() -> None:
    data = {"job": JOB, "run": "r", "revision": 7, "world_size": 1, "nnodes": 1, "strategies": ["exit"]}
    data |= {"state": "RUNNING", "reason": "", "isolated": [], "warm_spares": {}, "spares": [], "recovery": None}
    data["ranks"] = []
    assert frame(data, as_json=True, is_tty=True, ended=False).startswith('{"job":"j","run":"r","revision":7')
    assert "\n" not in frame(data, as_json=True, is_tty=False, ended=False)
    assert frame(data, as_json=False, is_tty=False, ended=False).startswith(
        "--- revision 7\njob j  run r  state RUNNING"
    )
    tty = frame(data, as_json=False, is_tty=True, ended=True)
    assert tty.startswith("\x1b[H\x1b[2Jjob j") and tty.endswith("(revision 7; the job has ended)")


# ---------------------------------------------------------------------------- events --follow


async def test_follow_shows_stored_events_then_new_ones_each_once() -> None:
    store = ScriptedStore()
    for n, reason in ((1, "job_created"), (2, "fault_detected")):
        store.put(*_event(n, reason))
    store.put(KEYS.event(RUN, "bad"), b"not json")  # shown as nothing, never a crash
    shown: asyncio.Queue[pb.Event] = asyncio.Queue()
    task = asyncio.create_task(follow_events(store, KEYS, RUN, shown.put_nowait))  # type: ignore[arg-type]
    assert [(await _next(shown)).reason for _ in range(2)] == ["job_created", "fault_detected"]
    assert store.watched_from == [store.revision + 1]

    new = store.put(*_event(3, "recovery_opened"))
    store.feed.put_nowait(new)
    assert (await _next(shown)).reason == "recovery_opened"
    # The cap deletes the oldest; a resync re-reads: only what the watch missed is shown, once.
    store.feed.put_nowait(store.delete(_event(1, "")[0]))
    store.put(*_event(4, "recovery_done"))  # missed by the watch
    store.feed.put_nowait(Resync("compacted"))
    store.feed.put_nowait(new)  # repeated by the resumed watch
    store.feed.put_nowait(store.put(*_event(5, "job_succeeded")))
    assert [(await _next(shown)).reason for _ in range(2)] == ["recovery_done", "job_succeeded"]
    await asyncio.sleep(0.05)
    assert shown.empty() and store.reads == 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# ---------------------------------------------------------------------------- jobs, timeline, plot


def test_job_rows_count_running_ranks_on_live_nodes_and_list_bad_specs() -> None:
    spec = pb.JobSpec(name=JOB, uid="u1", world_size=3, nnodes=2, nproc_per_node=2)
    view = JobView(5, spec=spec, run=RunRef(JOB, "u1"))
    view.nodes["n0"] = pb.NodeRecord(node="n0")
    view.ranks["n0"] = pb.NodeRanks(node="n0", ranks=[pb.RankStatus(rank=0, state=pb.RANK_RUNNING)])
    view.ranks["n1"] = pb.NodeRanks(node="n1", ranks=[pb.RankStatus(rank=2, state=pb.RANK_RUNNING)])  # node lost
    view.recovery = pb.Recovery(recovery_id=2, epoch=3, phase=pb.PHASE_DECIDING)
    row = job_row(JOB, view)
    assert (row["ranks_running"], row["world_size"], row["nodes"], row["nnodes"]) == (1, 3, ["n0"], 2)
    assert row["recovery"] == {"id": 2, "epoch": 3, "phase": "DECIDING", "strategy": ""}
    bad = job_row("b", JobView(5, spec_error="job spec world size 0 is out of range"))
    assert (bad["state"], bad["error"]) == ("BAD_SPEC", "job spec world size 0 is out of range")
    assert job_row("c", JobView(5))["state"] == "NO_SPEC"
    text = format_jobs([row, bad], "/t/v1").splitlines()
    assert text[0].split() == ["JOB", "STATE", "RANKS", "NODES", "RECOVERY"]
    assert text[1].split() == [JOB, "RUNNING", "1/3", "1/2", "2", "DECIDING", "-", "(epoch", "3)"]
    assert text[2].split()[:4] == ["b", "BAD_SPEC", "0/0", "0/0"]
    assert format_jobs([], "/t/v1") == "no jobs under /t/v1"


def test_an_earlier_timeline_comes_from_its_outcome_in_the_history() -> None:
    view = JobView(1)
    entry = pb.PhaseEntry(phase=pb.PHASE_COLLECTING)
    entry.at.FromSeconds(101)
    done = pb.PhaseEntry(phase=pb.PHASE_DONE)
    done.at.FromSeconds(102)
    outcome = pb.RecoveryOutcome(recovery_id=2, strategy="exit", ranks=[3], phase_log=[entry, done])
    outcome.detected_at.FromSeconds(100)
    view.recovery = pb.Recovery(recovery_id=3)
    view.history = pb.History(outcomes=[pb.RecoveryOutcome(recovery_id=2, strategy="recover-in-place"), outcome])
    assert unavailable(view, 2) is None
    data = timeline_dict(view, (), 2)
    assert data is not None and (data["recovery"], data["strategy"], data["fault_ranks"]) == (2, "exit", [3])
    assert [(p["phase"], p["at_ms"]) for p in data["phases"]] == [
        ("DETECTED", 0.0),
        ("COLLECTING", 1000.0),
        ("DONE", 2000.0),
    ]


def test_timeline_is_kept_for_the_last_recovery_only() -> None:
    view = JobView(1)
    assert unavailable(view, None) is None
    assert unavailable(view, 1) == "no recovery 1: the job has had no recovery so far"
    view.recovery = pb.Recovery(recovery_id=3)
    assert unavailable(view, None) is None and unavailable(view, 3) is None
    assert unavailable(view, 4) == "no recovery 4: the job's recoveries are 1 to 3"
    assert unavailable(view, 0) == "no recovery 0: the job's recoveries are 1 to 3"
    why = unavailable(view, 2)
    assert why is not None and why.startswith("recovery 2's phase log is not kept: its outcomes left the history")


def test_plot_bars_follow_the_phases() -> None:
    timeline = {
        "phases": [
            {"phase": "DETECTED", "epoch": 1, "at_ms": 0.0, "duration_ms": 2.0},
            {"phase": "COLLECTING", "epoch": 1, "at_ms": 2.0, "duration_ms": 50.5},
            {"phase": "GLOBAL_FAULT", "epoch": 1, "at_ms": 52.5, "duration_ms": 0.0},
            {"phase": "DONE", "epoch": 1, "at_ms": 52.5, "duration_ms": None},
        ]
    }
    assert plot.bars(timeline) == [
        plot.Bar("DETECTED (epoch 1)", 0.0, 2.0, "2.0 ms"),
        plot.Bar("COLLECTING (epoch 1)", 2.0, 50.5, "50.5 ms"),
        plot.Bar("GLOBAL_FAULT (epoch 1)", 52.5, 0.0, "0.0 ms"),
        plot.Bar("DONE (epoch 1)", 52.5, 0.0, "end"),
    ]
    timeline["phases"][-1]["phase"] = "DECIDING"  # a recovery in progress
    assert plot.bars(timeline)[-1].text == "now"


# ---------------------------------------------------------------------------- completion


def _complete(script: str, tmp_path: Path, words: list[str], fn: str = "_recoverctl") -> list[str]:
    path = tmp_path / "completion.bash"
    path.write_text(script)
    line = " ".join(f"'{w}'" for w in words)
    probe = f'source {path}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; {fn}; printf "%s\\n" "${{COMPREPLY[@]}}"'
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=10, check=True).stdout
    return [w for w in out.splitlines() if w]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completion_follows_the_parser(tmp_path: Path) -> None:
    script = completion.script(build_parser(), "recoverctl", "bash")
    assert subprocess.run(["bash", "-n"], input=script, text=True, timeout=10).returncode == 0
    top = _complete(script, tmp_path, ["recoverctl", ""])
    assert {"jobs", "status", "events", "timeline", "completion", "policy", "auth"} <= set(top)
    assert _complete(script, tmp_path, ["recoverctl", "--etcd", "h:1", "st"]) == ["status", "stacks"]
    assert set(_complete(script, tmp_path, ["recoverctl", "status", "j", "--"])) == {"--help", "--json", "--watch"}
    assert "--follow" in _complete(script, tmp_path, ["recoverctl", "events", "j", "--f"])
    assert _complete(script, tmp_path, ["recoverctl", "policy", ""]) == ["show", "set"]
    assert _complete(script, tmp_path, ["recoverctl", "completion", ""]) == ["bash", "zsh"]
    (tmp_path / "plot-here.png").write_text("")
    assert _complete(script, tmp_path, ["recoverctl", "timeline", "j", "--plot", f"{tmp_path}/plot-"]) == [
        f"{tmp_path}/plot-here.png"
    ]
    zsh = completion.script(build_parser(), "recoverctl", "zsh")
    assert "bashcompinit" in zsh and zsh.endswith(script)
    with pytest.raises(ValueError, match="no completion for shell 'fish'"):
        completion.script(build_parser(), "recoverctl", "fish")


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_recoverd_completion_offers_its_services_and_choices(tmp_path: Path) -> None:
    from recoverd.cli.main import build_parser as recoverd_parser

    script = completion.script(recoverd_parser(), "recoverd", "bash")
    assert {"run", "up", "coordinator", "agent", "completion"} <= set(
        _complete(script, tmp_path, ["recoverd", ""], "_recoverd")
    )
    assert _complete(script, tmp_path, ["recoverd", "agent", "--nvml", ""], "_recoverd") == ["auto", "on", "off"]


def test_completion_commands_need_no_etcd(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from recoverd.cli import ctl
    from recoverd.cli import main as recoverd_main

    monkeypatch.delenv("RECOVERD_ETCD", raising=False)
    with pytest.raises(SystemExit) as stop:
        ctl.main(["completion", "zsh"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("# recoverctl completion for zsh") and out.endswith(
        "complete -o filenames -F _recoverctl recoverctl\n"
    )
    recoverd_main.main(["completion", "bash"])
    assert capsys.readouterr().out.endswith("complete -o filenames -F _recoverd recoverd\n")
    help_text = build_parser().format_help()
    assert all(word in help_text for word in ("jobs", "completion", "status", "events", "timeline"))


def test_status_shows_a_held_node_s_ranks_held_and_a_lost_one_s_lost() -> None:
    """A node the coordinator holds after trouble in etcd (docs/adr/0045) is not lost: its ranks
    say HELD; a node gone for good says LOST."""
    view = JobView(revision=1)
    view.run = RUN
    view.spec = pb.JobSpec(name=JOB, uid=RUN.uid, world_size=2, nnodes=2, nproc_per_node=1)
    for rank, node in enumerate(("a", "b")):
        view.ranks[node] = pb.NodeRanks(node=node, ranks=[pb.RankStatus(rank=rank, node=node, state=pb.RANK_RUNNING)])
    view.recovery = pb.Recovery(phase=pb.PHASE_DONE, held_nodes=["a"])
    states = {r["node"]: r["state"] for r in status_dict(view)["ranks"]}
    assert states == {"a": "HELD", "b": "LOST"}
