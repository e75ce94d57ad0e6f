"""Recovery participants: who answers a recovery's phases (reports are keyed by them), and how.

A job's participants are its live recovery clients when it has any (MindCluster style: one
controller per job). Otherwise the node agents answer for their own ranks, and an agent writes an
answer only where it alone knows it (docs/adr/0029), so that a recovery's writes follow the nodes it
involves, not the job's size:

* STOPPING: the agent of a live node that holds a fault rank answers once it has stopped them,
  unless its rank table already shows them all ended (they exited): then the coordinator answers
  for it at once;
* GLOBAL_FAULT: no agent writes; the strategies an agent can carry out are declared once, in its
  node record (``NodeRecord.strategies``), and the coordinator answers for it from there. An agent
  that declares none (an older one) is a participant and reports them itself;
* RECOVERING: a commanded agent's answer is its command's acknowledgement (``acks/<node>``, ``ok``);
  an agent with no command has nothing to confirm.

The coordinator answers for all the others at once, as the pseudo participant :data:`AGENTS`.
"""

from __future__ import annotations

__all__ = ["AGENTS", "agent_reports", "is_agent", "node_of", "of_client", "of_node"]

#: The node agents that have nothing to do in the current phase, answered for by the coordinator.
AGENTS = "agents"


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


def agent_reports(phase: str, *, declared: bool) -> bool:
    """Whether a participating agent writes its own report in ``phase`` (a ``Phase`` name).

    ``declared``: its node record declares its strategies. The coordinator uses the same rule to
    know which answers it must wait for and which it gives for the agents itself.
    """
    if phase == "STOPPING":
        return True
    if phase == "GLOBAL_FAULT":
        return not declared
    return False
