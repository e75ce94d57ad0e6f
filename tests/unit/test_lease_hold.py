"""Which vanished nodes the coordinator holds as live while etcd was in trouble (docs/adr/0045).

Pure: hand-made JobViews, a given clock and trouble, no etcd. The end-to-end case (a member
SIGSTOPped and the agent's lease expiring with it) is tests/integration/test_etcd_cluster.py.
"""

from __future__ import annotations

from recoverd.coordinator.leasehold import LeaseHold
from recoverd.coordinator.observe import lost_node_faults
from recoverd.etcd_health import Trouble
from recoverd.jobview import BadKey, JobView
from recoverd.keys import KeyKind, RunRef
from recoverd.records import pb

GRACE = 5.0
TROUBLE = Trouble(100.0, "member 127.0.0.1:2379 did not answer a status probe within 0.5s")


def job_view(*live: str, tables: tuple[str, ...] = ("a", "b")) -> JobView:
    v = JobView(revision=1)
    v.run = RunRef("job", "uid1")
    for name in live:
        v.nodes[name] = pb.NodeRecord(node=name, node_rank=ord(name) - ord("a"), strategies=["recover-in-place"])
    for name in tables:
        v.ranks[name] = pb.NodeRanks(node=name, ranks=[pb.RankStatus(rank=ord(name) - ord("a"), state=pb.RANK_RUNNING)])
    return v


def seen_live(hold: LeaseHold, now: float = 90.0) -> None:
    hold.apply(job_view("a", "b"), now, None)


def test_a_node_vanishing_during_etcd_trouble_is_held_with_its_last_record() -> None:
    hold = LeaseHold(GRACE)
    seen_live(hold)
    v = job_view("b")
    held = hold.apply(v, 101.0, TROUBLE)
    assert held.nodes == {"a"}
    assert held.new == (("a", TROUBLE.what),)
    assert held.wake_after_s == GRACE
    assert v.nodes["a"].node_rank == 0 and list(v.nodes["a"].strategies) == ["recover-in-place"]
    assert lost_node_faults(v, 101.0) == []  # so its ranks are not lost-node faults
    # The next pass holds it still, announces it no more, and wakes when the grace ends.
    again = hold.apply(job_view("b"), 104.0, TROUBLE)
    assert again.nodes == {"a"} and again.new == () and again.wake_after_s == 2.0


def test_the_hold_ends_after_the_grace_and_the_node_is_lost() -> None:
    hold = LeaseHold(GRACE)
    seen_live(hold)
    hold.apply(job_view("b"), 101.0, TROUBLE)
    v = job_view("b")
    assert hold.apply(v, 106.0, TROUBLE).nodes == frozenset()
    assert [f.node for f in lost_node_faults(v, 106.0)] == ["a"]


def test_a_node_vanishing_while_etcd_is_healthy_is_not_held() -> None:
    hold = LeaseHold(GRACE)
    seen_live(hold)
    assert hold.apply(job_view("b"), 101.0, None).nodes == frozenset()
    # Trouble long before the node vanished explains nothing.
    assert hold.apply(job_view("b"), 101.0, Trouble(90.0, "old")).nodes == frozenset()


def test_a_node_that_comes_back_is_forgotten_and_held_afresh_next_time() -> None:
    hold = LeaseHold(GRACE)
    seen_live(hold)
    hold.apply(job_view("b"), 101.0, TROUBLE)
    hold.apply(job_view("a", "b"), 102.0, TROUBLE)  # its agent registered again
    later = Trouble(200.0, "the etcd leader changed (1 -> 2)")
    held = hold.apply(job_view("b"), 200.5, later)
    assert held.nodes == {"a"} and held.new == (("a", later.what),) and held.wake_after_s == GRACE


def test_nothing_is_held_that_was_never_seen_live_or_holds_nothing() -> None:
    hold = LeaseHold(GRACE)
    # A coordinator that never saw node a live has no record to hold it with.
    assert hold.apply(job_view("b"), 101.0, TROUBLE).nodes == frozenset()
    # A node whose ranks all ended is not awaited by anything: its absence acts on nothing.
    seen_live(hold)
    v = job_view("b")
    v.ranks["a"].ranks[0].state = pb.RANK_SUCCEEDED
    assert hold.apply(v, 101.0, TROUBLE).nodes == frozenset()


def test_a_commanded_node_without_ranks_is_held_while_its_answer_is_awaited() -> None:
    hold = LeaseHold(GRACE)
    seen_live(hold)
    hold.apply(job_view("a", "b", "s", tables=("a", "b")), 95.0, None)  # the spare s, live
    v = job_view("a", "b")
    v.recovery = pb.Recovery(phase=pb.PHASE_RECOVERING, command_nodes=["s"])
    assert hold.apply(v, 101.0, TROUBLE).nodes == {"s"}


def test_a_placeholder_record_is_never_remembered_as_the_node_s_record() -> None:
    hold = LeaseHold(GRACE)
    seen_live(hold)
    v = job_view("a", "b")
    v.nodes["a"] = pb.NodeRecord(node="a", node_rank=-1)  # jobview's placeholder for a bad record
    v.bad.append(BadKey("jobs/job/runs/uid1/nodes/a", b"junk", "undecodable", KeyKind.NODE, 7, 3))
    hold.apply(v, 100.0, None)
    w = job_view("b")
    hold.apply(w, 101.0, TROUBLE)
    assert w.nodes["a"].node_rank == 0  # the last good record, not the placeholder


def test_a_zero_grace_holds_nothing() -> None:
    hold = LeaseHold(0.0)
    seen_live(hold)
    assert hold.apply(job_view("b"), 101.0, TROUBLE).nodes == frozenset()
