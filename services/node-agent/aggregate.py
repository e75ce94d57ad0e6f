"""How a node agent answers for the recovery clients of its ranks: pure rules, no I/O, no clock.

Ranks join the protocol through their node's agent (docs/adr/0036, ``rankclients.py`` is the
shell); the agent then writes one report per phase for all of them, so a recovery's etcd writes
follow the nodes, not the ranks. The rules:

* **Declaration** (:func:`declaration`): once every rank of the node has joined, the node
  declares the strategies that it and every rank can carry out. Before that its ranks are plain
  processes, and unless they can rejoin their group alone (``rejoins_alone``: independent ranks,
  or a runtime whose framework rejoins) `recover-in-place` is left out (docs/adr/0041).
  A rank's offer is kept across its restarts (a rank that is restarting has not withdrawn it); an
  agent carries out its own strategies and relays :data:`~recoverd.strategies.RELAYED_TO_RANKS`
  to the ranks. A node that holds no rank does not rule out what only ranks carry out.
* **A round** (:class:`Round`) is one phase's answer for the node. STOPPING: every joined rank that
  is not faulty acknowledged the stop (a rank that leaves meanwhile is stopped too). RECOVERING
  with a strategy carried out by the ranks (:data:`~recoverd.strategies.CARRIED_OUT_BY_RANKS`: a
  dump, a downgrade, the upgrade after it): every joined rank that is not faulty carried it out;
  any failure, a rank that leaves, a running rank that never joined, or the round's deadline fails
  it at once.

Time is an input (``now``, the agent's monotonic clock).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from recoverd.codes import Code
from recoverd.strategies import ALL_STRATEGIES, CARRIED_OUT_BY_RANKS, RELAYED_TO_RANKS

__all__ = ["Outcome", "Round", "declaration", "open_round"]


def declaration(
    agent_offer: Sequence[str],
    offers: Mapping[int, Sequence[str]],
    held: Collection[int],
    *,
    rejoins_alone: bool = True,
) -> tuple[tuple[str, ...], bool]:
    """(strategies, answers_for_ranks) for the node record, given the ranks it holds (``held``)
    and the offers of the ranks that joined (kept while a rank restarts).

    * Every held rank has joined: the node answers for them, and declares what the agent (with
      what it relays) and every one of them can do, in :data:`ALL_STRATEGIES` order.
    * Some have not (yet): the node speaks for none and declares the agent's own offer, less
      `recover-in-place` unless ``rejoins_alone``: a plain rank restarted alone cannot rejoin a
      running group. Answering for some ranks only would leave the others out of a stop or a dump.
    * It holds no rank (an idle spare): nothing of a strategy the ranks carry out is its to do,
      so it does not rule one out (the coordinator's answer for the uninvolved agents is the
      intersection of every declaration): it declares those too.
    """
    if not held:
        return tuple(s for s in ALL_STRATEGIES if s in set(agent_offer) | RELAYED_TO_RANKS), False
    if not set(held) <= offers.keys():
        return tuple(s for s in agent_offer if rejoins_alone or s != "recover-in-place"), False
    can = set(agent_offer) | RELAYED_TO_RANKS
    for rank in held:
        can &= set(offers[rank])
    return tuple(s for s in ALL_STRATEGIES if s in can), True


class Outcome(StrEnum):
    """Where a round stands. PENDING: some rank has yet to answer; OK: every rank it waits for
    answered 0; FAILED: a rank failed, left, never joined, or the deadline passed."""

    PENDING = "PENDING"
    OK = "OK"
    FAILED = "FAILED"


@dataclass(frozen=True, slots=True)
class Round:
    """One phase's answer for the node: the ranks it waits for, those that answered, and the first
    failure (which decides the round: later answers change nothing)."""

    #: (epoch, uuid, phase): one round per phase of a recovery.
    key: tuple[int, str, str]
    #: STOPPING or RECOVERING.
    phase: str
    strategy: str
    expected: frozenset[int]
    deadline: float
    answered: frozenset[int] = frozenset()
    failure: str = ""
    code: int = 0

    def answer(self, rank: int, code: int, message: str) -> Round:
        """Rank ``rank`` answered; a rank the round does not wait for changes nothing."""
        if self.failure or rank not in self.expected or rank in self.answered:
            return self
        if code != 0:
            return dataclasses.replace(self, failure=f"rank {rank}: {message or f'code {code}'}", code=code)
        return dataclasses.replace(self, answered=self.answered | {rank})

    def departed(self, rank: int) -> Round:
        """Rank ``rank`` left (its process ended, or its connection closed): stopped, for a STOPPING
        round; for a strategy it was carrying out, a failure."""
        if self.failure or rank not in self.expected or rank in self.answered:
            return self
        if self.phase == "STOPPING":
            return dataclasses.replace(self, answered=self.answered | {rank})
        return dataclasses.replace(self, failure=f"rank {rank} left before answering", code=Code.CLIENT_ERROR)

    def outcome(self, now: float) -> tuple[Outcome, int, str]:
        """(outcome, report code, message)."""
        if self.failure:
            return Outcome.FAILED, self.code or Code.CLIENT_ERROR, self.failure
        if self.answered >= self.expected:
            return Outcome.OK, 0, ""
        if now >= self.deadline:
            missing = sorted(self.expected - self.answered)
            return Outcome.FAILED, Code.CLIENT_ERROR, f"ranks {missing} did not answer {self.phase} in time"
        return Outcome.PENDING, 0, ""


def open_round(
    key: tuple[int, str, str],
    phase: str,
    strategy: str,
    *,
    joined: Collection[int],
    running: Collection[int],
    faulty: Collection[int],
    deadline: float,
) -> Round:
    """The round for a phase: it waits for the joined ranks that are not faulty. In RECOVERING, a
    local rank that runs but has not joined fails it at once (its part would not be carried out)."""
    expected = frozenset(joined) - frozenset(faulty)
    rnd = Round(key, phase, strategy, expected, deadline)
    if phase == "RECOVERING":
        if strategy not in CARRIED_OUT_BY_RANKS:
            raise ValueError(f"strategy {strategy!r} is not carried out through the ranks")
        silent = sorted(set(running) - set(joined) - set(faulty))
        if silent:
            return dataclasses.replace(
                rnd, failure=f"ranks {silent} run but have not joined the protocol", code=Code.CLIENT_ERROR
            )
    elif phase != "STOPPING":
        raise ValueError(f"no round in phase {phase}")
    return rnd
