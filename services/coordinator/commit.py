"""One pass's writes, committed fenced and within etcd's limits (docs/adr/0019).

The fenced transaction compares the leader key with this leader's value (a deposed leader can
change nothing) and the job prefix's mod revision with the revision the pass read (nothing changed
underneath); if either compare fails, the pass is dropped and run again on a fresh read, never
patched. A transaction holds at most ``MAX_TXN_OPS`` operations and ``MAX_REQUEST_BYTES``, so the
fenced one takes the coordinator's own records first, then the deletes of the keys the pass
consumed (consumed exactly once, with the read), then as many other puts as fit; the rest follow in
transactions fenced by the leader key and by the recovery record still being the one just written.
Events live outside ``jobs/`` and normally commit with the change they describe; when they do not
fit, they follow in chunks fenced by the leader key alone.
"""

from __future__ import annotations

from recoverd.coordinator.leadership import Leadership
from recoverd.jobview import JobView
from recoverd.keys import Keyspace, RunRef
from recoverd.store import (
    MAX_REQUEST_BYTES,
    MAX_TXN_OPS,
    Compare,
    Delete,
    DeletePrefix,
    ModRevisionAtMost,
    Op,
    Put,
    Store,
    op_size,
)

__all__ = ["chunks", "commit", "drop_repeated_deletes", "split_ops"]


async def commit(
    store: Store, keys: Keyspace, leadership: Leadership, view: JobView, ops: list[Op], ev: list[Put]
) -> int | None:
    """Apply one pass's writes (``ops`` under ``jobs/``, events ``ev``) as above.

    Returns the revision of the last write under ``jobs/`` (the next pass must see it; 0 when it
    wrote only events), or None when
    the job changed underneath, before or between the fenced transactions: the caller runs the pass
    again. Raises FenceLost when a write was refused because this coordinator no longer holds the
    leader key.
    """
    assert view.spec is not None
    fence: list[Compare] = [
        leadership.fence(),
        ModRevisionAtMost(keys.job_prefix(view.spec.name), view.revision, is_prefix=True),
    ]
    run = RunRef(view.spec.name, view.spec.uid)
    own = frozenset({keys.recovery(run), keys.status(run), keys.history(run)})
    head, tail = split_ops(drop_repeated_deletes(ops), budget=MAX_TXN_OPS, bytes_budget=MAX_REQUEST_BYTES, first=own)
    if not tail and len(head) + len(ev) <= MAX_TXN_OPS and _size([*head, *ev]) <= MAX_REQUEST_BYTES:
        head, ev = [*head, *ev], []  # the usual case: events commit with the change they describe
    result = await store.txn(fence, head)
    if not result.succeeded:
        await leadership.check()
        return None  # the job changed under us: drop this pass and run it again on a fresh read
    # Only a write under jobs/ comes back through the coordinator's watch (events do not): a pass
    # that wrote nothing there has nothing for the next view to wait for.
    written = result.revision if ops else 0
    # What did not fit: the rest of this pass's puts, fenced by the leader key and by the
    # recovery record still being the one just written (a later pass owns it otherwise).
    follow: list[Compare] = [leadership.fence(), ModRevisionAtMost(keys.recovery(run), result.revision)]
    for chunk in chunks(tail, MAX_TXN_OPS, MAX_REQUEST_BYTES):
        followed = await store.txn(follow, chunk)
        if not followed.succeeded:
            await leadership.check()
            return None
        written = followed.revision
    # Events live outside jobs/: only the leader key fences them.
    for chunk in chunks(ev, MAX_TXN_OPS, MAX_REQUEST_BYTES):
        if not (await store.txn(fence[:1], chunk)).succeeded:
            await leadership.check()
    return written


def drop_repeated_deletes(ops: list[Op]) -> list[Op]:
    """``ops`` without the deletes etcd would refuse: a transaction may not touch one key twice, so
    deletes that a prefix delete covers, that a put of the same key supersedes, or that repeat an
    earlier delete are dropped."""
    prefixes = [op.prefix for op in ops if isinstance(op, DeletePrefix)]
    written = {op.key for op in ops if isinstance(op, Put)}
    kept: list[Op] = []
    deleted: set[str] = set()
    for op in ops:
        if isinstance(op, Delete):
            if op.key in written or op.key in deleted or any(op.key.startswith(p) for p in prefixes):
                continue
            deleted.add(op.key)
        kept.append(op)
    return kept


def split_ops(
    ops: list[Op], *, budget: int, bytes_budget: int, first: frozenset[str] = frozenset()
) -> tuple[list[Op], list[Op]]:
    """The ops of the fenced transaction (within both budgets) and the rest.

    In priority order: puts of the keys in ``first`` (the coordinator's own records), then deletes
    (the keys the pass consumed, so they are consumed exactly once, with the read), then the other
    puts (commands, signals), which may follow in later transactions.
    """

    def priority(op: Op) -> int:
        if isinstance(op, Put):
            return 0 if op.key in first else 2
        return 1

    ordered = sorted(ops, key=priority)  # stable: the pass's own order within a priority
    head: list[Op] = []
    size = 0
    for i, op in enumerate(ordered):
        grown = size + op_size(op)
        if len(head) >= budget or (head and grown > bytes_budget):
            return head, ordered[i:]
        head.append(op)
        size = grown
    return head, []


def chunks(ops: list[Op] | list[Put], budget: int, bytes_budget: int) -> list[list[Op]]:
    """``ops`` in order, cut into transactions within both budgets."""
    out: list[list[Op]] = []
    rest: list[Op] = list(ops)
    while rest:
        head, rest = split_ops(rest, budget=budget, bytes_budget=bytes_budget)
        out.append(head)
    return out


def _size(ops: list[Op] | list[Put]) -> int:
    return sum(op_size(op) for op in ops)
