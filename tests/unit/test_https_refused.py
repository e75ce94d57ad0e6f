"""An etcd endpoint given as https:// is refused with a clear error and exit 2, never connected in
plaintext (issue 13's first finding: TLS is not supported yet, and silently dropping it is worse)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "recoverd.cli.main", "coordinator", "--etcd", "https://127.0.0.1:1"],
        ["-m", "recoverd.cli.ctl", "--etcd", "https://127.0.0.1:1", "status", "job"],
    ],
)
def test_services_and_recoverctl_refuse_https_with_exit_2(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "asks for TLS" in done.stderr and "refuses to connect in plaintext" in done.stderr
