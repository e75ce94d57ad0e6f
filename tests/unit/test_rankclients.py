"""The agent's end of the ranks' protocol socket (agent/rankclients.py) with real sockets, no etcd.

The test process plays rank 0 (its slot's process is this process, so its join is the rank's
own) through a real ``AgentLink``; the agent's ``answer`` is asked each time the shell would (on
every wake-up). Waits are on conditions (an event set by ``wake``), never on sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import Callable

from recoverd.agent.launcher import RankProcess
from recoverd.agent.rankclients import RankClients
from recoverd.agent.ranktable import RankSlot
from recoverd.codes import Code
from recoverd.rankwire import Signal
from taskd_client.agentlink import AgentLink, Reply

AGENT = ("recover-in-place", "recover", "exit")


def _slot(rank: int, loop: asyncio.AbstractEventLoop, pid: int) -> RankSlot:
    proc = RankProcess(rank=rank, pid=pid, pgid=pid, started_at=0.0, log_path=None, exited=loop.create_future())
    return RankSlot(rank, rank, proc=proc)


class _Agent:
    """RankClients as the agent holds it, with a wake-up the test can wait on."""

    def __init__(self, slots: dict[int, RankSlot], round_timeout_s: float = 30.0, address: str = "") -> None:
        self.woken = asyncio.Event()
        self.notes: list[tuple[str, str]] = []
        self.clients = RankClients(
            address or f"@recoverd-test-{secrets.token_hex(6)}",
            slots=lambda: slots,
            wake=self.woken.set,
            note=lambda reason, message: self.notes.append((reason, message)),
            round_timeout_s=round_timeout_s,
        )
        self.clients.open()

    async def until(self, what: Callable[[], object], timeout_s: float = 10.0) -> object:
        """Wait until ``what()`` is truthy: checked at each wake-up of the agent, and every 50 ms
        for what wakes nobody (a refused join)."""
        async with asyncio.timeout(timeout_s):
            while not (found := what()):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.woken.wait(), 0.05)
                self.woken.clear()
        return found


def _link(
    address: str, handler: Callable[[Signal, Reply], None], offer: tuple[str, ...] = ("dump", "exit")
) -> AgentLink:
    link = AgentLink(0, offer, handler, address=address)
    link.start()
    return link


async def test_a_dump_round_is_answered_once_the_rank_answered() -> None:
    loop = asyncio.get_running_loop()
    agent = _Agent({0: _slot(0, loop, os.getpid())})
    serving = asyncio.create_task(agent.clients.serve())
    seen: list[Signal] = []
    link = _link(agent.clients.address, lambda signal, reply: (seen.append(signal), reply(0, "")))
    try:
        await agent.until(lambda: agent.clients.declaration(AGENT)[1])
        assert agent.clients.declaration(AGENT) == (("dump", "exit"), True)
        key = (4, "u-4", "RECOVERING")
        answer = await agent.until(lambda: agent.clients.answer(key, "RECOVERING", "dump", "u-4", [3]))
        assert answer == (0, "")
        assert [(s.kind, s.strategy, s.uuid, s.fault_ranks) for s in seen] == [("change", "dump", "u-4", (3,))]
    finally:
        link.close()
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


async def test_a_rank_that_never_answers_fails_the_round_at_its_deadline() -> None:
    loop = asyncio.get_running_loop()
    agent = _Agent({0: _slot(0, loop, os.getpid())}, round_timeout_s=0.3)
    serving = asyncio.create_task(agent.clients.serve())
    link = _link(agent.clients.address, lambda signal, reply: None)  # never answers
    try:
        await agent.until(lambda: agent.clients.declaration(AGENT)[1])
        key = (4, "u-4", "STOPPING")
        assert agent.clients.answer(key, "STOPPING", "", "u-4", []) is None
        code, message = await agent.until(lambda: agent.clients.answer(key, "STOPPING", "", "u-4", []))  # type: ignore[misc]
        assert code == Code.CLIENT_ERROR and "did not answer STOPPING in time" in message
    finally:
        link.close()
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


async def test_a_rank_joins_a_restarted_agent_again_and_answers_it() -> None:
    """ADR 0023 from the socket's side: the agent goes away (its listening socket and the rank's
    connection close), a new one binds the same name; the rank's link reconnects and joins again
    by itself, and answers the new agent's round."""
    loop = asyncio.get_running_loop()
    slots = {0: _slot(0, loop, os.getpid())}
    agent = _Agent(slots)
    serving = asyncio.create_task(agent.clients.serve())
    answered: list[str] = []

    def answer(signal: Signal, reply: Reply) -> None:
        answered.append(signal.signal_id)
        reply(0, "")

    link = _link(agent.clients.address, answer)
    again: asyncio.Task[None] | None = None
    try:
        await agent.until(lambda: agent.clients.declaration(AGENT)[1])
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)  # the agent is gone; its name is free
        restarted = _Agent(slots, address=agent.clients.address)
        again = asyncio.create_task(restarted.clients.serve())
        await restarted.until(lambda: restarted.clients.declaration(AGENT)[1])
        key = (6, "u-6", "STOPPING")
        assert await restarted.until(lambda: restarted.clients.answer(key, "STOPPING", "", "u-6", [])) == (0, "")
        assert answered == ["6.STOPPING.u-6"]
    finally:
        link.close()
        for task in (serving, again):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


async def test_a_join_for_another_ranks_process_is_refused_and_recorded_once() -> None:
    loop = asyncio.get_running_loop()
    agent = _Agent({0: _slot(0, loop, 1)})  # rank 0 is pid 1's, not this process's
    serving = asyncio.create_task(agent.clients.serve())
    link = _link(agent.clients.address, lambda signal, reply: reply(0, ""))
    try:
        await agent.until(lambda: agent.clients.dropped)
        assert not agent.clients.joined and agent.clients.declaration(AGENT) == (AGENT, False)
        assert len(agent.notes) == 1 and "join as rank 0 refused" in agent.notes[0][1]
    finally:
        link.close()
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
