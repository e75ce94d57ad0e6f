"""asyncio helpers that work around Python 3.11 defects (docs/adr/0008).

``supervised_group`` is ``asyncio.TaskGroup`` for a parent that carries on after its children
failed (the coordinator campaigns again after losing leadership). On CPython 3.11, a child that
fails while the parent already waits in ``TaskGroup.__aexit__`` cancels the parent and the group
never uncancels it (fixed in 3.12): the parent's next await of anything raises CancelledError and
the service silently stops. The wrapper restores the parent's cancellation count when the group
ends with its children's errors, never when the parent itself was cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["leaf_errors", "supervised_group"]


@contextlib.asynccontextmanager
async def supervised_group() -> AsyncIterator[asyncio.TaskGroup]:
    task = asyncio.current_task()
    assert task is not None, "supervised_group needs a running task"
    baseline = task.cancelling()
    try:
        async with asyncio.TaskGroup() as group:
            yield group
    except BaseExceptionGroup:
        while task.cancelling() > baseline:
            task.uncancel()
        raise


def leaf_errors(group: BaseExceptionGroup) -> list[BaseException]:
    """Every exception in a (nested) exception group, flattened."""
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(leaf_errors(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out
