"""``msrun`` without MindSpore: a test double of MindSpore 2.10.0's launcher entry point.

Usage (from the repository root)::

    python -m tests.msrun_port.fake_msrun --worker_num N --local_worker_num N [--node_rank R] \\
        --log_dir D --master_port P [--master_addr A] [--join True] SCRIPT [ARGS...]

It follows ``/work/shared/reference/msrun-contract.md`` sections 2-3 and 6 (no MindSpore code is
copied):

* ``main`` mirrors ``run.py:247-262``: build the process manager, run it, and let the interpreter
  turn the outcome into the exit status (a plain return 0, an exception 1, ``sys.exit(n)`` n,
  Ctrl-C death by SIGINT);
* ``tft_enabled`` mirrors ``utils.py:68-79, 134-136``: one of ``TTP:1 UCE:1 ARF:1 TSP:1 HCCE:1
  RSC:1`` must occur as a plain substring of ``MS_ENABLE_TFT`` (stripped);
* ``check_taskd`` mirrors ``_check_taskd`` (``_api.py:228-248``) and ``RSCPluginHandle``
  (``utils.py:142-191``): first the agent module ``taskd.api.taskd_agent_api`` (only
  ``ImportError`` is caught, so any other import error kills msrun with exit 1), then the legacy
  ``taskd.python.framework.agent.ms_mgr.msrun_plugin.MSRunPlugin`` (any exception while importing,
  constructing or registering means plain mode).

In mindx mode nothing is cleaned up when the plugin's ``start()`` ends, exactly like msrun: the
scheduler, workers and ``tail -f`` followers are orphaned unless the plugin stops them. Plain mode
starts the workers, joins them (always, unlike msrun's ``--join``) and then stops the scheduler.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from tests.msrun_port.process_manager import Handler, ProcessManager

log = logging.getLogger("msrun_port")

ENABLE_MINDX = ("TTP:1", "UCE:1", "ARF:1", "TSP:1", "HCCE:1", "RSC:1")
"""``TFTCommValue.ENABLE_MINDX``: the flags that hand the processes to TaskD."""


def tft_enabled(value: str | None = None) -> bool:
    """``RSCPluginHandle.check_enable``: a plain substring test on ``MS_ENABLE_TFT`` (``{TTP: 1}`` is off)."""
    tft = (os.getenv("MS_ENABLE_TFT", "") if value is None else value).strip()
    return any(flag in tft for flag in ENABLE_MINDX)


class AgentHandle:
    """The agent path's ``RSCPluginHandle.start``: ``start_taskd_agent()`` with no arguments."""

    def __init__(self, start_taskd_agent: Callable[[], Any]) -> None:
        self._start = start_taskd_agent

    def start(self) -> Any:
        return self._start()


def _register_by_agent(manager: ProcessManager) -> Handler | None:
    """``utils.py:142-163``. Only ``ImportError`` is caught around the import (line 149)."""
    try:
        from taskd.api.taskd_agent_api import (  # type: ignore[import-not-found]
            init_taskd_agent,
            register_func,
            start_taskd_agent,
        )
    except ImportError:
        return None
    try:
        if not init_taskd_agent({"Framework": "MindSpore"}):
            return None
        for name, func in manager.callbacks().items():
            register_func(name, func)
    except Exception as err:
        log.warning("Register callbacks to taskd agent failed: %r", err)
        return None
    return AgentHandle(start_taskd_agent)


def _register_by_plugin(manager: ProcessManager) -> Handler | None:
    """``utils.py:165-181``: import and construction share one broad ``except``; so does registering."""
    try:
        from taskd.python.framework.agent.ms_mgr.msrun_plugin import (  # type: ignore[import-not-found]
            MSRunPlugin,
        )

        plugin = MSRunPlugin()
    except Exception as err:
        log.warning("Import mindx failed: %s, process controlled by msrun.", err)
        return None
    try:
        for name, func in manager.callbacks().items():
            plugin.register_callbacks(name, func)
    except Exception as err:
        log.warning("Register callbacks to MSRunPlugin failed: %r", err)
        return None
    return plugin


def check_taskd(manager: ProcessManager) -> Handler | None:
    """``_check_taskd``: the handler that will own the workers, or None for plain msrun."""
    if not tft_enabled():
        return None
    handler = _register_by_agent(manager)
    if handler is None:
        handler = _register_by_plugin(manager)
    if handler is None:
        log.warning("Register callback to mindx failed, process controlled by msrun.")
        return None
    manager.enable_mindx(handler)
    return handler


def _bool_arg(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {value!r}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """msrun's options (the subset the port implements), with msrun's names and defaults."""
    parser = argparse.ArgumentParser(prog="fake_msrun", description="msrun test double (no MindSpore)")
    parser.add_argument("--worker_num", type=int, default=8)
    parser.add_argument("--local_worker_num", type=int, default=8)
    parser.add_argument("--master_addr", default="127.0.0.1")
    parser.add_argument("--master_port", type=int, default=8118)
    parser.add_argument("--node_rank", type=int, default=-1)
    parser.add_argument("--log_dir", default=".")
    parser.add_argument("--join", type=_bool_arg, default=False)
    parser.add_argument("--cluster_time_out", type=int, default=600)
    parser.add_argument("task_script")
    parser.add_argument("task_script_args", nargs=argparse.REMAINDER)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """``run.py:main``: build the manager (which checks for TaskD last), then run it."""
    logging.basicConfig(level=logging.INFO, format="[fake_msrun %(levelname)s] %(message)s")
    args = parse_args(argv)
    manager = ProcessManager(
        args.task_script,
        args.task_script_args,
        worker_num=args.worker_num,
        local_worker_num=args.local_worker_num,
        node_rank=args.node_rank,
        log_dir=args.log_dir,
        master_addr=args.master_addr,
        master_port=args.master_port,
        join=args.join,
        cluster_time_out=args.cluster_time_out,
    )
    handler = check_taskd(manager)
    if handler is not None:
        manager.run(handler)  # mindx mode: whatever start() does decides the exit; no cleanup
        return
    try:
        manager.run()
    finally:
        manager.cleanup()


if __name__ == "__main__":
    main()
