"""``recoverd.hangstacks``: the bounds on stored stacks and the ``hang_stacks`` event's round trip."""

from __future__ import annotations

from pathlib import Path

from recoverd import hangstacks
from recoverd.hangstacks import MAX_STACKS_BYTES, MAX_TEXT_BYTES, bounded, event_data, from_event, stored_size
from recoverd.records import decode, encode, pb

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"


def _big_dump(main_frames: int, other_threads: int) -> str:
    """A faulthandler-shaped dump: ``other_threads`` deep threads, then the main one (last)."""
    blocks = []
    for t in range(other_threads):
        frames = "\n".join(f'  File "/site/pkg/mod{i}.py", line {i} in helper_{t}_{i}' for i in range(40))
        blocks.append(f"Thread 0x{t + 2:016x} (most recent call first):\n{frames}")
    frames = "\n".join(
        ['  File "/site/torch/distributed/distributed_c10d.py", line 2501 in all_reduce']
        + [f'  File "/train/model.py", line {i} in layer_{i}' for i in range(main_frames)]
    )
    blocks.append(f"Current thread 0x0000000000000001 (most recent call first):\n{frames}")
    return "\n\n".join(blocks) + "\n"


def test_each_text_and_the_whole_are_bounded_and_the_hung_rank_kept_whole() -> None:
    dump = _big_dump(main_frames=20, other_threads=30)
    assert len(dump.encode()) > 3 * MAX_TEXT_BYTES
    stacks = [pb.RankStack(rank=r, pid=1000 + r, tool="faulthandler", text=dump) for r in range(16)]
    out = bounded(stacks, keep_rank=5)
    assert [s.rank for s in out] == list(range(16))
    assert stored_size(out) <= MAX_STACKS_BYTES
    assert all(len(s.text.encode()) <= MAX_TEXT_BYTES for s in out)
    hung = out[5]
    assert MAX_TEXT_BYTES // 2 < len(hung.text.encode()) <= MAX_TEXT_BYTES  # whole threads are kept or cut
    assert all(len(s.text) < len(hung.text) for s in out if s.rank != 5)
    assert all(s.where == "all_reduce" for s in out)  # filled in from the text, main thread kept
    assert all("[truncated:" in s.text for s in out)
    assert stacks[0].text == dump and not stacks[0].where  # the input is not changed


def test_small_stacks_pass_unchanged() -> None:
    text = (FIXTURES / "event_wait.py-spy.txt").read_text()
    stacks = [
        pb.RankStack(rank=0, pid=1, tool="py-spy", text=text, where="Event.wait"),
        pb.RankStack(rank=1, error="x"),
    ]
    assert bounded(stacks, keep_rank=0) == stacks


def test_errors_counts_and_absurd_bounds() -> None:
    long_error = pb.RankStack(rank=0, error="e" * 10_000)
    assert len(bounded([long_error])[0].error) == hangstacks.MAX_ERROR_CHARS
    many = [pb.RankStack(rank=r, where="w", text="Thread 1 (idle)\n    w (x.py:1)\n") for r in range(200)]
    kept = bounded(many, keep_rank=150)
    assert len(kept) == hangstacks.MAX_STACKS and kept[0].rank == 150
    tight = bounded([pb.RankStack(rank=r, text="x" * 5000) for r in range(4)], max_bytes=1000)
    assert stored_size(tight) <= 1000 and len(tight) < 4


def test_event_round_trip_and_size() -> None:
    dump = _big_dump(main_frames=20, other_threads=30)
    fault = pb.Fault(fault_id="node0.r2.hang.g0", rank=2, node="node0", kind="hang")
    stacks = bounded(
        [pb.RankStack(rank=r, pid=100 + r, tool="py-spy", text=dump) for r in range(8)]
        + [pb.RankStack(rank=8, pid=108, tool="faulthandler", error="process is stopped (SIGSTOP)")],
        keep_rank=2,
    )
    event = pb.Event(reason=hangstacks.REASON, message="m", rank=2, node="node0")
    event.data.update(event_data(fault, 7, stacks))
    raw = encode(event)
    assert len(raw) <= MAX_STACKS_BYTES + 2048  # the stacks dominate; the rest is a few lines
    back = from_event(decode(pb.Event, raw))
    assert back is not None
    assert (back.fault_id, back.recovery, back.kind) == ("node0.r2.hang.g0", 7, "hang")
    assert list(back.stacks) == stacks
    assert back.summary == "8 ranks in all_reduce (0-7); rank 8: no stack (process is stopped (SIGSTOP))"


def test_from_event_skips_what_it_cannot_read() -> None:
    assert from_event(pb.Event(reason="phase")) is None
    for bad in ("{", "{}", '[{"rank": "two"}]', "[1]", '"x"'):
        event = pb.Event(reason=hangstacks.REASON)
        event.data["stacks"] = bad
        assert from_event(event) is None, bad
    event = pb.Event(reason=hangstacks.REASON)
    event.data.update({"stacks": "[]", "recovery": "x"})
    assert from_event(event) is None
    empty = pb.Event(reason=hangstacks.REASON)
    read = from_event(empty)
    assert read is not None and read.stacks == () and read.recovery == 0


def test_from_event_fills_in_where_from_the_text() -> None:
    text = (FIXTURES / "thread_join.faulthandler.txt").read_text()
    event = pb.Event(reason=hangstacks.REASON)
    event.data.update(event_data(pb.Fault(rank=0), 1, [pb.RankStack(rank=0, text=text)]))
    read = from_event(event)
    assert read is not None and read.stacks[0].where == "Thread.join" and read.summary == "rank 0 in Thread.join"
