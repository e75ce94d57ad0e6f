"""Hangs and stragglers: ranks that stop making progress, or make it slowly.

Progress arrives on the node's progress socket (``taskd_client.heartbeat``; the PyTorch trainer
sends it by itself) or, for scripts with no client, from log lines matching the job's
``hang.log_pattern``, or with no pattern from any new line of the rank's output (its cadence,
docs/adr/0042). :mod:`progress` judges it; this module is the I/O around that judgement:

* a rank silent past its timeout becomes a ``hang`` fault, once per incarnation, with the Python
  stacks of it and of its node's peers (py-spy, else the client's faulthandler) captured first,
  so ``recoverctl`` can say where it hung before the recovery stops it;
* a rank that turns into a straggler, or stops being one, is an event (``straggler``,
  ``straggler_cleared``), never a fault;
* nothing is written to etcd per step: only these changes.

While a recovery of the job is in progress nobody is judged (ranks stop and start on purpose), and
afterwards every rank gets its warm-up allowance again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from dataclasses import dataclass

from recoverd.agent.detectors.base import Detected, Detector, DetectorHost, FaultKind
from recoverd.agent.detectors.progress import Hang, HangRules, ProgressTracker, StragglerChange
from recoverd.agent.detectors.progress_socket import ProgressReport, ProgressSocket, address_for, sender_belongs
from recoverd.agent.ranktable import RankSlot
from recoverd.agent.settings import AgentSettings
from recoverd.agent.stacks import StackTarget, capture_stacks
from recoverd.records import pb

__all__ = ["HangDetector", "is_stopped"]

log = logging.getLogger(__name__)

#: Longest sleep between judgements: the judge otherwise wakes exactly at the earliest deadline.
JUDGE_AT_LEAST_EVERY_S = 0.5
#: How often log files are read for the pattern, and stragglers are judged.
SLOW_EVERY_S = 0.5
#: Longest log line matched (a longer one is cut: a regular expression over a long line can take
#: seconds).
_MAX_LINE = 4096
#: With no ``hang.log_pattern``, any line with something on it is output, and output is progress.
ANY_LINE = re.compile(r"\S")
#: The judge woke this much later than it asked: the agent itself stalled.
STALL_S = 1.0
DROPPED_NOTE_EVERY_S = 60.0
_CHUNK = 1024 * 1024


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, or traced): it cannot make progress whatever it said."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return bool(fields) and fields[0] in (b"T", b"t")


@dataclass(slots=True)
class _Reporter:
    """What a rank's reports said about the process that sends them (its Python process, which a
    wrapper such as ``bash -c`` may have started: the one py-spy must read)."""

    pid: int
    #: The signal its client armed faulthandler on, and its dump file; None: not armed.
    stack_signal: int | None = None
    stack_path: str | None = None


class HangDetector(Detector):
    name = "hang"

    @classmethod
    def wanted(cls, settings: AgentSettings) -> bool:
        return settings.hang_detection

    def __init__(self, host: DetectorHost, settings: AgentSettings) -> None:
        super().__init__(host, settings)
        self.tracker = ProgressTracker()
        self._policy: pb.HangPolicy | None = None
        self._pattern: re.Pattern[str] | None = None
        self._reporters: dict[int, _Reporter] = {}
        #: (rank, pid) -> offset of the rank's log file already read.
        self._log_offsets: dict[tuple[int, int], int] = {}
        self._warned: set[str] = set()
        self.socket: ProgressSocket | None = None
        self._captures: set[asyncio.Task[None]] = set()
        self._dropped_noted_at = float("-inf")

    # ------------------------------------------------------------ the agent's hooks
    def rank_started(self, slot: RankSlot) -> None:
        if slot.proc is None:
            return
        self.tracker.started(slot.rank, slot.proc.pid, time.monotonic())
        self._reporters.pop(slot.rank, None)
        log_path = slot.proc.log_path
        if log_path:
            with contextlib.suppress(OSError):  # lines written before this incarnation are not its progress
                self._log_offsets[(slot.rank, slot.proc.pid)] = os.stat(log_path).st_size

    def watches(self, rank: int) -> bool:
        """``rank`` has reported progress, so a hang of it would be found (one that never reported
        is not judged: stopping it would wedge its job unseen)."""
        return self.tracker.timeout(rank) is not None

    def rank_ended(self, slot: RankSlot) -> None:
        self.tracker.ended(slot.rank)
        self._reporters.pop(slot.rank, None)
        for key in [k for k in self._log_offsets if k[0] == slot.rank]:
            del self._log_offsets[key]

    def recovery_changed(self, active: bool) -> None:
        if active:
            self.tracker.pause()
        else:
            self.tracker.resume(time.monotonic())

    # ------------------------------------------------------------ loops
    async def run(self) -> None:
        spec = self.host.spec()
        assert spec is not None, "detectors run once the agent has joined"
        self._apply_policy()
        # Started again after a failure: reports went unheard meanwhile, so nobody's silence counts.
        self.tracker.resume(time.monotonic())
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._receive(address_for(spec.uid, self.host.node)))
                group.create_task(self._judge())
                group.create_task(self._slow_loop())
        finally:
            if self.socket is not None:
                self.socket.close()
                self.socket = None
            # Stack captures in flight are left to finish: their hangs are reported either way.

    async def _receive(self, address: str) -> None:
        """Bind the progress socket (again and again while a previous agent of this node still
        holds it) and feed every report to the tracker."""
        sock = ProgressSocket(address)
        delay = 0.5
        while True:
            try:
                sock.open()
                break
            except OSError as err:
                self._warn_once("bind", f"cannot bind the progress socket {address}: {err}; retrying")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        self.socket = sock
        async for report in sock.reports():
            self._on_report(report)

    def _drain(self) -> None:
        """Take every report already queued on the socket: after a stall of the agent's own loop,
        reports that arrived meanwhile must count before anyone's silence is judged."""
        if self.socket is not None:
            for report in self.socket.pending():
                self._on_report(report)

    def _on_report(self, report: ProgressReport) -> None:
        slot = self.host.ranks().get(report.rank)
        if slot is None or slot.proc is None or not sender_belongs(report.sender_pid, slot.proc.pid):
            assert self.socket is not None
            self.socket.drop(f"pid {report.sender_pid} reported for rank {report.rank}, which it does not run")
            return
        signum, path = report.stack_signal, report.stack_path
        self._reporters[report.rank] = _Reporter(report.sender_pid, signum, path if signum is not None else None)
        if report.done:
            self.tracker.finished(report.rank, slot.proc.pid)
            return
        self.tracker.progress(
            report.rank, slot.proc.pid, report.step, time.monotonic(), waiting=report.waiting, busy_s=report.busy_s
        )

    async def _judge(self) -> None:
        """Judge at the earliest deadline (or every half second: reports move deadlines later)."""
        while True:
            now = time.monotonic()
            deadline = self.tracker.next_deadline(now)
            wait = JUDGE_AT_LEAST_EVERY_S if deadline is None else deadline - now + 0.001
            asked = min(max(wait, 0.001), JUDGE_AT_LEAST_EVERY_S)
            await asyncio.sleep(asked)
            if time.monotonic() - now - asked > STALL_S:
                # This agent did not run for a while (a stalled host, a loaded machine): nobody is
                # judged on a silence the agent itself may have caused.
                self.tracker.resume(time.monotonic())
                continue
            self._apply_policy()
            self._drain()
            hangs = self.tracker.hangs(time.monotonic(), self._is_stopped)
            if hangs:  # one capture of the node's stacks for every hang found together
                slots = self.host.ranks()
                incarnations = {h.rank: slots[h.rank].incarnation for h in hangs if h.rank in slots}
                task = asyncio.create_task(self._report_hangs(hangs, incarnations), name="hang-stacks")
                self._captures.add(task)
                task.add_done_callback(self._captures.discard)

    async def _slow_loop(self) -> None:
        """Log lines, stragglers and dropped reports: each needs only a coarse clock."""
        while True:
            await asyncio.sleep(SLOW_EVERY_S)
            if self._pattern is not None:
                await self._read_logs(self._pattern)
            for change in self.tracker.stragglers(time.monotonic()):
                self._report_straggler(change)
            self._note_dropped()

    # ------------------------------------------------------------ what is found
    async def _report_hangs(self, hangs: list[Hang], incarnations: dict[int, tuple[int, int, int]]) -> None:
        judged_at = time.time()
        stacks = await self._stacks(hangs[0].rank)
        for hang in hangs:
            self.host.report(
                Detected(
                    rank=hang.rank,
                    kind=FaultKind.HANG,
                    detail=hang.describe(),
                    stacks=stacks if hang is hangs[0] else (),  # one copy: the stacks are the node's
                    detected_at=judged_at,
                    incarnation=incarnations.get(hang.rank),
                )
            )

    async def _stacks(self, hung_rank: int) -> tuple[pb.RankStack, ...]:
        """The Python stacks of the hung rank and of its node's running peers (best effort; the
        hung rank first: its stack is the one kept whole when the stacks must be cut to size)."""
        targets = []
        for rank, slot in sorted(self.host.ranks().items(), key=lambda item: (item[0] != hung_rank, item[0])):
            if slot.proc is None or not slot.is_running:
                continue
            reporter = self._reporters.get(rank)
            if reporter is not None and sender_belongs(reporter.pid, slot.proc.pid):
                targets.append(StackTarget(rank, reporter.pid, reporter.stack_signal, reporter.stack_path))
            else:
                targets.append(StackTarget(rank, slot.proc.pid))
        try:
            return tuple(await capture_stacks(targets))
        except Exception as err:  # stacks are a help; the hang is reported without them
            self._warn_once("stacks", f"capturing the stacks of rank {hung_rank}'s node failed: {err!r}")
            return ()

    def _report_straggler(self, change: StragglerChange) -> None:
        data = {
            "ratio": f"{change.ratio:.2f}",
            "seconds_per_step": f"{change.seconds_per_step:.4f}",
            "peers_seconds_per_step": f"{change.peers_seconds_per_step:.4f}",
        }
        if change.slow:
            message = (
                f"rank {change.rank} is a straggler: {change.seconds_per_step:.3f}s per step,"
                f" {change.ratio:.2f} x its peers' {change.peers_seconds_per_step:.3f}s"
            )
        else:
            message = f"rank {change.rank} is no longer a straggler ({change.ratio:.2f} x its peers)"
        self.host.note("straggler" if change.slow else "straggler_cleared", message, rank=change.rank, data=data)

    # ------------------------------------------------------------ the job's policy and logs
    def _apply_policy(self) -> None:
        spec = self.host.spec()
        policy = spec.policy.hang if spec is not None and spec.policy.HasField("hang") else None
        if policy == self._policy and self._policy is not None:
            return
        self._policy = policy if policy is not None else pb.HangPolicy()
        rules = HangRules.from_pb(policy)
        self.tracker.rules = rules
        self._pattern = None
        if not rules.log_pattern:
            self._pattern = ANY_LINE
        else:
            try:
                self._pattern = re.compile(rules.log_pattern)
            except re.error as err:  # the policy parser refuses these; a hand-written spec may not
                self._warn_once("pattern", f"hang.log_pattern {rules.log_pattern!r} is not a regular expression: {err}")

    async def _read_logs(self, pattern: re.Pattern[str]) -> None:
        for rank, slot in list(self.host.ranks().items()):
            proc = slot.proc
            if proc is None or not slot.is_running:
                continue
            by_output = pattern is ANY_LINE
            if by_output and rank in self._reporters:
                continue  # its client reports: its output is not read for progress
            if not proc.log_path:
                if not by_output:
                    self._warn_once("nolog", "hang.log_pattern needs the ranks' output in files (--log-dir)")
                continue
            key = (rank, proc.pid)
            offset = self._log_offsets.get(key, 0)
            # Read and matched on a worker thread: neither may hold up the agent's loop.
            matched, step, offset = await asyncio.to_thread(_match_new, proc.log_path, offset, pattern)
            self._log_offsets[key] = offset
            if matched:
                # Without a step number each poll with a match is one step of progress.
                self.tracker.progress(rank, proc.pid, step, time.monotonic(), by_output=by_output)

    def _is_stopped(self, rank_pid: int) -> bool:
        """The rank's process, or the process that reports for it (a wrapper's Python child), is
        stopped."""
        if is_stopped(rank_pid):
            return True
        slots = self.host.ranks()
        return any(
            is_stopped(reporter.pid)
            for rank, reporter in self._reporters.items()
            if rank in slots and slots[rank].proc is not None and slots[rank].proc.pid == rank_pid  # type: ignore[union-attr]
        )

    def _note_dropped(self) -> None:
        """At most one event a minute about dropped reports (a flood must not flood etcd too)."""
        now = time.monotonic()
        if self.socket is None or not self.socket.dropped or now - self._dropped_noted_at < DROPPED_NOTE_EVERY_S:
            return
        self._dropped_noted_at = now
        dropped, problem = self.socket.take_dropped()
        self.host.note("progress_report_dropped", f"{dropped} progress report(s) dropped; last: {problem}")

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self.host.note("detector_problem", f"hang detector: {message}")


