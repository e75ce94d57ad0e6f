"""The one module that names the recovery strategies and what each one is.

Every service reads the names and traits from here: the selector (which to choose), the
coordinator's state machine (what a strategy restarts, what a failure rules out), the agent (what
it can do for ranks without a client) and the CLI and policy file (what a user may name). A new
strategy is one entry in :data:`TRAITS`.
"""

from __future__ import annotations

from dataclasses import dataclass

from recoverd.errors import ConfigError

__all__ = [
    "AGENT_STRATEGIES",
    "ALL_STRATEGIES",
    "CARRIED_OUT_BY_RANKS",
    "CHEAPER_THAN_EXIT",
    "DRAIN_KIND",
    "KEEP_LIVE_STATE",
    "NODE_WIDE",
    "RELAYED_TO_RANKS",
    "RESTARTS_FAULTY_RANKS",
    "RETRYABLE_FAULT_TYPES",
    "STATE_LOST_EXIT_CODE",
    "TRAITS",
    "UPGRADE",
    "Traits",
    "parse_strategies",
]


@dataclass(frozen=True, slots=True)
class Traits:
    """What one strategy needs and does."""

    #: Every participant (client) must offer it: an agent answering for a plain script cannot.
    needs_every_participant: bool
    #: The faulty ranks' processes are restarted by their agents (a command is sent).
    restarts_faulty_ranks: bool
    #: It acts on every rank of a faulty node (upstream's node-wide expansion).
    node_wide: bool
    #: An agent can carry it out for ranks that run no client.
    agent_can_do: bool
    #: Rough cost in seconds from the fault to training again, shown with decisions: the medians
    #: measured here (docs/strategies.md, bench/results), not counting the job's own start-up
    #: (a framework import, a checkpoint load) for the strategies that restart every rank.
    expected_cost_s: float


#: Every strategy, in MindCluster's priority order (cheapest first).
TRAITS: dict[str, Traits] = {
    # retry: one step again plus ~0.1 s of control plane; recover-in-place: 110-180 ms kill -> DONE
    # (0.13 s to the next step of 4 torch ranks); recover: 145-175 ms to the spare's ranks;
    # elastic-training: downgrade 175-185 ms; dump: a checkpoint (seconds for a large model) and an
    # exit; exit: 0.3 s for a plain DDP script forked from the warm-start server (bench P3 (b)).
    "retry": Traits(True, False, False, False, 0.1),
    "recover-in-place": Traits(False, True, False, True, 0.15),
    "recover": Traits(True, True, True, True, 0.2),
    "elastic-training": Traits(True, True, True, False, 0.2),
    "dump": Traits(True, False, False, False, 5.0),
    "exit": Traits(False, False, False, True, 0.3),
}

ALL_STRATEGIES: tuple[str, ...] = tuple(TRAITS)
#: The fault kind of ``recoverctl drain``: its node's ranks must move (``recover``), never restart there.
DRAIN_KIND = "drain"
#: Strategies cheaper than `exit`. A phase that cannot complete rules them all out, leaving `exit`.
CHEAPER_THAN_EXIT: tuple[str, ...] = tuple(s for s in ALL_STRATEGIES if s != "exit")
RESTARTS_FAULTY_RANKS = frozenset(s for s, t in TRAITS.items() if t.restarts_faulty_ranks)
NODE_WIDE = frozenset(s for s, t in TRAITS.items() if t.node_wide)
#: What an agent can do for ranks that run no client (`recover` only where its runtime can start
#: any rank: not under msrun or for adopted processes).
AGENT_STRATEGIES: tuple[str, ...] = tuple(s for s, t in TRAITS.items() if t.agent_can_do)
#: What an agent that answers for its ranks' clients (docs/adr/0036) carries out through them: it
#: relays the signal to every joined rank and reports once they all answered.
RELAYED_TO_RANKS: frozenset[str] = frozenset({"retry", "dump", "elastic-training"})
#: MindCluster's fault types a step can be re-run after: "0" an uncorrectable memory error (UCE),
#: "2" a link (HCCL) error; "1", any other fault, rules `retry` out.
RETRYABLE_FAULT_TYPES: frozenset[str] = frozenset({"0", "2"})
#: The exit status of a rank whose state its peers cannot rebuild (a sharded model's shard with no
#: twin and no RAM copy left, docs/adr/0049): every strategy that keeps the other ranks' processes
#: is ruled out, and the job restarts from its own checkpoint (`exit`).
STATE_LOST_EXIT_CODE = 86
#: The strategies that keep a live rank's state and so cannot follow a STATE_LOST_EXIT_CODE exit.
KEEP_LIVE_STATE: frozenset[str] = frozenset({"retry", "recover-in-place", "recover", "elastic-training"})
#: The recovery round that brings back ranks a downgrade (`elastic-training`) isolated, once a
#: spare has registered: not a strategy the selector chooses, but a round's strategy all the same.
UPGRADE = "upgrade"
#: The recovery rounds an agent that answers for its ranks carries out through them: what it
#: relays, and the upgrade that follows a relayed downgrade.
CARRIED_OUT_BY_RANKS: frozenset[str] = RELAYED_TO_RANKS | {UPGRADE}


def parse_strategies(text: str, *, where: str = "strategies") -> tuple[str, ...]:
    """``"recover-in-place, exit"`` -> a tuple of known names; ConfigError naming the unknown ones."""
    items = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [s for s in items if s not in TRAITS]
    if unknown or not items:
        raise ConfigError(
            f"{where}: unknown strategy {', '.join(unknown) or '(none)'}; choose from {', '.join(ALL_STRATEGIES)}"
        )
    return items
