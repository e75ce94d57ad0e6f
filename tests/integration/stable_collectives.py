"""Every collective of torch.distributed, over torch's own gloo world or recoverd's stable one.

Run by 2 processes with RANK, WORLD_SIZE=2, MASTER_ADDR and MASTER_PORT set (tests/integration/
test_tp_groups.py starts them). ``--groups plain``: ``init_process_group("gloo")``; ``--groups
stable``: ``mesh.resilient_mesh`` (the default group is a :class:`~taskd_client.pytorch.mesh.
WorldGroup`), rebound to generation 1 first, so each collective runs on a generation's group
that the stable group did not start with. Two kinds of caller are covered: torch.distributed's
Python functions (they call the group's method by name, so a Python override is reached) and the
functional collectives (``torch.ops._c10d_functional``: C++ resolves the group by name and calls
its C++ virtual, which reaches Python only where torch's trampoline forwards it).

Each collective prints one line: ``op NAME ok SHA256`` (the hash of what it produced on this rank)
or ``op NAME error TYPE: MESSAGE``. Over both kinds of group the lines must be the same, except
the documented gaps (docs/notes/tp-findings.md).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def _hash(value: Any) -> str:
    digest = hashlib.sha256()

    def add(item: Any) -> None:
        if isinstance(item, funcol.AsyncCollectiveTensor):
            item = item.wait()
        if isinstance(item, torch.Tensor):
            digest.update(item.detach().contiguous().numpy().tobytes())
        elif isinstance(item, list | tuple):
            for element in item:
                add(element)
        elif isinstance(item, dist.Work):
            item.wait()
        else:
            digest.update(repr(item).encode())

    add(value)
    return digest.hexdigest()


def collectives(rank: int, group: dist.ProcessGroup) -> dict[str, Callable[[], Any]]:
    """Each collective on 2 ranks, with inputs that differ per rank; what it returns is hashed."""
    peer = 1 - rank

    def x(n: int = 4) -> torch.Tensor:
        return torch.arange(n, dtype=torch.float32) + 10 * rank + 1

    def inplace(fn: Callable[[torch.Tensor], Any], n: int = 4) -> Callable[[], Any]:
        def run() -> torch.Tensor:
            tensor = x(n)
            fn(tensor)
            return tensor

        return run

    def out(make: Callable[[], torch.Tensor], fn: Callable[[torch.Tensor], Any]) -> Callable[[], Any]:
        def run() -> torch.Tensor:
            tensor = make()
            work = fn(tensor)
            if isinstance(work, dist.Work):
                work.wait()
            return tensor

        return run

    def p2p(blocking: bool) -> Callable[[], Any]:
        def run() -> torch.Tensor:
            tensor = x()
            if rank == 0:
                (dist.send if blocking else lambda t, dst, group: dist.isend(t, dst, group).wait())(tensor, 1, group)
            else:
                (dist.recv if blocking else lambda t, src, group: dist.irecv(t, src, group).wait())(tensor, 0, group)
            return tensor

        return run

    def batch_isend_irecv() -> torch.Tensor:
        received = torch.zeros(4)
        ops = [dist.P2POp(dist.isend, x(), peer, group), dist.P2POp(dist.irecv, received, peer, group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return received

    def coalescing_manager() -> list[torch.Tensor]:
        tensors = [x(), x(2)]
        with dist._coalescing_manager(group, async_ops=True) as manager:
            for tensor in tensors:
                dist.all_reduce(tensor, group=group)
        manager.wait()
        return tensors

    def objects() -> list[Any]:
        gathered: list[Any] = [None, None]
        dist.all_gather_object(gathered, {"rank": rank}, group=group)
        sent: list[Any] = [{"from": rank}]
        dist.broadcast_object_list(sent, src=0, group=group)
        return [gathered, sent]

    def object_p2p() -> list[Any]:
        objs: list[Any] = [f"hello from {rank}"]
        if rank == 0:
            dist.send_object_list(objs, dst=1, group=group)
        else:
            dist.recv_object_list(objs, src=0, group=group)
        return objs

    def monitored_barrier() -> str:
        dist.monitored_barrier(group=group, timeout=timedelta(seconds=20))
        return "ok"

    def funcol_p2p() -> torch.Tensor:
        tensor = x()
        if rank == 0:
            funcol.wait_tensor(funcol.isend_inplace(tensor, 1, group=group))  # type: ignore[attr-defined]
        else:
            funcol.wait_tensor(funcol.irecv_inplace(tensor, 0, group=group))  # type: ignore[attr-defined]
        return tensor

    name = funcol._resolve_group_name(group)
    ops: dict[str, Callable[[], Any]] = {
        # torch.distributed's Python functions: group.<method>(...) by name.
        "dist.all_reduce": inplace(lambda t: dist.all_reduce(t, group=group)),
        "dist.all_reduce(async)": inplace(lambda t: dist.all_reduce(t, group=group, async_op=True).wait()),  # type: ignore[union-attr]
        "dist.broadcast": inplace(lambda t: dist.broadcast(t, src=1, group=group)),
        "dist.reduce": inplace(lambda t: dist.reduce(t, dst=0, group=group)),
        "dist.all_gather": lambda: (lambda outs: (dist.all_gather(outs, x(), group=group), outs)[1])(
            [torch.zeros(4), torch.zeros(4)]
        ),
        "dist.all_gather_single": out(lambda: torch.zeros(8), lambda o: dist.all_gather_single(o, x(), group=group)),
        "dist.reduce_scatter": out(
            lambda: torch.zeros(4), lambda o: dist.reduce_scatter(o, [x(), x() * 2], group=group)
        ),
        "dist.reduce_scatter_single": out(
            lambda: torch.zeros(2), lambda o: dist.reduce_scatter_single(o, x(), group=group)
        ),
        "dist.gather": out(
            lambda: torch.zeros(4),
            lambda o: dist.gather(x(), [o, torch.zeros(4)] if rank == 0 else None, dst=0, group=group),
        ),
        "dist.scatter": out(
            lambda: torch.zeros(4),
            lambda o: dist.scatter(o, [x(), x() * 3] if rank == 0 else None, src=0, group=group),
        ),
        "dist.all_to_all_single": out(lambda: torch.zeros(4), lambda o: dist.all_to_all_single(o, x(), group=group)),
        "dist.all_to_all": lambda: (lambda outs: (dist.all_to_all(outs, [x(2), x(2) * 2], group=group), outs)[1])(
            [torch.zeros(2), torch.zeros(2)]
        ),
        "dist.send/recv": p2p(blocking=True),
        "dist.isend/irecv": p2p(blocking=False),
        "dist.batch_isend_irecv": batch_isend_irecv,
        "dist.barrier": lambda: dist.barrier(group=group),
        "dist.monitored_barrier": monitored_barrier,
        "dist.*_object": objects,
        "dist.send/recv_object_list": object_p2p,
        "dist._coalescing_manager(all_reduce)": coalescing_manager,
        # Functional collectives: torch.ops._c10d_functional.* find the group by name in C++.
        "funcol.all_reduce": lambda: funcol.all_reduce(x(), "sum", group),
        "funcol.all_reduce_coalesced": lambda: funcol.all_reduce_coalesced([x(), x(2)], "sum", group),
        "funcol.all_gather_single": lambda: funcol.all_gather_single(x(), 0, group),
        "funcol.all_gather_single_coalesced": lambda: funcol.all_gather_single_coalesced([x(), x(2)], group),
        "funcol.reduce_scatter_single": lambda: funcol.reduce_scatter_single(x(), "sum", 0, group),
        "funcol.reduce_scatter_single_coalesced": lambda: funcol.reduce_scatter_single_coalesced(
            [x(), x(2)], "sum", [0, 0], group
        ),
        "funcol.all_to_all_single": lambda: funcol.all_to_all_single(x(), [2, 2], [2, 2], group),
        "funcol.broadcast": lambda: funcol.broadcast(x(), 1, group),
        "funcol.isend/irecv": funcol_p2p,
        "_c10d_functional.all_gather_into_tensor_out": lambda: funcol.wait_tensor(
            torch.ops._c10d_functional.all_gather_into_tensor_out(x(), 2, name, out=torch.zeros(8))
        ),
        "_c10d_functional.reduce_scatter_tensor_out": lambda: funcol.wait_tensor(
            torch.ops._c10d_functional.reduce_scatter_tensor_out(x(), "sum", 2, name, out=torch.zeros(2))
        ),
        "_c10d_functional.batch_p2p_ops": lambda: [
            funcol.wait_tensor(t)
            for t in funcol.batch_p2p_ops_inplace(  # type: ignore[attr-defined]
                ["isend", "irecv"], [peer, peer], [0, 0], [x(), torch.zeros(4)], group
            )
        ],
    }
    return ops


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", choices=("plain", "stable"), default="stable")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), 2, rank == 0, timeout=timedelta(seconds=60)
    )
    if args.groups == "stable":
        from taskd_client.pytorch.mesh import resilient_mesh

        _, world = resilient_mesh((2,), ("dp",), store=store, rank=rank, world_size=2)
        world.rebind(1)
    else:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=30))
    group = dist.group.WORLD
    assert group is not None
    for op, run in collectives(rank, group).items():
        started = time.monotonic()
        try:
            line = f"ok {_hash(run())}"
        except Exception as error:  # the error is the result
            message = str(error).strip().splitlines()[0] if str(error).strip() else ""
            line = f"error {type(error).__name__}: {message[:160]}"
        print(f"op {op} {line}", flush=True)
        print(f"{op}: {time.monotonic() - started:.3f} s", file=sys.stderr, flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
