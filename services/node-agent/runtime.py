"""What the agent needs from whatever runs its ranks: the mechanism behind the agent's policy.

Two implementations: :class:`~recoverd.agent.launcher.Launcher` starts rank processes itself
(``recoverd agent`` / ``run``); :class:`~recoverd.agent.msrun.MsrunRuntime` drives MindSpore's
msrun through its four callbacks (``MSRunPlugin``). The agent never cares which.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from recoverd.agent.launcher import ExitInfo, RankLaunch, RankProcess

__all__ = ["OnExit", "RankRuntime", "RuntimeFactory"]

#: Called once per exit of a process the runtime started, from the event loop.
OnExit = Callable[[RankProcess, ExitInfo], None]


class RankRuntime(Protocol):
    #: Whether ranks of other nodes can be started here (a `recover` moves ranks to a spare).
    starts_any_rank: bool
    #: Whether a rank restarted alone goes on with its running peers though it runs no recoverd
    #: client: its framework rejoins by itself (msrun's MindSpore, processes adopted from
    #: reset_process) or its ranks are simulated. False for a plain command: a plain script's rank
    #: restarted alone waits in init_process_group for peers that never come (docs/adr/0041).
    rejoins_alone: bool

    @property
    def processes(self) -> frozenset[RankProcess]:
        """The incarnations still running."""
        ...

    def start(self, launch: RankLaunch) -> RankProcess:
        """Start one incarnation of a rank; raise LaunchFailed when it cannot be started."""
        ...

    async def stop(self, proc: RankProcess, grace_s: float) -> ExitInfo:
        """Stop one incarnation (gracefully first, within ``grace_s``); idempotent."""
        ...

    async def watch(self) -> None:
        """Run for the agent's lifetime if the runtime needs a task to notice exits; else return."""
        ...

    def kill_strays(self) -> list[int]:
        """At the agent's end: kill what the ranks left behind; return the pids killed."""
        ...

    def reap_strays(self) -> list[int]:
        """On SIGCHLD: reap zombies that are not ranks (only where the runtime owns the children)."""
        ...


RuntimeFactory = Callable[[OnExit, Callable[[], set[int]]], RankRuntime]
