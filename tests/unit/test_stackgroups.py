"""``recoverd.stackgroups`` on real dumps (tests/fixtures/stacks, captured by its capture.py) and on edge cases."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from recoverd import stackgroups
from recoverd.stackgroups import group, parse, summary, trim, where

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"

#: Scenario (tests/fixtures/stacks/scenario.py) -> where its main thread blocks, for both tools.
EXPECTED = {
    "all_reduce": "all_reduce",
    "barrier": "barrier",
    "polling": "all_reduce",
    "data_loading": "data loading",
    "event_wait": "Event.wait",
    "queue_get": "Queue.get",
    "thread_join": "Thread.join",
    "select": "select",
    "sleep": "train_step",
}


def _fixture(name: str, tool: str) -> str:
    return (FIXTURES / f"{name}.{tool}.txt").read_text()


def test_every_fixture_has_an_expectation() -> None:
    names = {p.name.split(".")[0] for p in FIXTURES.glob("*.txt")}
    assert names == set(EXPECTED)


@pytest.mark.parametrize("tool", ["py-spy", "faulthandler"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_where_on_real_dumps(name: str, tool: str) -> None:
    assert where(_fixture(name, tool)) == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_both_tools_find_the_same_main_thread(name: str) -> None:
    spy, fh = parse(_fixture(name, "py-spy")), parse(_fixture(name, "faulthandler"))
    assert (spy.tool, fh.tool) == ("py-spy", "faulthandler")
    assert spy.main_thread is not None and fh.main_thread is not None
    assert spy.main_thread.name == "MainThread"
    assert fh.main_thread.name == "Current thread"  # the signal went to the main thread
    # The same frames, innermost first: py-spy's qualified names end with faulthandler's bare ones.
    spy_names = [f.function.rsplit(".", 1)[-1] for f in spy.main_thread.frames]
    assert spy_names == [f.function for f in fh.main_thread.frames]
    assert [f.line for f in spy.main_thread.frames] == [f.line for f in fh.main_thread.frames]


def test_faulthandler_main_thread_is_the_last_block() -> None:
    # A dump written from a signal delivered to another thread: "Current thread" is not the main one.
    text = (
        "Current thread 0x00007f0000000002 (most recent call first):\n"
        '  File "/x/worker.py", line 3 in spin\n'
        "\n"
        "Thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/usr/lib/python3.12/threading.py", line 355 in wait\n'
        '  File "/x/train.py", line 9 in step\n'
    )
    stack = parse(text)
    assert stack.main == 1
    assert where(text) == "Condition.wait"


def test_py_spy_main_thread_by_name_else_by_pid() -> None:
    named = 'Thread 11 (idle): "loader"\n    get (q.py:1)\nThread 10 (idle): "MainThread"\n    step (train.py:4)\n'
    assert where(named) == "step"
    unnamed = "Process 10: python t.py\n\nThread 11 (idle)\n    get (q.py:1)\nThread 10 (active)\n    step (t.py:4)\n"
    assert where(unnamed) == "step"


def test_collective_names_need_a_distributed_file_when_generic() -> None:
    user_reduce = 'Thread 1 (idle): "MainThread"\n    reduce (functools_user.py:3)\n    main (t.py:1)\n'
    assert where(user_reduce) == "reduce"
    dist_recv = 'Thread 1 (idle): "MainThread"\n    recv (torch/distributed/distributed_c10d.py:3)\n'
    assert where(dist_recv) == "recv"
    gloo_allgather = 'Thread 1 (idle): "MainThread"\n    Group.allgather (mygroup.py:3)\n'
    assert where(gloo_allgather) == "all_gather"


def test_data_loading_beats_the_wait_it_blocks_in() -> None:
    assert where(_fixture("data_loading", "py-spy")) == stackgroups.DATA_LOADING


def test_faulthandler_threading_waits_are_named_like_py_spy() -> None:
    def fh(*frames: tuple[str, str]) -> str:
        lines = [f'  File "/usr/lib/python3.11/{file}", line 1 in {func}' for file, func in frames]
        return "Thread 0x1 (most recent call first):\n" + "\n".join([*lines, '  File "/t.py", line 1 in main'])

    assert where(fh(("threading.py", "wait"))) == "Condition.wait"
    assert where(fh(("threading.py", "wait"), ("threading.py", "wait"))) == "Event.wait"
    assert where(fh(("threading.py", "wait"), ("threading.py", "wait_for"))) == "Condition.wait_for"
    barrier = fh(
        ("threading.py", "wait"), ("threading.py", "wait_for"), ("threading.py", "_wait"), ("threading.py", "wait")
    )
    assert where(barrier) == "Barrier.wait"
    assert where(fh(("threading.py", "wait"), ("queue.py", "get"))) == "Queue.get"
    assert where(fh(("subprocess.py", "_wait"), ("subprocess.py", "wait"))) == "Popen.wait"
    assert where(fh(("selectors.py", "select"))) == "select"
    assert where(fh(("socket.py", "recv_into_something"))) == "socket.recv_into_something"


def test_no_frames_and_no_dump() -> None:
    assert where("Current thread 0x1 (most recent call first):\n  <no Python frame>\n") == "no Python frame"
    assert where("") == ""
    assert where("Error: something else entirely\n") == ""
    assert parse("garbage").main_thread is None


@dataclass
class S:
    rank: int
    where: str = ""
    text: str = ""
    error: str = ""


def test_group_and_summary_put_the_biggest_group_first() -> None:
    stacks = [
        S(0, "all_reduce", "x"),
        S(1, "all_reduce", "x"),
        S(2, "Event.wait", "x"),
        S(3, "all_reduce", "x"),
        S(4, error="process is stopped (SIGSTOP); faulthandler cannot run"),
    ]
    assert group(stacks) == [
        ("all_reduce", [0, 1, 3]),
        ("Event.wait", [2]),
        ("no stack: process is stopped (SIGSTOP); faulthandler cannot run", [4]),
    ]
    assert summary(stacks) == (
        "3 ranks in all_reduce (0, 1, 3); rank 2 in Event.wait;"
        " rank 4: no stack (process is stopped (SIGSTOP); faulthandler cannot run)"
    )


def test_summary_writes_runs_as_ranges_and_stays_bounded() -> None:
    stacks = [S(r, "all_reduce", "x") for r in (*range(8), 9, 10, 12)] + [S(11, "", _fixture("sleep", "py-spy"))]
    assert summary(stacks) == "11 ranks in all_reduce (0-7, 9, 10, 12); rank 11 in train_step"
    many = [S(r, f"f{r}", "x") for r in range(500)]
    assert len(summary(many, max_chars=200)) == 200


def test_trim_keeps_the_main_thread_and_the_order_and_marks_the_cut() -> None:
    text = _fixture("event_wait", "faulthandler")
    assert trim(text, 1 << 20) == text  # fits: unchanged

    cut = trim(text, 700)  # room for the main thread (the last block), not for the other one
    assert len(cut.encode()) <= 700
    assert cut.startswith("Current thread ") and "loader_worker" not in cut
    assert cut.endswith(f"... [truncated: {len(text.encode())} bytes in all]")
    assert where(cut) == "Event.wait"

    tiny = trim(text, 250)  # not even the main thread fits: its innermost frames stay
    assert len(tiny.encode()) <= 250 and where(tiny) == "Condition.wait"

    spy = _fixture("data_loading", "py-spy")
    spy_cut = trim(spy, len(spy.encode()) - 10)
    assert spy_cut.startswith("Process ") and '"pin_memory"' not in spy_cut
    assert where(spy_cut) == "data loading"

    many = "Thread 0x2 (most recent call first):\n" + '  File "/w.py", line 1 in spin\n' * 50
    main = 'Thread 0x1 (most recent call first):\n  File "/t.py", line 9 in step\n'
    both = trim(many + "\n" + main, 400)
    assert where(both) == "step" and "spin" not in both

    assert trim("x" * 1000, 100).endswith("bytes in all]")
    assert len(trim("ü" * 1000, 100).encode()) <= 100
