"""The policy file: valid files become the stored record; every invalid one is refused with a message
naming the key, the bad value and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from recoverd.coordinator.model import Timeouts
from recoverd.coordinator.observe import job_timeouts
from recoverd.errors import ConfigError
from recoverd.policy import Budget, Deadlines, JobPolicy, load_policy, parse_policy, policy_dict
from recoverd.records import pb
from recoverd.strategy.service import request_from_records

FULL = """
strategies: [recover-in-place, recover]
deadlines: {fault_window: 0.1, stop: 5, strategies: 6, decide: 0.5, recover: 20}
budgets:
  recover-in-place: {max: 2, window_s: 3600}
  dump: {max: 1}
  exit: {max: 5, window_s: 900}
spares: [node7, spare-1.rack2]
allow_rank0_in_place: false
"""


def test_full_policy() -> None:
    policy = parse_policy(FULL)
    assert policy == JobPolicy(
        strategies=("recover-in-place", "recover", "exit"),
        deadlines=Deadlines(0.1, 5.0, 6.0, 0.5, 20.0),
        budgets=(("recover-in-place", Budget(2, 3600.0)), ("dump", Budget(1, 600.0)), ("exit", Budget(5, 900.0))),
        spares=("node7", "spare-1.rack2"),
        allow_rank0_in_place=False,
    )
    stored = policy.to_pb()
    assert list(stored.strategies) == ["recover-in-place", "recover", "exit"]
    assert stored.max_rank_restarts == 2 and stored.max_job_restarts == 5
    assert stored.budgets["dump"].max == 1 and stored.budgets["dump"].window_s == 600.0
    assert stored.deadlines.decide_s == 0.5
    assert list(stored.spares) == ["node7", "spare-1.rack2"]
    assert stored.HasField("allow_rank0_in_place") and not stored.allow_rank0_in_place


def test_show_output_round_trips() -> None:
    import yaml

    stored = parse_policy(FULL).to_pb()
    again = parse_policy(yaml.safe_dump(policy_dict(stored))).to_pb()
    assert policy_dict(again) == policy_dict(stored)


def test_the_hang_section_is_stored_and_shown_back() -> None:
    text = (
        "hang: {timeout: 0, floor: 2, startup: 30, warmup_steps: 5, log_pattern: 'step (?P<step>\\d+)', enabled: false}"
    )
    stored = parse_policy(text).to_pb()
    assert (stored.hang.floor_s, stored.hang.startup_s, stored.hang.warmup_steps) == (2.0, 30.0, 5)
    assert stored.hang.timeout_s == 0 and stored.hang.HasField("enabled") and not stored.hang.enabled
    assert stored.hang.log_pattern == "step (?P<step>\\d+)"
    shown = policy_dict(stored)["hang"]
    assert shown == {
        "enabled": False,
        "floor": 2.0,
        "startup": 30.0,
        "warmup_steps": 5,
        "log_pattern": "step (?P<step>\\d+)",
    }
    assert policy_dict(parse_policy("{}").to_pb())["hang"] == {}


def test_empty_mapping_and_base() -> None:
    base = pb.Policy(strategies=["recover-in-place"], max_rank_restarts=7, max_job_restarts=4, restart_window_s=60)
    stored = parse_policy("{}").to_pb(base)
    assert list(stored.strategies) == ["recover-in-place"]
    assert (stored.max_rank_restarts, stored.max_job_restarts, stored.restart_window_s) == (7, 4, 60)
    assert stored.allow_rank0_in_place is True
    assert parse_policy("deadlines: {decide: 1}").strategies is None
    launched = parse_policy(FULL).to_pb()
    replaced = parse_policy("deadlines: {decide: 1}").to_pb(launched)
    assert replaced.budgets["recover-in-place"].window_s == 3600 and "dump" not in replaced.budgets
    assert not replaced.spares and replaced.deadlines.stop_s == 0 and replaced.allow_rank0_in_place


def test_exit_is_appended_once() -> None:
    assert parse_policy("strategies: [exit, dump]").strategies == ("dump", "exit")
    assert parse_policy("strategies: [exit]").strategies == ("exit",)


BAD = [
    ("", "the policy file is empty"),
    ("[1, 2]", "expected a mapping"),
    ("strategies: [retry\n", "not valid YAML"),
    ("strategy: [exit]", "unknown key 'strategy'; allowed: strategies, deadlines"),
    ("strategies: [resume]", "strategies: 'resume' is not valid; allowed: retry, recover-in-place"),
    ("strategies: []", "strategies: [] is not valid; expected a non-empty list"),
    ("strategies: exit", "strategies: 'exit' is not valid; expected a non-empty list"),
    ("strategies: [dump, dump]", "strategies: 'dump' is not valid; each strategy may be listed once"),
    ("deadlines: 5", "deadlines: 5 is not valid; expected a mapping"),
    ("deadlines: {decide: 0}", "deadlines.decide: 0 is not valid; expected a positive number of seconds"),
    ("deadlines: {stop: -1}", "deadlines.stop: -1 is not valid"),
    ("deadlines: {stop: fast}", "deadlines.stop: 'fast' is not valid"),
    ("deadlines: {stop: .inf}", "deadlines.stop: inf is not valid"),
    ("deadlines: {stop: true}", "deadlines.stop: True is not valid"),
    ("deadlines: {stopping: 3}", "unknown key deadlines.'stopping'; allowed: fault_window, stop, strategies"),
    ("budgets: {resume: {max: 1}}", "budgets: 'resume' is not valid; allowed strategies: retry"),
    ("budgets: {exit: 3}", "budgets.exit: 3 is not valid; expected a mapping"),
    ("budgets: {exit: {window_s: 3}}", "budgets.exit: missing key 'max'"),
    ("budgets: {exit: {max: 0}}", "budgets.exit.max: 0 is not valid; expected a positive integer"),
    ("budgets: {exit: {max: 1.5}}", "budgets.exit.max: 1.5 is not valid"),
    ("budgets: {exit: {max: 1, window_s: 0}}", "budgets.exit.window_s: 0 is not valid"),
    ("budgets: {exit: {max: 1, per: rank}}", "unknown key budgets.exit.'per'; allowed: max, window_s"),
    ("spares: node7", "spares: 'node7' is not valid; expected a list of node names"),
    ("spares: [node/7]", "spares: 'node/7' is not valid; node names are 1-253 of"),
    ("spares: [n1, n1]", "spares: 'n1' is not valid; each node may be listed once"),
    ("allow_rank0_in_place: maybe", "allow_rank0_in_place: 'maybe' is not valid; expected true or false"),
    ("allow_rank0_in_place: 1", "allow_rank0_in_place: 1 is not valid"),
    ("hang: 5", "hang: 5 is not valid; expected a mapping"),
    ("hang: {timeout: -1}", "hang.timeout: -1 is not valid; expected a positive number of seconds"),
    ("hang: {floor: 0}", "hang.floor: 0 is not valid"),
    ("hang: {multiplier: 0.5}", "hang.multiplier: 0.5 is not valid; expected a number of at least 1"),
    ("hang: {straggler_ratio: 1}", "hang.straggler_ratio: 1 is not valid; expected a number above 1"),
    ("hang: {warmup_steps: 0}", "hang.warmup_steps: 0 is not valid; expected an integer from 1 to 10000"),
    ("hang: {enabled: yes please}", "hang.enabled: 'yes please' is not valid; expected true or false"),
    ("hang: {log_pattern: '(unclosed'}", "hang.log_pattern: '(unclosed' is not valid; not a regular expression"),
    ("hang: {log_pattern: '(?P<n>x)(?P<step>y)'}", "the only named group allowed is (?P<step>...)"),
    ("hang: {log_pattern: ''}", "hang.log_pattern: '' is not valid"),
    ("hang: {patience: 3}", "unknown key hang.'patience'; allowed: enabled, timeout"),
]


@pytest.mark.parametrize(("text", "message"), BAD, ids=[b[1][:40] for b in BAD])
def test_invalid_policy(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy(text, "p.yaml")
    assert info.value.detail.startswith("p.yaml: ")
    assert message in info.value.detail, info.value.detail


def test_load_policy(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("strategies: [recover-in-place]\n")
    assert load_policy(path).strategies == ("recover-in-place", "exit")
    with pytest.raises(ConfigError, match="cannot read policy file"):
        load_policy(tmp_path / "missing.yaml")
    path.write_text("deadlines: {decide: -1}\n")
    with pytest.raises(ConfigError, match=f"{path}: deadlines.decide"):
        load_policy(path)


def test_job_timeouts_use_the_policy_where_set() -> None:
    base = Timeouts(fault_window_s=0.2, stop_s=10, strategies_s=10, decide_s=30, recover_s=60)
    assert job_timeouts(pb.Policy(), base) == base
    stored = parse_policy("deadlines: {decide: 0.5, recover: 7}").to_pb()
    assert job_timeouts(stored, base) == Timeouts(0.2, 10, 10, 0.5, 7)


def test_selector_input_from_the_stored_policy() -> None:
    spec = pb.JobSpec(name="j", policy=parse_policy(FULL).to_pb())
    recovery = pb.Recovery(faults=[pb.Fault(rank=1, node="n0", fault_type="1")])
    request = request_from_records(spec, recovery, None, 0.0, rank0_node="n0")
    assert request.policy.allow_rank0_in_place is False
    assert request.policy.budget("dump") == (1, 600.0)
    assert request.policy.budget("recover-in-place") == (2, 3600.0)
    assert request.fault_nodes == ("n0",) and request.rank0_node == "n0"
    legacy = request_from_records(pb.JobSpec(name="j"), recovery, None, 0.0)
    assert legacy.policy.allow_rank0_in_place is True
    assert legacy.policy.budget("exit") == (3, 600.0) and legacy.policy.budget("dump") is None


def test_independent_ranks_from_the_file_or_the_flag() -> None:
    assert parse_policy("independent_ranks: true").to_pb().independent_ranks is True
    assert parse_policy("strategies: [exit]").to_pb().HasField("independent_ranks") is False
    # The flag (base) or the file: either says so.
    assert parse_policy("strategies: [exit]").to_pb(pb.Policy(independent_ranks=True)).independent_ranks is True
    assert policy_dict(parse_policy("independent_ranks: true").to_pb())["independent_ranks"] is True
    with pytest.raises(ConfigError, match="independent_ranks: 'yes' is not valid; expected true or false"):
        parse_policy("independent_ranks: 'yes'")


def test_the_replacement_wait_from_the_flag_unless_the_file_sets_it() -> None:
    flag = pb.Policy(deadlines=pb.PolicyDeadlines(replacement_s=30.0))
    assert parse_policy("strategies: [exit]").to_pb(flag).deadlines.replacement_s == 30.0
    assert parse_policy("deadlines: {replacement: 5}").to_pb(flag).deadlines.replacement_s == 5.0
    assert parse_policy("strategies: [exit]").to_pb(pb.Policy()).deadlines.HasField("replacement_s") is False


def test_an_independent_job_has_no_plain_nodes_for_the_selector() -> None:
    recovery = pb.Recovery(faults=[pb.Fault(rank=1, node="n0", fault_type="1")])
    plain = request_from_records(pb.JobSpec(name="j"), recovery, None, 0.0, plain_nodes=("n0",))
    assert plain.plain_nodes == ("n0",)
    spec = pb.JobSpec(name="j", policy=pb.Policy(independent_ranks=True))
    assert request_from_records(spec, recovery, None, 0.0, plain_nodes=("n0",)).plain_nodes == ()


def test_plain_nodes_are_those_whose_ranks_cannot_rejoin_alone() -> None:
    from recoverd.jobview import JobView
    from recoverd.strategy.service import plain_nodes

    offered = ["recover-in-place", "exit"]
    view = JobView(
        revision=1,
        nodes={
            "plain": pb.NodeRecord(node="plain", ranks=[0, 1], strategies=["exit"]),
            "joined": pb.NodeRecord(node="joined", ranks=[2, 3], strategies=offered, answers_for_ranks=True),
            "spare": pb.NodeRecord(node="spare", is_spare=True, strategies=["exit"]),
            "older": pb.NodeRecord(node="older", ranks=[4]),  # declares nothing: not counted
        },
    )
    assert plain_nodes(view) == ("plain",)
    # A ResilientTrainer with no protocol joins nothing, but its ranks rejoin their generations.
    assert plain_nodes(view, forms_resilient_group=True) == ()
    # A job with its own client (DLRecoverManager, the trainer's rank-0 relay) answers for its ranks.
    assert plain_nodes(JobView(revision=1, nodes=view.nodes, clients={"c": pb.ClientRecord(client_id="c")})) == ()
