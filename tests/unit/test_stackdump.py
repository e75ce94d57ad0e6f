"""``taskd_client.stackdump``: faulthandler armed for the agent, in real processes (it is process-wide)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from taskd_client.stackdump import DIR_ENV, SIGNAL_ENV, parse_signal

ARM = "import json\nfrom taskd_client import stackdump\nprint(json.dumps(stackdump.arm(1)))"


def _run(code: str, env: dict[str, str] | None = None) -> tuple[Any, str]:
    """Run ``code`` in a fresh interpreter; it prints one JSON line last. Returns it and stderr."""
    base = {k: v for k, v in os.environ.items() if k not in (DIR_ENV, SIGNAL_ENV)}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**base, **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1]), proc.stderr


def test_parse_signal() -> None:
    assert parse_signal("SIGUSR2") == signal.SIGUSR2
    assert parse_signal("usr1") == signal.SIGUSR1
    assert parse_signal(str(int(signal.SIGUSR1))) == signal.SIGUSR1
    assert parse_signal("SIGRTMIN+2") == signal.SIGRTMIN + 2
    assert parse_signal(" SIGRTMAX ") == signal.SIGRTMAX
    for bad in ("SIGTERM", "SIGINT", "SIGKILL", "SIGSEGV", "9", "bogus", "SIGRTMAX+1", ""):
        with pytest.raises(ValueError):
            parse_signal(bad)


def test_arm_dumps_on_the_signal_and_the_process_carries_on(tmp_path: Path) -> None:
    result, _ = _run(
        """
        import json, os, signal, threading, time
        from taskd_client import stackdump
        first = stackdump.arm(3)
        again = stackdump.arm(3)
        signum, path = first
        def blocked():
            threading.Event().wait(0.5)
        t = threading.Thread(target=blocked, name="other"); t.start()
        os.kill(os.getpid(), signum)
        time.sleep(0.1)
        one = open(path).read()
        os.truncate(path, 0)  # what the agent does before each signal: the file is O_APPEND
        os.kill(os.getpid(), signum)
        time.sleep(0.1)
        two = open(path).read()
        t.join()
        mode = os.stat(path).st_mode & 0o777
        print(json.dumps({"first": first, "again": again, "one": one, "two": two, "mode": mode, "pid": os.getpid()}))
        """,
        {DIR_ENV: str(tmp_path / "stacks")},
    )
    signum, path = result["first"]
    assert result["again"] == result["first"]  # idempotent
    assert signum == signal.SIGUSR2
    assert path == str(tmp_path / "stacks" / f"rank3-pid{result['pid']}.stacks")
    assert result["mode"] == 0o600
    for dump in (result["one"], result["two"]):
        assert dump.count("(most recent call first)") == 2  # every thread
        assert "Current thread" in dump and '"<string>"' in dump
        assert "\0" not in dump
    assert result["one"].count("Current thread") == 1
    assert result["two"].count("Current thread") == 1  # one dump after a truncate, from offset 0


def test_signal_from_the_environment(tmp_path: Path) -> None:
    code = """
        import json
        from taskd_client import stackdump
        print(json.dumps(stackdump.arm(0)))
        """
    result, _ = _run(code, {DIR_ENV: str(tmp_path), SIGNAL_ENV: "SIGRTMIN+1"})
    assert result[0] == signal.SIGRTMIN + 1
    refused, stderr = _run(code, {DIR_ENV: str(tmp_path), SIGNAL_ENV: "SIGTERM"})
    assert refused is None
    assert "RECOVERD_STACK_SIGNAL='SIGTERM'" in stderr and "stacks through faulthandler are off" in stderr


def test_default_directory_is_per_user_under_tempdir(tmp_path: Path) -> None:
    result, _ = _run(
        """
        import json, os
        from taskd_client import stackdump
        print(json.dumps([stackdump.arm(1), os.getuid()]))
        """,
        {"TMPDIR": str(tmp_path)},
    )
    (_signum, path), uid = result
    assert Path(path).parent == tmp_path / f"recoverd-stacks-{uid}"
    assert (Path(path).parent.stat().st_mode & 0o777) == 0o700


def test_a_directory_planted_by_someone_else_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / f"recoverd-stacks-{os.getuid()}").symlink_to(target)
    result, stderr = _run(ARM, {"TMPDIR": str(tmp_path)})
    assert result is None and "not a directory owned by" in stderr
    assert not list(target.iterdir())


def test_never_raises_and_leaves_a_script_handler_alone(tmp_path: Path) -> None:
    result, stderr = _run(
        """
        import json, os, signal, time
        from taskd_client import stackdump
        seen = []
        signal.signal(signal.SIGUSR2, lambda *a: seen.append(1))
        armed = stackdump.arm(0)
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.05)
        print(json.dumps([armed, seen]))
        """,
        {DIR_ENV: str(tmp_path)},
    )
    assert result == [None, [1]]  # not armed; the script's own handler still runs
    assert "already has a Python handler" in stderr
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    result, stderr = _run(ARM, {DIR_ENV: str(not_a_dir)})
    assert result is None and "stacks through faulthandler are off" in stderr


def test_a_forked_child_arms_its_own_file(tmp_path: Path) -> None:
    result, _ = _run(
        """
        import json, os
        from taskd_client import stackdump
        parent = stackdump.arm(0)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, json.dumps(stackdump.arm(0)).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        child = json.loads(os.read(r, 4096))
        print(json.dumps([parent, child, stackdump.arm(0)]))
        """,
        {DIR_ENV: str(tmp_path)},
    )
    parent, child, parent_again = result
    assert parent == parent_again
    assert child[1] != parent[1] and Path(child[1]).exists()
