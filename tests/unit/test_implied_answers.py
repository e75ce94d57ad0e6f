"""Who answers a recovery, and which answers the coordinator gives for the agents (docs/adr/0029).

Pure: a hand-made JobView and Recovery, no etcd. The rule is shared by the agent (it writes only
what ``participants.agent_reports`` says) and the coordinator (it gives every other answer); these
tests pin both sides of it, and that a 512-node recovery involving one node waits on that node only.
"""

from __future__ import annotations

import dataclasses

from recoverd import participants
from recoverd.coordinator.inputs import RecoverStatusReported, StopCompleted, StrategiesReported
from recoverd.coordinator.model import FaultInfo, Phase, Recovery
from recoverd.coordinator.observe import implied_answers, live_participants
from recoverd.coordinator.recovery import step
from recoverd.jobview import JobView
from recoverd.records import pb

AGENT = ("recover-in-place", "recover", "exit")


def view(nodes: int, *, declared: tuple[str, ...] = AGENT, undeclared: tuple[str, ...] = ()) -> JobView:
    v = JobView(revision=1)
    for i in range(nodes):
        name = f"n{i}"
        strategies = () if name in undeclared else declared
        v.nodes[name] = pb.NodeRecord(node=name, node_rank=i, strategies=list(strategies))
    return v


def recovery(phase: Phase, *, faults: tuple[str, ...] = ("n3",), **kw: object) -> Recovery:
    rec = Recovery(
        phase=phase,
        epoch=2,
        recovery_id=1,
        faults=tuple(FaultInfo(f"{n}.r0.g0.c0", 0, n) for n in faults),
        **kw,  # type: ignore[arg-type]
    )
    return rec


def test_an_agent_writes_only_what_it_alone_knows() -> None:
    assert participants.agent_reports("STOPPING", declared=True)
    assert not participants.agent_reports("GLOBAL_FAULT", declared=True)
    assert participants.agent_reports("GLOBAL_FAULT", declared=False)
    assert not participants.agent_reports("RECOVERING", declared=True)
    assert not participants.agent_reports("RECOVERING", declared=False)


def test_participants_are_the_involved_agents_and_the_rest_as_one() -> None:
    v = view(512, undeclared=("n7",))
    rec = recovery(Phase.STOPPING, faults=("n3", "n999"))  # n999 is not live: nobody to answer for it
    assert live_participants(v, rec) == {"agents", "agent.n3", "agent.n7"}
    # No live agent at all: nobody answers, and the phase waits for its deadline or a node.
    assert live_participants(view(0), rec) == frozenset()
    # Clients, when the job has any, are the participants, alone.
    v.clients["c1"] = pb.ClientRecord(client_id="c1")
    assert live_participants(v, rec) == {"client.c1"}


def test_stopping_waits_only_for_the_node_holding_the_fault() -> None:
    v = view(512)
    rec = recovery(Phase.STOPPING, participants=live_participants(view(512), recovery(Phase.STOPPING)))
    assert implied_answers(v, rec) == [StopCompleted(2, "agents")]
    rec, _ = step(rec, StopCompleted(2, "agents"), now=10.0)
    assert rec.phase is Phase.STOPPING  # agent.n3 has not stopped its rank yet
    rec, _ = step(rec, StopCompleted(2, "agent.n3"), now=10.0)
    assert rec.phase is Phase.GLOBAL_FAULT


def table(node: str, *rows: tuple[int, int, int]) -> pb.NodeRanks:
    """A node's rank table of (rank, state, generation) rows."""
    return pb.NodeRanks(node=node, ranks=[pb.RankStatus(rank=r, state=state, generation=gen) for r, state, gen in rows])


