"""An agent answering for its ranks' clients (docs/adr/0036): the pure rules and the wire format.

``aggregate.py`` decides the node's declaration and each phase's one answer from its ranks'
answers; ``rankwire.py`` is what ranks and agents may send each other (untrusted both ways). The
coordinator's side (who must report, which answers it gives itself) is pinned here too, so that
both ends of the rule change together.
"""

from __future__ import annotations

import json

import pytest

from recoverd import participants
from recoverd.agent.aggregate import Outcome, declaration, open_round
from recoverd.codes import Code
from recoverd.coordinator.inputs import RecoverStatusReported, StopCompleted, StrategiesReported
from recoverd.coordinator.model import FaultInfo, Phase, Recovery
from recoverd.coordinator.observe import implied_answers, live_participants
from recoverd.errors import BadRecord
from recoverd.jobview import JobView
from recoverd.rankwire import (
    MAX_MESSAGE,
    Answer,
    Join,
    RankFault,
    Signal,
    encode_answer,
    encode_fault,
    encode_join,
    encode_signal,
    parse_from_agent,
    parse_from_rank,
)
from recoverd.records import pb

AGENT = ("recover-in-place", "recover", "exit")
KEY = (3, "u-1", "STOPPING")


# ---------------------------------------------------------------- declaration
def test_an_agent_without_joined_ranks_declares_its_own_strategies() -> None:
    assert declaration(AGENT, {}, {0, 1}) == (AGENT, False)


def test_a_node_speaks_for_its_ranks_only_once_every_one_has_joined() -> None:
    # Rank 1 has not joined (yet): the node answers for none of them.
    assert declaration(AGENT, {0: ("dump", "exit")}, {0, 1}) == (AGENT, False)
    # An offer of a rank the node no longer holds (moved away) does not count.
    assert declaration(AGENT, {0: ("dump", "exit"), 7: ("exit",)}, {0}) == (("dump", "exit"), True)


def test_a_node_declares_what_it_and_every_joined_rank_can_do() -> None:
    both = {0: ("dump", "exit"), 1: ("dump", "exit", "elastic-training")}
    # dump and elastic-training are relayed to the ranks: each only where every rank offers it.
    assert declaration(AGENT, both, {0, 1}) == (("dump", "exit"), True)
    assert declaration(AGENT, {1: both[1]}, {1}) == (("elastic-training", "dump", "exit"), True)
    # retry is relayed too: a node offers it where every rank does (retry comes first in the ladder).
    assert declaration(AGENT, {0: ("retry", "dump")}, {0}) == (("retry", "dump"), True)
    # One rank that cannot dump takes dump away from the whole node.
    assert declaration(AGENT, {**both, 2: ("exit",)}, {0, 1, 2}) == (("exit",), True)
    # A rank's offer of an agent strategy counts only where the agent can do it.
    assert declaration(("recover-in-place", "exit"), {0: ("recover", "recover-in-place")}, {0}) == (
        ("recover-in-place",),
        True,
    )


def test_a_node_holding_no_rank_does_not_rule_out_what_ranks_carry_out() -> None:
    # An idle spare: the intersection of every node's declaration keeps dump and elastic-training.
    assert declaration(AGENT, {}, ()) == (
        ("retry", "recover-in-place", "recover", "elastic-training", "dump", "exit"),
        False,
    )
    assert declaration(AGENT, {0: ("exit",)}, ())[1] is False


# ---------------------------------------------------------------- rounds
def test_stopping_waits_for_every_joined_rank_that_is_not_faulty() -> None:
    rnd = open_round(KEY, "STOPPING", "", joined={0, 1, 2}, running={0, 1, 2, 3}, faulty={2}, deadline=10.0)
    assert rnd.expected == {0, 1}  # rank 3 runs no client: nothing to wait for in STOPPING
    assert rnd.outcome(1.0)[0] is Outcome.PENDING
    rnd = rnd.answer(0, 0, "")
    assert rnd.outcome(1.0)[0] is Outcome.PENDING
    rnd = rnd.departed(1)  # a rank that died is stopped
    assert rnd.outcome(1.0) == (Outcome.OK, 0, "")


