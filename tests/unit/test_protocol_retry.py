"""RecoveryProtocol's retry through the agents (docs/adr/0036): the handoff between the link's
thread (recoverd's signal) and the training thread (the fault, the next generation), with stand-ins
for the membership, the trainer and the agent link: no etcd, no torch group here; the end-to-end
run with real ranks is tests/integration/test_pytorch.py."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed")

from recoverd.rankwire import RankFault, Signal
from taskd_client.pytorch.protocol import RecoveryProtocol


@dataclass
class _Membership:
    aborted: list[int] = field(default_factory=list)
    rank: int = 2

    def abort(self, number: int, why: str) -> None:
        self.aborted.append(number)

    def is_aborted(self, number: int) -> bool:
        return number in self.aborted


@dataclass
class _Group:
    generation: int = 5


@dataclass
class _Trainer:
    group: _Group = field(default_factory=_Group)
    world_size: int = 4
    step: int = 20

    def regroup(self, why: str) -> None:
        self.group.generation += 1


@dataclass
class _Link:
    sent: list[RankFault] = field(default_factory=list)
    joined: bool = True

    def report_fault(self, fault: RankFault) -> bool:
        self.sent.append(fault)
        return self.joined


def _protocol(offer: tuple[str, ...] = ("retry", "recover-in-place", "exit"), timeout_s: float = 5.0) -> Any:
    protocol = RecoveryProtocol(offer=offer, via_agent=True, confirm_timeout_s=timeout_s)
    protocol._membership = _Membership()
    protocol._trainer = _Trainer()
    protocol.link = _Link()
    return protocol


def _retry(uuid: str = "u-1") -> Signal:
    return Signal(f"3.RECOVERING.{uuid}", "change", "retry", uuid, (2,))


class _Replies:
    def __init__(self) -> None:
        self.got: list[tuple[int, str]] = []

    def __call__(self, code: int, message: str) -> None:
        self.got.append((code, message))


def test_a_retry_aborts_the_generation_the_rank_is_in_and_answers_once_the_next_is_formed() -> None:
    protocol = _protocol()
    trainer = protocol._trainer
    reply = _Replies()
    protocol._on_agent_signal(_retry(), reply)
    assert protocol._membership.aborted == [5]
    protocol.before_step(trainer)  # still in generation 5 (its group re-forms on the abort)
    assert reply.got == [] and trainer.group.generation == 6
    protocol.before_step(trainer)
    assert reply.got == [(0, "")]


def test_a_retry_signal_repeated_while_it_is_carried_out_aborts_nothing_more() -> None:
    protocol = _protocol()
    trainer = protocol._trainer
    first, again = _Replies(), _Replies()
    protocol._on_agent_signal(_retry(), first)
    trainer.group.generation = 6  # re-formed, not yet at a step
    protocol._on_agent_signal(_retry(), again)  # the agent restarted and signals again
    assert protocol._membership.aborted == [5]  # generation 6, just formed, is not aborted
    protocol.before_step(trainer)
    assert again.got == [(0, "")] and first.got == []  # the live connection's signal is answered
    done = _Replies()
    protocol._on_agent_signal(_retry(), done)  # once more, after it was carried out
    assert done.got == [(0, "")] and protocol._membership.aborted == [5]


def test_a_rank_between_generations_aborts_none() -> None:
    protocol = _protocol()
    protocol._trainer.group.generation = -1
    reply = _Replies()
    protocol._on_agent_signal(_retry(), reply)
    assert protocol._membership.aborted == []
    protocol._trainer.group.generation = 7
    protocol.before_step(protocol._trainer)
    assert reply.got == [(0, "")]


def test_the_faulty_rank_waits_for_recoverds_retry() -> None:
    protocol = _protocol()
    fault = RuntimeError("simulated uncorrectable memory error")
    fault.fault_type = "2"  # type: ignore[attr-defined]
    reply = _Replies()
    timer = threading.Timer(0.05, protocol._on_agent_signal, (_retry(), reply))
    timer.start()
    said = protocol.retry_decided(protocol._trainer, fault)
    timer.join()
    assert said.startswith("recoverd decided retry after ")
    (sent,) = protocol.link.sent
    assert sent.fault_type == "2" and sent.fault_id == "g5s20n1" and "memory error" in sent.detail


def test_without_retry_in_its_offer_or_an_agent_the_rank_rolls_back_at_once() -> None:
    protocol = _protocol(offer=("elastic-training", "dump", "exit"))
    assert protocol.retry_decided(protocol._trainer, RuntimeError("x")) == ""
    assert protocol.link.sent == []  # recoverd would only restart it: not asked
    unjoined = _protocol()
    unjoined.link.joined = False
    assert "not joined" in unjoined.retry_decided(unjoined._trainer, RuntimeError("x"))


def test_no_decision_in_time_rolls_back_alone() -> None:
    protocol = _protocol(timeout_s=0.05)
    assert protocol.retry_decided(protocol._trainer, RuntimeError("x")).startswith("no decision from recoverd")
