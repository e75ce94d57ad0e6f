"""recoverd.priority: the control plane ahead of the job for the CPU, or unchanged where it may not.

Each case runs in a child process: a nice value, once lowered, cannot be raised back without the
privilege, and the test process must keep its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, os, threading
from recoverd import priority
if os.environ.get("DROP_TO"):
    os.setuid(int(os.environ["DROP_TO"]))  # from root to a user: every capability is gone
got = priority.boost(int(os.environ["BOOST"]))
seen = []
t = threading.Thread(target=lambda: seen.append(os.getpriority(os.PRIO_PROCESS, 0)))
t.start(); t.join()
child = os.fork()
if child == 0:
    os._exit(0)
priority.as_job(child)
job_child = os.getpriority(os.PRIO_PROCESS, child)
os.waitpid(child, 0)
print(json.dumps({"job": got.job_nice, "own": got.own_nice, "why": got.why_not, "boosted": got.boosted,
                  "now": os.getpriority(os.PRIO_PROCESS, 0), "thread": seen[0], "child": job_child}))
"""


def _probe(boost: int, *, as_user: int | None = None) -> dict[str, object]:
    env = {**os.environ, "BOOST": str(boost), "DROP_TO": "" if as_user is None else str(as_user)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.skipif(os.geteuid() != 0, reason="lowering a nice value needs CAP_SYS_NICE (root)")
def test_boost_lowers_the_nice_value_for_new_threads_and_children_are_put_back() -> None:
    got = _probe(10)
    base = int(got["job"])  # type: ignore[call-overload]
    assert got["boosted"] is True and got["own"] == got["now"] == max(-20, base - 10)
    assert got["thread"] == got["own"], "a thread started after the boost inherits it"
    assert got["child"] == base, "a process started for the job is put back at the job's priority"


def test_boost_zero_changes_nothing() -> None:
    got = _probe(0)
    assert got["boosted"] is False and got["own"] == got["job"] == got["now"] == got["child"]
    assert "off" in str(got["why"])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another user")
def test_without_the_privilege_it_says_why_and_changes_nothing() -> None:
    got = _probe(10, as_user=65534)  # nobody: no CAP_SYS_NICE
    assert got["boosted"] is False and got["own"] == got["job"] == got["now"]
    assert "CAP_SYS_NICE" in str(got["why"])