def test_a_dump_fails_at_once_when_a_rank_fails_or_leaves() -> None:
    rnd = open_round((3, "u", "RECOVERING"), "RECOVERING", "dump", joined={0, 1}, running={0, 1}, faulty=(), deadline=9)
    failed = rnd.answer(1, Code.DUMP_ERROR, "disk full")
    assert failed.outcome(1.0) == (Outcome.FAILED, Code.DUMP_ERROR, "rank 1: disk full")
    assert failed.answer(0, 0, "").outcome(1.0)[0] is Outcome.FAILED  # the first failure decides
    left = rnd.answer(0, 0, "").departed(1)
    assert left.outcome(1.0) == (Outcome.FAILED, Code.CLIENT_ERROR, "rank 1 left before answering")
    assert rnd.answer(0, 0, "").answer(1, 0, "").outcome(1.0) == (Outcome.OK, 0, "")


def test_a_running_rank_that_never_joined_fails_a_dump() -> None:
    rnd = open_round((3, "u", "RECOVERING"), "RECOVERING", "dump", joined={0}, running={0, 1}, faulty=(), deadline=9)
    outcome, code, message = rnd.outcome(0.0)
    assert (outcome, code) == (Outcome.FAILED, Code.CLIENT_ERROR) and "[1]" in message


def test_a_round_fails_at_its_deadline_and_not_before() -> None:
    rnd = open_round(KEY, "STOPPING", "", joined={0, 1}, running={0, 1}, faulty=(), deadline=10.0).answer(0, 0, "")
    assert rnd.outcome(9.99)[0] is Outcome.PENDING
    outcome, _, message = rnd.outcome(10.0)
    assert outcome is Outcome.FAILED and "[1]" in message


def test_answers_from_ranks_the_round_does_not_wait_for_change_nothing() -> None:
    rnd = open_round(KEY, "STOPPING", "", joined={0}, running={0, 5}, faulty={5}, deadline=10.0)
    assert rnd.answer(5, 1, "no").departed(7) == rnd


@pytest.mark.parametrize("strategy", ["elastic-training", "upgrade"])
def test_a_world_change_waits_for_every_joined_rank_but_the_ones_that_leave_or_return(strategy: str) -> None:
    # A downgrade: ranks 2 and 3 (faulty) are dropped; an upgrade: they come back. Either way the
    # round waits for the other joined ranks, each answering once it trained in the new world.
    rnd = open_round(
        (4, "u", "RECOVERING"), "RECOVERING", strategy, joined={0, 1, 2}, running={0, 1, 2}, faulty={2, 3}, deadline=9
    )
    assert rnd.expected == {0, 1}
    assert rnd.answer(0, 0, "").outcome(1)[0] is Outcome.PENDING
    assert rnd.answer(0, 0, "").answer(1, 0, "").outcome(1) == (Outcome.OK, 0, "")
    failed = rnd.answer(1, Code.CLIENT_ERROR, "no step trained with world [0, 1] within 60s")
    assert failed.outcome(1) == (
        Outcome.FAILED,
        Code.CLIENT_ERROR,
        "rank 1: no step trained with world [0, 1] within 60s",
    )


def test_a_retry_waits_for_every_joined_rank_the_agent_kept_up() -> None:
    """The agent leaves out only the fault ranks it stopped: a rank kept up for a retry (its fault
    retryable, ``aggregate`` is told by leaving it out of ``faulty``) re-runs the step too."""
    rnd = open_round(
        (4, "u", "RECOVERING"), "RECOVERING", "retry", joined={0, 1}, running={0, 1}, faulty=(), deadline=9
    )
    assert rnd.expected == {0, 1}
    assert rnd.answer(0, 0, "").outcome(1)[0] is Outcome.PENDING
    assert rnd.answer(0, 0, "").answer(1, 0, "").outcome(1)[0] is Outcome.OK


def test_no_round_for_a_strategy_the_agents_carry_out_themselves() -> None:
    with pytest.raises(ValueError):
        open_round(KEY, "RECOVERING", "exit", joined={0}, running={0}, faulty=(), deadline=1)
    with pytest.raises(ValueError):
        open_round(KEY, "GLOBAL_FAULT", "", joined={0}, running={0}, faulty=(), deadline=1)


