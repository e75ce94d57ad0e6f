"""asyncio helpers that work around Python 3.11 defects (docs/adr/0008).

``supervised_group`` is ``asyncio.TaskGroup`` for a parent that carries on after its children
failed (the coordinator campaigns again after losing leadership). On CPython 3.11, a child that
fails while the parent already waits in ``TaskGroup.__aexit__`` cancels the parent and the group
never uncancels it (fixed in 3.12): the parent's next await of anything raises CancelledError and
the service silently stops. The wrapper restores the parent's cancellation count when the group
ends with its children's errors, never when the parent itself was cancelled.

``ctrl_c_interrupts`` makes Ctrl-C end a command-line program whose loop is idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

T = TypeVar("T")

__all__ = ["ctrl_c_interrupts", "leaf_errors", "supervised_group"]


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


async def ctrl_c_interrupts(body: Awaitable[T]) -> T:
    """Await ``body``; Ctrl-C (SIGINT) cancels it and raises KeyboardInterrupt, however idle the loop.

    ``asyncio.run`` installs its SIGINT handler with ``signal.signal`` alone. The kernel may deliver
    SIGINT to any thread: to one of gRPC's, the main thread stays asleep in ``epoll_wait`` and
    the handler runs only at the next I/O. A ``recoverctl events --follow`` whose job has ended
    gets none, so it ignored Ctrl-C for good (make test saw it wait 30 s, issue 25).
    ``loop.add_signal_handler`` also sets the wakeup fd, so the loop wakes whichever thread
    took the signal.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(body)
    interrupted = False

    def on_sigint() -> None:
        nonlocal interrupted
        interrupted = True
        task.cancel()

    loop.add_signal_handler(signal.SIGINT, on_sigint)
    try:
        return await task
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGINT)
