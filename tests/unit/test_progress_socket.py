"""The progress channel end to end on this machine: the client's datagrams, the kernel's sender
credentials, and everything a hostile or broken sender can put on the socket."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from recoverd.agent.detectors.progress_socket import (
    MAX_REPORT,
    ProgressSocket,
    address_for,
    parse_report,
    sender_belongs,
)
from recoverd.errors import BadRecord
from taskd_client.progress import ProgressReporter


def test_the_address_is_stable_per_run_and_node_and_abstract() -> None:
    assert address_for("uid1", "node0") == address_for("uid1", "node0")
    assert address_for("uid1", "node0") != address_for("uid1", "node1")
    assert address_for("uid1", "node0").startswith("@recoverd-progress-")
    assert len(address_for("u" * 300, "n" * 253)) < 108  # fits a sockaddr_un


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xfe",
        b"[]",
        b'{"v": 2, "rank": 0}',
        b'{"v": 1}',
        b'{"v": 1, "rank": -1}',
        b'{"v": 1, "rank": true}',
        b'{"v": 1, "rank": 0, "step": "7"}',
        b'{"v": 1, "rank": 0, "busy": -1}',
        b'{"v": 1, "rank": 0, "sig": 0}',
        b'{"v": 1, "rank": 0, "sig": 9, "dump": "relative/path"}',
        b'{"v": 1, "rank": 0, "dump": "/a\\u0000b"}',
        b'{"v": 1, "rank": 0, "x": "' + b"a" * MAX_REPORT + b'"}',
    ],
)
def test_malformed_reports_are_refused_with_a_reason(data: bytes) -> None:
    with pytest.raises(BadRecord):
        parse_report(data, sender_pid=1)


def test_a_well_formed_report_is_read_whole() -> None:
    report = parse_report(b'{"v":1,"rank":3,"step":41,"busy":0.25,"sig":12,"dump":"/tmp/x"}', sender_pid=77)
    assert (report.sender_pid, report.rank, report.step, report.busy_s) == (77, 3, 41, 0.25)
    assert (report.stack_signal, report.stack_path, report.waiting) == (12, "/tmp/x", False)


def test_the_client_does_nothing_without_an_agent_and_never_raises() -> None:
    ProgressReporter(address="", rank=0).heartbeat(1)  # no socket configured
    nobody = ProgressReporter(address=f"@recoverd-test-{secrets.token_hex(8)}", rank=0)
    nobody.heartbeat(1)  # nobody listening
    assert nobody.failed == 1


_CHILD = """
import sys, time
from taskd_client.progress import ProgressReporter
reporter = ProgressReporter(address=sys.argv[1], rank=int(sys.argv[2]), min_interval_s=0)
for step in range(3):
    reporter.heartbeat(step, busy_s=0.5)
reporter.waiting(3)
"""


async def test_reports_carry_the_senders_pid_as_the_kernel_says() -> None:
    address = f"@recoverd-test-{secrets.token_hex(8)}"
    sock = ProgressSocket(address)
    sock.open()
    try:
        child = await asyncio.create_subprocess_exec(sys.executable, "-c", _CHILD, address, "5")
        got = []
        async with asyncio.timeout(60):
            async for report in sock.reports():
                got.append(report)
                if len(got) == 4:
                    break
        assert await child.wait() == 0
        assert {r.sender_pid for r in got} == {child.pid}
        assert [(r.rank, r.step, r.waiting) for r in got] == [(5, 0, False), (5, 1, False), (5, 2, False), (5, 3, True)]
        # A second binder of the same address is refused (an older agent of the node still runs).
        with pytest.raises(OSError):
            ProgressSocket(address).open()
    finally:
        sock.close()


async def test_garbage_on_the_socket_is_counted_and_dropped_the_next_report_still_counts() -> None:
    import socket

    address = f"@recoverd-test-{secrets.token_hex(8)}"
    sock = ProgressSocket(address)
    sock.open()
    try:
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        for junk in (b"\x00" * 10, b"not json", b'{"v":1}'):
            sender.sendto(junk, "\0" + address[1:])
        sender.sendto(b'{"v":1,"rank":0,"step":1}', "\0" + address[1:])
        async with asyncio.timeout(30):
            report = await anext(sock.reports())
        assert report.step == 1 and report.sender_pid == os.getpid()
        assert sock.take_dropped()[0] == 3
        sender.close()
    finally:
        sock.close()


def test_a_sender_belongs_to_a_rank_only_from_the_ranks_process_group() -> None:
    leader = subprocess.Popen(["sleep", "30"], process_group=0)  # a rank: its own process group
    member = subprocess.Popen(["sleep", "30"], process_group=leader.pid)  # e.g. its shell's python
    outsider = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert sender_belongs(leader.pid, leader.pid)
        assert sender_belongs(member.pid, leader.pid)
        assert not sender_belongs(outsider.pid, leader.pid)
        assert not sender_belongs(os.getpid(), leader.pid)
    finally:
        for proc in (leader, member, outsider):
            proc.kill()
            proc.wait()


def test_deeply_nested_json_is_refused_not_a_crash() -> None:
    with pytest.raises(BadRecord):
        parse_report(b"[" * 4000, sender_pid=1)


def test_the_client_never_raises_into_the_training_loop() -> None:
    reporter = ProgressReporter(address=f"@recoverd-test-{secrets.token_hex(8)}", rank=0, min_interval_s=0)

    class Odd:
        def __index__(self) -> int:
            raise RuntimeError("no")

    reporter.heartbeat(Odd())  # type: ignore[arg-type]
    reporter.heartbeat("seven")  # type: ignore[arg-type]
    reporter.heartbeat(3, busy_s="x")  # type: ignore[arg-type]
    reporter.waiting(object())  # type: ignore[arg-type]


def test_log_lines_are_read_whole_up_to_carriage_returns_and_an_endless_line_does_not_stop_reading(
    tmp_path: Path,
) -> None:
    import re

    from recoverd.agent.detectors.hang import _CHUNK, _match_new

    log = tmp_path / "rank0.log"
    pattern = re.compile(r"step (?P<step>\d+)")
    log.write_bytes(b"noise\nstep 1\rstep 2\rstep 3 still writ")
    matched, step, offset = _match_new(str(log), 0, pattern)
    assert (matched, step) == (True, 2) and offset == len(b"noise\nstep 1\rstep 2\r")
    log.write_bytes(b"x" * (_CHUNK + 10) + b"\nstep 9\n")
    first = _match_new(str(log), 0, pattern)
    assert first[0] is False and first[2] == _CHUNK  # a chunk with no line end is taken whole
    assert _match_new(str(log), first[2], pattern)[:2] == (True, 9)
