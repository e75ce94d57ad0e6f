"""TaskD's ``MSRunPlugin``, as MindSpore's msrun loads it, backed by recoverd's node agent.

msrun (2.7-2.10) imports this class when ``MS_ENABLE_TFT`` enables MindX, constructs it with no
arguments, registers its four callbacks and calls :meth:`start`, which supervises this node's workers
until the job ends and then ends msrun with the job's status (reference/msrun-contract.md). The work
is done by :func:`recoverd.agent.plugin.run_msrun_plugin`; the environment it reads is documented
there and in docs/compat.md.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NoReturn

from recoverd.agent.msrun import CALLBACKS

__all__ = ["MSRunPlugin"]


class MSRunPlugin:
    def __init__(self) -> None:
        self._callbacks: dict[str, Callable[..., Any]] = {}

    def register_callbacks(self, operator: str, func: Callable[..., Any]) -> None:
        """Keep one of msrun's callbacks: KILL_WORKER, START_ALL_WORKER, START_WORKER_LIST, MONITOR."""
        if operator not in CALLBACKS:
            raise ValueError(f"unknown msrun callback {operator!r}; expected one of {', '.join(CALLBACKS)}")
        if not callable(func):
            raise TypeError(f"callback {operator} must be callable, not {type(func).__name__}")
        self._callbacks[operator] = func

    def start(self) -> NoReturn:
        """Supervise the job; never returns: msrun exits with 0 only when every rank finished 0."""
        from recoverd.agent.plugin import run_msrun_plugin  # imported late: msrun imports us early

        sys.exit(run_msrun_plugin(self._callbacks))
