"""A rank for the TLS tests: connects to etcd with only what its agent put in its environment
(paths, no secret), reads its own job's record, tries another job's, then works like
examples/worker.py.

Prints ``own job: ok`` and ``other job: denied (...)`` (or what happened instead).
"""

from __future__ import annotations

import asyncio
import os
import runpy
import sys

from recoverd.errors import PermissionDenied
from recoverd.keys import Keyspace
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


if __name__ == "__main__":
    other = sys.argv[1]
    asyncio.run(check(other))
    worker = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "worker.py")
    sys.argv = [worker, *sys.argv[2:]]
    runpy.run_path(worker, run_name="__main__")
