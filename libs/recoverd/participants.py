"""Names of recovery participants: who answers a recovery's phases (reports are keyed by them).

A job's participants are its live recovery clients when it has any (MindCluster style: one
controller per job), otherwise each live node agent, answering for its own ranks.
"""

from __future__ import annotations

__all__ = ["of_client", "of_node"]


def of_node(node: str) -> str:
    """The participant id of the node agent on ``node``."""
    return f"agent.{node}"


def of_client(client_id: str) -> str:
    """The participant id of a registered recovery client."""
    return f"client.{client_id}"
