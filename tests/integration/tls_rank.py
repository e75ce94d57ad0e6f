"""A rank for the TLS tests: connects to etcd with only what its agent put in its environment
(paths, no secret), reads its own job's record, tries another job's, tries to write its own job's
records that only the coordinator and the agents may write, then works like examples/worker.py.

Prints ``own job: ok``, ``other job: denied (...)`` and ``write <record>: denied (...)`` for the
job's spec (its policy is in it), the run's status, recovery and this node's command (or what
happened instead). A write that is allowed puts back the value read (or deletes an absent key),
so even a failing test changes nothing.
"""

from __future__ import annotations

import asyncio
import os
import runpy
import sys

from recoverd.errors import PermissionDenied
from recoverd.keys import Keyspace, RunRef
from recoverd.store import Store


async def check(other_job: str) -> None:
    keys = Keyspace(os.environ["RECOVERD_PREFIX"])
    async with Store(os.environ["RECOVERD_ETCD"]) as store:  # TLS and user from RECOVERD_ETCD_*
        await store.verify()
        own = await store.get(keys.job_spec(os.environ["RECOVERD_JOB"]))
        print(f"own job: {'ok' if own is not None else 'missing'}", flush=True)
        try:
            await store.get(keys.job_spec(other_job))
            print("other job: READ ALLOWED", flush=True)
        except PermissionDenied as err:
            print(f"other job: denied ({err})", flush=True)
        run = RunRef(os.environ["RECOVERD_JOB"], os.environ["RECOVERD_RUN"])
        records = {
            "spec": keys.job_spec(run.job),
            "status": keys.status(run),
            "recovery": keys.recovery(run),
            "command": keys.command(run, os.environ["RECOVERD_NODE"]),
        }
        for name, key in records.items():
            try:
                kv = await store.get(key)
                if kv is not None:
                    await store.put(key, kv.value)
                else:
                    await store.delete_prefix(key)
                print(f"write {name}: ALLOWED", flush=True)
            except PermissionDenied as err:
                print(f"write {name}: denied ({err})", flush=True)


if __name__ == "__main__":
    other = sys.argv[1]
    asyncio.run(check(other))
    worker = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "worker.py")
    sys.argv = [worker, *sys.argv[2:]]
    runpy.run_path(worker, run_name="__main__")
