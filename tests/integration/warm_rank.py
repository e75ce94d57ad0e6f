"""A rank for tests/integration/test_warm_start.py: says what it sees, then trains (sleeps).

It prints one ``identity`` line of JSON: what a script can observe of how it was started (its
environment's rank, ``sys.argv``, ``__name__``, ``__file__``, the working directory, its process
group and session, whether ``decimal`` was imported before this script imported it, a random
number). With ``WARM_RANK_FAIL_FIRST_RESTART`` set, the first replacement
(``RECOVERD_RESTART_COUNT=1``) exits with code 3 after that line, so the test can check the exit
status the agent records; every other incarnation sleeps.
"""

import json
import os
import random
import sys
import time

preloaded = "decimal" in sys.modules
import decimal  # noqa: E402,F401 - what the warm-start server preloads in the test

#: Evaluated as ``python script.py`` would (no ``from __future__ import annotations`` inherited
#: from the server that compiled this script ahead): ``int``, not the string "int".
probe: int = 0

print(
    "identity "
    + json.dumps(
        {
            "rank": os.environ.get("RANK"),
            "restart": os.environ.get("RECOVERD_RESTART_COUNT"),
            "argv": sys.argv,
            "name": __name__,
            "file": os.path.abspath(__file__),
            "cwd": os.getcwd(),
            "path0": sys.path[0],
            "pid": os.getpid(),
            "pgid": os.getpgid(0),
            "sid": os.getsid(0),
            "preloaded": preloaded,
            "random": random.random(),
            "stdin_is_null": os.path.realpath("/proc/self/fd/0") == "/dev/null",
            "annotation": repr(__annotations__["probe"]),
            "doc": (__doc__ or "").split(":")[0],
            "spec_loader_cached": [repr(__spec__), type(__loader__).__name__, repr(globals().get("__cached__"))],
            "main_is_this": sys.modules["__main__"].__dict__ is globals(),
        }
    ),
    flush=True,
)
if os.environ.get("RECOVERD_RESTART_COUNT") == "1" and os.environ.get("WARM_RANK_FAIL_FIRST_RESTART"):
    sys.exit(3)
time.sleep(600)
