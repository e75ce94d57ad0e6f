"""Recovery participants: who answers a recovery's phases (reports are keyed by them), and how.

A job's participants are its live recovery clients when it has any (MindCluster style: one
controller per job). Otherwise the node agents answer for their own ranks, and an agent writes an
answer only where it alone knows it (docs/adr/0029), so that a recovery's writes follow the nodes it
involves, not the job's size:

* STOPPING: the agent of a live node that holds a fault rank answers once it has stopped them,
  unless its rank table already shows them all ended (they exited): then the coordinator answers
  for it at once (not for an agent that answers for its ranks, below: they acknowledge first);
* GLOBAL_FAULT: no agent writes; the strategies an agent can carry out are declared once, in its
  node record (``NodeRecord.strategies``), and the coordinator answers for it from there. An agent
  that declares none (an older one) is a participant and reports them itself;
* RECOVERING: a commanded agent's answer is its command's acknowledgement (``acks/<node>``, ``ok``);
  an agent with no command has nothing to confirm.

An agent that **answers for its ranks** (their clients joined through its local socket,
``NodeRecord.answers_for_ranks``, docs/adr/0036) is a participant whenever the job has no client
of its own, and it writes one report per phase for all of its ranks: STOPPING (its faulty ranks
stopped and every joined rank stopped), and RECOVERING for a strategy carried out in the job
(:data:`JOB_STRATEGIES`: every joined rank carried it out). Its GLOBAL_FAULT answer stays its
declaration, which then says what it and every joined rank can do.

The coordinator answers for all the others at once, as the pseudo participant :data:`AGENTS`.
"""

from __future__ import annotations

from recoverd.strategies import CARRIED_OUT_BY_RANKS

__all__ = ["AGENTS", "JOB_STRATEGIES", "agent_reports", "is_agent", "node_of", "of_client", "of_node"]

#: The node agents that have nothing to do in the current phase, answered for by the coordinator.
AGENTS = "agents"

#: The recovery rounds an agent that answers for its ranks carries out through them
#: (``strategies.CARRIED_OUT_BY_RANKS``: what it relays, and the upgrade after a downgrade).
JOB_STRATEGIES = CARRIED_OUT_BY_RANKS


def of_node(node: str) -> str:
    """The participant id of the node agent on ``node``."""
    return f"agent.{node}"


def node_of(participant: str) -> str:
    """The node of an agent's participant id (:func:`of_node`'s inverse)."""
    return participant.removeprefix("agent.")


def is_agent(participant: str) -> bool:
    """Whether ``participant`` names one node's agent (not a client, not :data:`AGENTS`)."""
    return participant.startswith("agent.")


def of_client(client_id: str) -> str:
    """The participant id of a registered recovery client."""
    return f"client.{client_id}"


def agent_reports(phase: str, *, declared: bool, answers_for_ranks: bool = False, strategy: str = "") -> bool:
    """Whether a participating agent writes its own report in ``phase`` (a ``Phase`` name).

    ``declared``: its node record declares its strategies; ``answers_for_ranks``: it answers for
    its ranks' clients; ``strategy``: the strategy being carried out (RECOVERING). The coordinator
    uses the same rule to know which answers it must wait for and which it gives for the agents
    itself.
    """
    if phase == "STOPPING":
        return True
    if phase == "GLOBAL_FAULT":
        return not declared
    if phase == "RECOVERING":
        return answers_for_ranks and strategy in JOB_STRATEGIES
    return False
