"""Which commands can be warm-started, and what the server preloads for them (pure parsing)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from recoverd.agent.warmstart import WarmStartCommand, frameworks_imported, parse_command, preload_list


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["python", "train.py", "--lr", "0.1"], WarmStartCommand("python", (), None, ("train.py", "--lr", "0.1"))),
        (["/usr/bin/python3.11", "-u", "-X", "dev", "-Wignore", "t.py"],
         WarmStartCommand("/usr/bin/python3.11", ("-u", "-X", "dev", "-Wignore"), None, ("t.py",))),
        (["python3", "-m", "pkg.train", "a"], WarmStartCommand("python3", (), "pkg.train", ("a",))),
        (["python", "-mpkg", "a"], WarmStartCommand("python", (), "pkg", ("a",))),
        (["python", "-O", "t.py", "-m", "x"], WarmStartCommand("python", ("-O",), None, ("t.py", "-m", "x"))),
    ],
)  # fmt: skip
def test_plain_python_commands_can_be_warm_started(argv: list[str], expected: WarmStartCommand) -> None:
    assert parse_command(argv) == expected


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["torchrun", "t.py"], "not a Python interpreter"),
        (["bash", "-c", "python t.py"], "not a Python interpreter"),
        (["python", "-c", "print(1)"], "'-c' is not supported"),
        (["python", "-uB", "t.py"], "'-uB' is not supported"),
        (["python", "-"], "'-' is not supported"),
        (["python", "-u"], "names no script"),
        ([], "not a Python interpreter"),
    ],
)
def test_other_commands_are_started_plainly_with_the_reason(argv: list[str], why: str) -> None:
    reason = parse_command(argv)
    assert isinstance(reason, str) and why in reason


def test_auto_preloads_the_framework_the_script_imports(tmp_path: Path) -> None:
    (tmp_path / "torch_job.py").write_text(
        "import os\nfrom torch import nn\n\ndef f():\n    import taskd_client.pytorch\n"
    )
    (tmp_path / "plain.py").write_text("import os, json\nfrom . import x\n")
    (tmp_path / "only_client.py").write_text("from taskd_client import DLRecoverManager\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("import mindspore\n")
    (tmp_path / "broken.py").write_text("import torch\ndef (:\n")
    cwd = str(tmp_path)

    def preload(*argv: str) -> list[str]:
        command = parse_command(["python", *argv])
        assert isinstance(command, WarmStartCommand)
        return preload_list("auto", command, cwd)

    assert preload("torch_job.py")[0] == "torch"
    assert "taskd_client.pytorch" in preload("torch_job.py") and "torch.distributed" in preload("torch_job.py")
    assert "taskd_client.stackdump" in preload("torch_job.py")  # the first progress report imports it
    assert preload("plain.py") == []
    assert preload("only_client.py") == []  # the recovery client alone is no framework
    assert preload("-m", "pkg.train") == ["mindspore"]
    assert preload("broken.py") == [] and preload("missing.py") == []
    assert preload_list("numpy, scipy ,", parse_command(["python", "plain.py"]), cwd) == ["numpy", "scipy"]  # type: ignore[arg-type]
    assert frameworks_imported(None) == []


def test_a_forked_rank_takes_its_environment_changing_only_what_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A standby's store thread may read the environment while its rank takes its own: the rank's
    variables are set, the server's padding removed, the rest left untouched (no unset-and-set)."""
    from recoverd.agent import warmstart_server

    for key in list(os.environ):
        monkeypatch.delenv(key)
    monkeypatch.setenv("PATH", "/bin")
    monkeypatch.setenv("RECOVERD_WARM_START_ROOM", "....")
    monkeypatch.setenv("RANK", "0")
    written: list[str] = []
    monkeypatch.setattr(os, "putenv", lambda key, value: written.append(os.fsdecode(key)))
    monkeypatch.setattr(os, "unsetenv", lambda key: written.append("-" + os.fsdecode(key)))

    warmstart_server._take_environment({"PATH": "/bin", "RANK": "3", "LOCAL_RANK": "3"})

    assert dict(os.environ) == {"PATH": "/bin", "RANK": "3", "LOCAL_RANK": "3"}
    assert sorted(written) == ["-RECOVERD_WARM_START_ROOM", "LOCAL_RANK", "RANK"]


@pytest.mark.parametrize("answer", [b"not json\n", b"[1, 2]\n", b""], ids=["garbage", "not-an-object", "closed"])
def test_an_unreadable_answer_is_a_server_that_did_not_answer(answer: bytes) -> None:
    """A fork request answered with garbage raises OSError, which spawn() turns into a plain start
    and a server given up as lost: never an exception out of the agent's rank start."""
    import socket
    import sys

    from recoverd.agent.warmstart import WarmStart

    warm = WarmStart(None, [sys.executable, "train.py"], {}, None, "auto", None)  # type: ignore[arg-type]
    ours, theirs = socket.socketpair()
    try:
        warm._sock = ours
        theirs.sendall(answer)
        if not answer:
            theirs.close()
        with pytest.raises(OSError):
            warm._ask({"cmdline": ["x"]})
    finally:
        ours.close()
        theirs.close()