def test_a_node_whose_fault_ranks_have_ended_is_answered_for_at_once() -> None:
    """A rank that exited needs no stopping: its table (written with, or before, its fault) says
    so, and its agent's answer is not waited for (one round trip less on the usual fault)."""
    v = view(4)
    rec = recovery(Phase.STOPPING, participants=frozenset({"agents", "agent.n3"}))
    for state in (pb.RANK_FAILED, pb.RANK_SUCCEEDED, pb.RANK_STOPPED):
        v.ranks["n3"] = table("n3", (0, state, 0), (1, pb.RANK_RUNNING, 0))  # rank 1 is no fault rank
        assert implied_answers(v, rec) == [StopCompleted(2, "agent.n3"), StopCompleted(2, "agents")]
    answered = rec
    for answer in implied_answers(v, rec):
        answered, _ = step(answered, answer, now=10.0)
    assert answered.phase is Phase.GLOBAL_FAULT


def test_a_fault_rank_still_running_is_stopped_by_its_agent() -> None:
    """Its agent must answer: a hung rank still runs; so does one restarted since the fault (a
    later life: a higher generation), and a node whose table is not known says nothing."""
    rec = recovery(Phase.STOPPING, participants=frozenset({"agents", "agent.n3"}))
    for rows in ([(0, pb.RANK_RUNNING, 0)], [(0, pb.RANK_PENDING, 0)], [(0, pb.RANK_FAILED, 1)], []):
        v = view(4)
        if rows:
            v.ranks["n3"] = table("n3", *rows)
        assert implied_answers(v, rec) == [StopCompleted(2, "agents")], rows


def test_global_fault_is_answered_from_the_declarations_at_once() -> None:
    v = view(4)
    v.nodes["n1"].strategies[:] = ["recover-in-place", "exit"]  # cannot start other nodes' ranks
    rec = recovery(Phase.GLOBAL_FAULT, participants=frozenset({"agents", "agent.n3"}))
    answers = implied_answers(v, rec)
    assert answers == [
        StrategiesReported(2, "agent.n3", AGENT),
        StrategiesReported(2, "agents", ("recover-in-place", "exit")),  # what every live agent can do
    ]
    for answer in answers:
        rec, _ = step(rec, answer, now=10.0)
    assert rec.phase is Phase.DECIDING and rec.supported == {"recover-in-place", "exit"}


def test_an_undeclared_agent_reports_its_strategies_itself() -> None:
    v = view(4, undeclared=("n2",))
    rec = recovery(Phase.GLOBAL_FAULT, participants=frozenset({"agents", "agent.n3", "agent.n2"}))
    assert {a.participant for a in implied_answers(v, rec)} == {"agents", "agent.n3"}  # type: ignore[attr-defined]


def test_recovering_takes_a_commanded_nodes_ack_of_this_epoch_as_its_answer() -> None:
    v = view(4)
    rec = recovery(
        Phase.RECOVERING,
        participants=frozenset({"agents", "agent.n3"}),
        strategy="recover-in-place",
        command_nodes=frozenset({"n3"}),
    )
    # Not acked yet (an ack of an older epoch does not count): only the uninvolved are answered.
    v.acks["n3"] = pb.CommandAck(epoch=1, seq=1, ok=True)
    assert implied_answers(v, rec) == [RecoverStatusReported(2, "agents", 0, "recover-in-place")]
    v.acks["n3"] = pb.CommandAck(epoch=2, seq=2, ok=True)
    assert RecoverStatusReported(2, "agent.n3", 0, "recover-in-place", "") in implied_answers(v, rec)
    failed = pb.CommandAck(epoch=2, seq=2, ok=False, detail="ranks [3] failed to restart")
    v.acks["n3"] = failed
    assert RecoverStatusReported(2, "agent.n3", 1, "recover-in-place", failed.detail) in implied_answers(v, rec)


def test_answers_already_counted_are_not_given_again() -> None:
    v = view(4)
    rec = recovery(Phase.STOPPING, participants=frozenset({"agents", "agent.n3"}), reported=frozenset({"agents"}))
    assert implied_answers(v, rec) == []
    assert implied_answers(v, dataclasses.replace(rec, phase=Phase.DONE)) == []
