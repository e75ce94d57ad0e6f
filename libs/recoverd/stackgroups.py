"""Where a hung rank is, from its Python stacks: one label per rank, ranks grouped by label.

Reads the two texts recoverd captures (docs/detectors.md, "Stacks of a hung rank"):

* py-spy's ``dump``::

      Thread 830 (idle): "MainThread"
          Condition.wait (threading.py:327)
          Event.wait (threading.py:629)

  (function names are qualified with their class on Python >= 3.11, innermost frame first);

* faulthandler's dump (``faulthandler.register(..., all_threads=True)``)::

      Current thread 0x00007f63229cab80 (most recent call first):
        File ".../threading.py", line 327 in wait
        File ".../threading.py", line 629 in wait

  (bare function names, no thread names). The main thread is the *last* block: CPython lists
  thread states newest first, and the main thread's is the oldest.

:func:`where` looks at the main thread only (the one a training step runs on) and names, in this
order of preference: a torch.distributed collective anywhere on the stack (``all_reduce``, also
from a polling loop such as ``work.is_completed()`` inside a collective wrapper), data loading (a
``DataLoader`` frame), the outermost frame of the standard-library call the rank blocks in
(``Event.wait``, ``Queue.get``, ``Thread.join``, ``select``), else the innermost frame's function.
A C call (``time.sleep``, a lock's ``acquire``, a native collective) has no Python frame of its own:
the rank shows in the Python function that called it.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "DATA_LOADING",
    "Frame",
    "Stack",
    "StackLike",
    "ThreadStack",
    "group",
    "label",
    "parse",
    "summary",
    "trim",
    "where",
]

#: The label of a rank waiting for its next batch.
DATA_LOADING = "data loading"
#: The label of a rank whose main thread has no Python frame.
NO_PYTHON_FRAME = "no Python frame"

_PYSPY_THREAD = re.compile(r'^Thread (0x[0-9A-Fa-f]+|\d+) \(([^)]*)\)(?:: "(.*)")?\s*$')
_PYSPY_FRAME = re.compile(r"^\s+(\S.*?) \((.*):(\d+)\)\s*$")
_PYSPY_PROCESS = re.compile(r"^Process (\d+):")
_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9A-Fa-f]+) \(most recent call first\):\s*$")
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?+) in (.*?)\s*$')

#: torch.distributed's collectives (and their gloo/ProcessGroup spellings) -> the name shown.
_COLLECTIVES = {
    "all_reduce": "all_reduce",
    "allreduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "broadcast": "broadcast",
    "broadcast_object_list": "broadcast",
    "barrier": "barrier",
    "monitored_barrier": "barrier",
    "store_based_barrier": "barrier",
    "all_gather": "all_gather",
    "allgather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_base": "all_gather",
    "all_gather_object": "all_gather",
    "all_gather_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "reduce": "reduce",
    "gather": "gather",
    "gather_object": "gather",
    "scatter": "scatter",
    "scatter_object_list": "scatter",
    "send": "send",
    "recv": "recv",
    "isend": "send",
    "irecv": "recv",
    "batch_isend_irecv": "send/recv",
}
#: Names that mean a collective only inside a torch.distributed file (elsewhere they are common words).
_GENERIC = {"reduce", "gather", "gather_object", "scatter", "scatter_object_list", "send", "recv", "isend", "irecv"}
#: Standard-library modules whose functions block: the outermost frame of such a run names the call.
_BLOCKING = {
    "threading.py",
    "queue.py",
    "selectors.py",
    "socket.py",
    "ssl.py",
    "subprocess.py",
    "connection.py",
    "queues.py",
    "synchronize.py",
    "_base.py",
    "thread.py",
}
#: faulthandler prints bare names: the class py-spy would show, for the common blocking calls.
_QUALIFIED = {
    ("threading.py", "join"): "Thread.join",
    ("threading.py", "_wait_for_tstate_lock"): "Thread.join",
    ("threading.py", "start"): "Thread.start",
    ("threading.py", "acquire"): "Semaphore.acquire",
    ("threading.py", "wait_for"): "Condition.wait_for",
    ("queue.py", "get"): "Queue.get",
    ("queue.py", "put"): "Queue.put",
    ("queue.py", "join"): "Queue.join",
    ("subprocess.py", "wait"): "Popen.wait",
    ("subprocess.py", "_wait"): "Popen.wait",
    ("subprocess.py", "communicate"): "Popen.communicate",
    ("socket.py", "readinto"): "SocketIO.readinto",
    ("socket.py", "accept"): "socket.accept",
    ("connection.py", "recv"): "Connection.recv",
    ("connection.py", "poll"): "Connection.poll",
    ("_base.py", "result"): "Future.result",
}


@dataclass(frozen=True, slots=True)
class Frame:
    function: str
    """As the tool printed it: ``Event.wait`` (py-spy, Python >= 3.11) or ``wait`` (faulthandler)."""
    file: str
    line: int

    @property
    def name(self) -> str:
        """The bare function name, without leading or trailing underscores (``allreduce_`` -> ``allreduce``)."""
        return self.function.rsplit(".", 1)[-1].strip("_")

    @property
    def basename(self) -> str:
        return self.file.replace("\\", "/").rsplit("/", 1)[-1]


@dataclass(frozen=True, slots=True)
class ThreadStack:
    header: str
    frames: tuple[Frame, ...]
    """Innermost first, as both tools print them."""
    lines: tuple[str, ...]
    """The block as printed (header first), for :func:`trim`."""
    name: str = ""
    ident: str = ""


@dataclass(frozen=True, slots=True)
class Stack:
    tool: str
    """``py-spy``, ``faulthandler`` or ``""`` when the text is neither."""
    preamble: tuple[str, ...]
    threads: tuple[ThreadStack, ...]
    main: int
    """Index of the main thread in ``threads``; -1 when there is none."""

    @property
    def main_thread(self) -> ThreadStack | None:
        return self.threads[self.main] if self.main >= 0 else None


class StackLike(Protocol):
    """What :func:`group` reads of a captured stack (``recoverd.v1.RankStack`` has it)."""

    @property
    def rank(self) -> int: ...

    @property
    def text(self) -> str: ...

    @property
    def error(self) -> str: ...

    @property
    def where(self) -> str: ...


def parse(text: str) -> Stack:
    """Split a py-spy or faulthandler dump into threads and frames; unknown lines are kept, not parsed."""
    lines = text.splitlines()
    tool = ""
    for line in lines:
        if _FH_THREAD.match(line):
            tool = "faulthandler"
            break
        if _PYSPY_THREAD.match(line):
            tool = "py-spy"
            break
    header_re = _PYSPY_THREAD if tool == "py-spy" else _FH_THREAD
    preamble: list[str] = []
    blocks: list[list[str]] = []
    for line in lines:
        if tool and header_re.match(line):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
        else:
            preamble.append(line)
    threads = [_thread(tool, block) for block in blocks]
    return Stack(tool, tuple(preamble), tuple(threads), _main_index(tool, preamble, threads))


def _thread(tool: str, block: list[str]) -> ThreadStack:
    while len(block) > 1 and not block[-1].strip():
        block = block[:-1]
    frames: list[Frame] = []
    name = ident = ""
    if tool == "py-spy":
        head = _PYSPY_THREAD.match(block[0])
        assert head is not None
        ident, name = head.group(1), head.group(3) or ""
        for line in block[1:]:
            if m := _PYSPY_FRAME.match(line):
                frames.append(Frame(m.group(1), m.group(2), int(m.group(3))))
    else:
        head = _FH_THREAD.match(block[0])
        assert head is not None
        ident, name = head.group(2), "Current thread" if head.group(1) == "Current thread" else ""
        for line in block[1:]:
            if m := _FH_FRAME.match(line):
                frames.append(Frame(m.group(3), m.group(1), int(m.group(2)) if m.group(2).isdigit() else 0))
    return ThreadStack(block[0], tuple(frames), tuple(block), name, ident)


def _main_index(tool: str, preamble: list[str], threads: list[ThreadStack]) -> int:
    if not threads:
        return -1
    if tool == "faulthandler":
        return len(threads) - 1  # the oldest thread state is listed last: the main thread's
    for i, thread in enumerate(threads):
        if thread.name == "MainThread":
            return i
    pid = next((m.group(1) for line in preamble if (m := _PYSPY_PROCESS.match(line))), None)
    for i, thread in enumerate(threads):
        if pid is not None and thread.ident == pid:  # py-spy prints the OS thread id: the main one's is the pid
            return i
    return 0


def where(text: str) -> str:
    """The label of where the dump's main thread is; ``""`` when the text is no stack dump."""
    main = parse(text).main_thread
    if main is None:
        return ""
    frames = main.frames
    if not frames:
        return NO_PYTHON_FRAME
    for frame in frames:  # innermost out: a polling loop (wait, is_completed) inside a collective
        if collective := _collective(frame):
            return collective
    if any(_is_data_loading(f) for f in frames):
        return DATA_LOADING
    if frames[0].basename in _BLOCKING:
        run = [frames[0]]
        for frame in frames[1:]:
            if frame.basename not in _BLOCKING:
                break
            run.append(frame)
        return _blocking_label(run)
    return frames[0].function


