"""A rank for tests/integration/test_ranks_via_agent.py: joins recoverd's protocol through its node
agent (``taskd_client.agentlink``) without torch, so that a job of many ranks starts in a second.

It offers ``LINK_RANK_OFFER`` (default ``dump,exit``), acknowledges a stop at once, and on a dump
writes ``<LINK_RANK_DIR>/rank<R>.<uuid>`` and answers (code 407 instead where ``LINK_RANK_FAIL_DUMP``
names its rank). It prints ``rank R joined`` once its join is sent and ``rank R <kind> <strategy>``
for each signal. The first incarnation runs until it is stopped; a restarted one (after the dump's
exit) exits 0 once it has joined and the test has created ``<LINK_RANK_DIR>/finish``, so the job
ends when the test has looked at the recovery.
"""

import os
import sys
import threading
import time
from pathlib import Path

from recoverd.rankwire import Signal
from taskd_client.agentlink import AgentLink, Reply

rank = int(os.environ["RANK"])
offer = tuple(s for s in os.environ.get("LINK_RANK_OFFER", "dump,exit").split(",") if s)
directory = Path(os.environ.get("LINK_RANK_DIR", "."))
failing = {int(r) for r in os.environ.get("LINK_RANK_FAIL_DUMP", "").split(",") if r}
done = threading.Event()


def on_signal(signal: Signal, reply: Reply) -> None:
    print(f"rank {rank} {signal.kind} {signal.strategy}", flush=True)
    if signal.kind == "stop":
        reply(0, "")
    elif rank in failing:
        reply(407, "no space left on device")
    else:
        (directory / f"rank{rank}.{signal.uuid}").write_text(str(os.getpid()))
        reply(0, "")


link = AgentLink(rank, offer, on_signal)
link.start()
if not link.wait_joined(30):
    print(f"rank {rank} could not join", flush=True)
    sys.exit(3)
print(f"rank {rank} joined", flush=True)
if os.environ.get("RECOVERD_RESTART_COUNT", "0") != "0":
    while not (directory / "finish").exists():
        time.sleep(0.05)
    link.close()
    sys.exit(0)
while True:
    time.sleep(60)