# ---------------------------------------------------------------- the wire
def test_messages_round_trip() -> None:
    assert parse_from_rank(encode_join(3, ("dump", "exit"))) == Join(3, ("dump", "exit"))
    assert parse_from_rank(encode_answer("3.STOPPING.u", 0, "")) == Answer("3.STOPPING.u", 0, "")
    signal = Signal("3.RECOVERING.u", "change", "dump", "u", (1, 2))
    assert parse_from_agent(encode_signal(signal)) == signal
    fault = RankFault("g0s20n1", "2", "link flap on eth1")
    assert parse_from_rank(encode_fault(fault)) == fault


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"[" * 5000,
        b"x" * MAX_MESSAGE,
        b"[]",
        json.dumps({"v": 2, "op": "join", "rank": 0, "offer": []}).encode(),
        json.dumps({"v": 1, "op": "join", "rank": -1, "offer": []}).encode(),
        json.dumps({"v": 1, "op": "join", "rank": True, "offer": []}).encode(),
        json.dumps({"v": 1, "op": "join", "rank": 0, "offer": ["teleport"]}).encode(),
        json.dumps({"v": 1, "op": "join", "rank": 0, "offer": "dump"}).encode(),
        json.dumps({"v": 1, "op": "answer", "id": "", "code": 0}).encode(),
        json.dumps({"v": 1, "op": "answer", "id": "x" * 300, "code": 0}).encode(),
        json.dumps({"v": 1, "op": "answer", "id": "a", "code": 2**40}).encode(),
        json.dumps({"v": 1, "op": "answer", "id": "a", "code": 0, "message": 5}).encode(),
        json.dumps({"v": 1, "op": "signal"}).encode(),
        # A rank reports only a retryable fault of its own, under an id that can go into a key.
        json.dumps({"v": 1, "op": "fault", "id": "a", "type": "1"}).encode(),
        json.dumps({"v": 1, "op": "fault", "id": "a", "type": 0}).encode(),
        json.dumps({"v": 1, "op": "fault", "id": "a", "type": []}).encode(),
        json.dumps({"v": 1, "op": "fault", "id": ["a"], "type": "0"}).encode(),
        json.dumps({"v": 1, "op": "fault", "id": "", "type": "0"}).encode(),
        json.dumps({"v": 1, "op": "fault", "id": "../x", "type": "0"}).encode(),
        json.dumps({"v": 1, "op": "fault", "id": "é", "type": "0"}).encode(),
        json.dumps({"v": 1, "op": "fault", "id": "x" * 65, "type": "0"}).encode(),
        json.dumps({"v": 1, "op": "fault", "id": "a", "type": "0", "detail": ["x"]}).encode(),
    ],
)
def test_a_malformed_rank_message_is_refused_with_a_reason(data: bytes) -> None:
    with pytest.raises(BadRecord):
        parse_from_rank(data)


@pytest.mark.parametrize(
    "fields",
    [
        {"v": 1, "op": "join"},
        {"v": 1, "op": "signal", "kind": "explode"},
        {"v": 1, "op": "signal", "kind": "stop", "fault_ranks": "1"},
        {"v": 1, "op": "signal", "kind": "stop", "fault_ranks": [True]},
        {"v": 1, "op": "signal", "kind": "change", "strategy": 7},
    ],
)
def test_a_malformed_agent_message_is_refused_with_a_reason(fields: dict[str, object]) -> None:
    with pytest.raises(BadRecord):
        parse_from_agent(json.dumps(fields).encode())


# ---------------------------------------------------------------- the coordinator's side
def _view(speaking: tuple[str, ...], nodes: int = 4) -> JobView:
    v = JobView(revision=1)
    for i in range(nodes):
        name = f"n{i}"
        speaks = name in speaking
        strategies = ("dump", "exit") if speaks else AGENT
        v.nodes[name] = pb.NodeRecord(node=name, node_rank=i, strategies=strategies, answers_for_ranks=speaks)
    return v


def _recovery(phase: Phase, **kw: object) -> Recovery:
    return Recovery(phase=phase, epoch=2, recovery_id=1, faults=(FaultInfo("n3.r0", 0, "n3"),), **kw)  # type: ignore[arg-type]


def test_an_agent_that_answers_for_its_ranks_reports_stop_and_a_relayed_strategy() -> None:
    report = participants.agent_reports
    assert report("STOPPING", declared=True, answers_for_ranks=True)
    assert not report("GLOBAL_FAULT", declared=True, answers_for_ranks=True)  # its declaration answers
    assert report("RECOVERING", declared=True, answers_for_ranks=True, strategy="dump")
    assert report("RECOVERING", declared=True, answers_for_ranks=True, strategy="elastic-training")
    assert report("RECOVERING", declared=True, answers_for_ranks=True, strategy="upgrade")
    assert not report("RECOVERING", declared=True, answers_for_ranks=True, strategy="exit")  # its ack answers
    assert not report("RECOVERING", declared=True, answers_for_ranks=False, strategy="dump")