def _collective(frame: Frame) -> str:
    name = frame.name
    if name not in _COLLECTIVES:
        return ""
    if name in _GENERIC and "distributed" not in frame.file:
        return ""
    return _COLLECTIVES[name]


def _is_data_loading(frame: Frame) -> bool:
    return frame.basename == "dataloader.py" or "DataLoader" in frame.function


def _blocking_label(run: list[Frame]) -> str:
    """Name the call a run of standard-library frames (innermost first) makes, as py-spy would."""
    outer = run[-1]
    if outer.basename == "selectors.py" and outer.name == "select":
        return "select"
    if "." in outer.function:
        return outer.function  # py-spy's qualified name
    if outer.basename == "threading.py" and outer.function == "wait":
        names = [f.function for f in run]
        if "_wait" in names or "wait_for" in names:
            return "Barrier.wait"
        return "Event.wait" if names.count("wait") >= 2 else "Condition.wait"
    module = outer.basename.removesuffix(".py")
    return _QUALIFIED.get((outer.basename, outer.function), f"{module}.{outer.function}")


def label(stack: StackLike) -> str:
    """What :func:`group` groups by: where the rank is, or why there is no stack."""
    if stack.text:
        return stack.where or where(stack.text) or "unknown"
    return f"no stack: {stack.error or 'unknown reason'}"