def _read_new(path: str, offset: int) -> tuple[str, int]:
    """The text appended to ``path`` since ``offset`` (from the start if it was truncated), up to
    its last line end (a newline, or a carriage return: progress bars rewrite one line); a whole
    chunk with no line end is taken as it is, so one endless line cannot stop the reading."""
    try:
        with open(path, "rb") as log_file:
            size = os.fstat(log_file.fileno()).st_size
            if size < offset:
                offset = 0
            log_file.seek(offset)
            data = log_file.read(min(size - offset, _CHUNK))
    except OSError:
        return "", offset
    cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1  # a line still being written: next time
    if cut == 0 and len(data) == _CHUNK:
        cut = len(data)
    return data[:cut].decode("utf-8", "replace"), offset + cut


def _match_new(path: str, offset: int, pattern: re.Pattern[str]) -> tuple[bool, int | None, int]:
    """(a line matched, the last step number a match gave, the new offset)."""
    chunk, offset = _read_new(path, offset)
    matched, step = False, None
    for line in chunk.replace("\r", "\n").split("\n"):
        found = pattern.search(line[:_MAX_LINE])
        if found is None:
            continue
        matched = True
        text = found.groupdict().get("step")
        if text is not None and text.isdigit():
            step = int(text)
    return matched, step, offset