def test_every_node_that_answers_for_ranks_is_a_participant_and_is_waited_for() -> None:
    v = _view(("n0", "n1", "n2", "n3"))
    live = live_participants(v, _recovery(Phase.STOPPING))
    assert live == {"agents", "agent.n0", "agent.n1", "agent.n2", "agent.n3"}
    stopping = _recovery(Phase.STOPPING, participants=live)
    assert implied_answers(v, stopping) == [StopCompleted(2, "agents")]  # each node reports itself
    dumping = _recovery(Phase.RECOVERING, participants=live, strategy="dump")
    assert [a.participant for a in implied_answers(v, dumping)] == ["agents"]  # type: ignore[attr-defined]
    # The strategies come from the declarations, as for any agent: no report per node.
    deciding = _recovery(Phase.GLOBAL_FAULT, participants=live)
    assert StrategiesReported(2, "agent.n0", ("dump", "exit")) in implied_answers(v, deciding)
    # A node whose ranks run no client does not offer dump, so nobody does.
    mixed = _view(("n0", "n1", "n2"))
    agents = [a for a in implied_answers(mixed, deciding) if a.participant == "agents"]  # type: ignore[attr-defined]
    assert agents == [StrategiesReported(2, "agents", ("exit",))]


def test_a_node_that_answers_for_its_ranks_is_not_answered_for_when_its_fault_rank_ended() -> None:
    """ADR 0037's implied stop (the fault rank's process has ended) does not apply: the node's
    other ranks must acknowledge the stop through their agent first."""
    v = _view(("n0", "n1", "n2", "n3"))
    v.ranks["n3"] = pb.NodeRanks(node="n3", ranks=[pb.RankStatus(rank=0, state=pb.RANK_FAILED, generation=0)])
    live = live_participants(v, _recovery(Phase.STOPPING))
    assert implied_answers(v, _recovery(Phase.STOPPING, participants=live)) == [StopCompleted(2, "agents")]
    # The same node without clients of its ranks is answered for at once.
    plain = _view(())
    plain.ranks["n3"] = v.ranks["n3"]
    live = live_participants(plain, _recovery(Phase.STOPPING))
    answers = implied_answers(plain, _recovery(Phase.STOPPING, participants=live))
    assert StopCompleted(2, "agent.n3") in answers


def test_a_downgrade_through_the_agents_waits_for_the_survivors_and_takes_the_dropped_nodes_ack() -> None:
    """The surviving nodes report once their ranks trained in the smaller world; the dropped node
    (RELEASE_RANKS) is answered by its command's ack, even though it answers for its ranks too
    (its agent writes no report for a commanded round: a failed release must not read as done)."""
    v = _view(("n0", "n1", "n2", "n3"))
    live = live_participants(v, _recovery(Phase.STOPPING))
    down = _recovery(Phase.RECOVERING, participants=live, strategy="elastic-training", command_nodes=frozenset({"n3"}))
    assert implied_answers(v, down) == [RecoverStatusReported(2, "agents", 0, "elastic-training")]
    v.acks["n3"] = pb.CommandAck(epoch=2, seq=1, ok=False, detail="rank 0 would not stop")
    assert implied_answers(v, down) == [
        RecoverStatusReported(2, "agent.n3", 1, "elastic-training", "rank 0 would not stop"),
        RecoverStatusReported(2, "agents", 0, "elastic-training"),
    ]


def test_plain_ranks_that_cannot_rejoin_alone_are_not_offered_recover_in_place() -> None:
    """ADR 0041: until its ranks joined through a client, a node of plain ranks that cannot rejoin
    their group alone leaves recover-in-place out; ranks that joined offer what they offer."""
    offer = ("recover-in-place", "recover", "exit")
    assert declaration(offer, {}, {0, 1}, rejoins_alone=False) == (("recover", "exit"), False)
    assert declaration(offer, {0: ("recover-in-place", "exit")}, {0, 1}, rejoins_alone=False) == (
        ("recover", "exit"),
        False,
    )
    joined = {0: ("recover-in-place", "exit"), 1: ("recover-in-place", "exit")}
    assert declaration(offer, joined, {0, 1}, rejoins_alone=False) == (("recover-in-place", "exit"), True)
    assert declaration(offer, {}, {0, 1}, rejoins_alone=True) == (offer, False)