def group(stacks: Iterable[StackLike]) -> list[tuple[str, list[int]]]:
    """Ranks grouped by :func:`label`: the largest group first (then by its first rank), ranks
    without a stack last."""
    by_label: dict[str, list[int]] = {}
    for stack in stacks:
        by_label.setdefault(label(stack), []).append(stack.rank)
    groups = [(name, sorted(ranks)) for name, ranks in by_label.items()]
    groups.sort(key=lambda g: (g[0].startswith("no stack: "), -len(g[1]), g[1][0], g[0]))
    return groups


def _ranks(ranks: Sequence[int]) -> str:
    """``0, 1, 3`` or ``0-7, 9``: runs of three or more as ranges."""
    parts: list[str] = []
    start = prev = ranks[0]
    for rank in [*ranks[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        if prev - start >= 2:
            parts.append(f"{start}-{prev}")
        else:
            parts.extend(str(r) for r in range(start, prev + 1))
        if rank is not None:
            start = prev = rank
    return ", ".join(parts)


def summary(stacks: Iterable[StackLike], max_chars: int = 1000) -> str:
    """One line: ``3 ranks in all_reduce (0, 1, 3); rank 2 in Event.wait; rank 4: no stack (...)``."""
    parts = []
    for name, ranks in group(stacks):
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"{len(ranks)} ranks"
        listed = f" ({_ranks(ranks)})" if len(ranks) > 1 else ""
        if name.startswith("no stack: "):
            parts.append(f"{who}{listed}: no stack ({name.removeprefix('no stack: ')})")
        else:
            parts.append(f"{who} in {name}{listed}")
    line = "; ".join(parts)
    return line if len(line) <= max_chars else line[: max_chars - 3] + "..."


def trim(text: str, max_bytes: int) -> str:
    """The dump cut to ``max_bytes`` (UTF-8) with a marker saying so; unchanged when it fits.

    The main thread's block is kept (cut at a line only if it alone is too long: its innermost
    frames, which :func:`where` reads, come first); the other threads are kept in their order as
    far as the rest of the budget goes, and the order of blocks is never changed, so the cut text
    still parses to the same main thread (faulthandler's is the last block). A text that is no
    dump is cut at a line.
    """
    raw = text.encode()
    if len(raw) <= max_bytes:
        return text
    marker = f"... [truncated: {len(raw)} bytes in all]"
    budget = max(0, max_bytes - len(marker.encode()) - 1)
    stack = parse(text)
    main = stack.main_thread
    if main is None:
        return _cut(text, budget) + "\n" + marker
    sep = "\n\n" if stack.tool == "faulthandler" else "\n"
    blocks = ["\n".join(t.lines) for t in stack.threads]
    head = "\n".join(stack.preamble) + "\n" if stack.preamble else ""
    left = budget - _size(head)
    blocks[stack.main] = _cut(blocks[stack.main], left)
    left -= _size(blocks[stack.main])
    kept = {stack.main}
    for i, block in enumerate(blocks):
        if i != stack.main and _size(block) + len(sep) <= left:
            kept.add(i)
            left -= _size(block) + len(sep)
    body = sep.join(block for i, block in enumerate(blocks) if i in kept)
    return _cut(head + body, budget) + "\n" + marker


def _size(text: str) -> int:
    return len(text.encode())


def _cut(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` (UTF-8), at the last whole line that fits if there is one."""
    raw = text.encode()
    if len(raw) <= max_bytes:
        return text
    keep = raw[: max(0, max_bytes)]
    line_end = keep.rfind(b"\n")
    if line_end > 0:
        keep = keep[:line_end]
    return keep.decode(errors="ignore")
