"""The messages between a rank's recovery client and its node agent (docs/adr/0036): pure.

A rank takes part in recoverd's protocol through its node's agent, which answers for all of its
ranks with one report per phase (so a recovery's etcd writes follow nodes, not ranks). They talk
over a Unix ``SOCK_SEQPACKET`` socket in the abstract namespace (one connection per rank: the agent
pushes signals, the rank answers; message boundaries are kept by the kernel). One JSON object per
message, at most :data:`MAX_MESSAGE` bytes, version 1:

rank -> agent
    ``{"v": 1, "op": "join", "rank": R, "offer": [strategy, ...]}``: this rank's client takes part
    and can carry out ``offer``; sent on every (re)connection.
    ``{"v": 1, "op": "answer", "id": ID, "code": C, "message": M}``: its answer to signal ``ID``
    (0: done; anything else: failed, with a reason).
    ``{"v": 1, "op": "fault", "id": ID, "type": "0" | "2", "detail": D}``: this rank hit a fault
    its step can be re-run after (MindCluster's fault types: "0" an uncorrectable memory error, "2"
    a link error); the agent reports it as this rank's fault ``ID`` (once per id), and recoverd
    decides (``retry``, relayed back as a ``change``, or a costlier strategy).
agent -> rank
    ``{"v": 1, "op": "signal", "id": ID, "kind": "stop" | "change", "strategy": S, "uuid": U,
    "fault_ranks": [...]}``: stop training (answer once stopped), or carry out strategy ``S`` of the
    recovery ``U`` (answer once done).

Both ends treat what they read as untrusted: :func:`parse_from_rank` and :func:`parse_from_agent`
raise ``BadRecord`` with the reason for anything but a well-formed message, never more.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from recoverd.errors import BadRecord
from recoverd.strategies import RETRYABLE_FAULT_TYPES, TRAITS

__all__ = [
    "ADDRESS_ENV",
    "MAX_MESSAGE",
    "Answer",
    "Join",
    "RankFault",
    "Signal",
    "address_for",
    "encode_answer",
    "encode_fault",
    "encode_join",
    "encode_signal",
    "node_socket_address",
    "parse_from_agent",
    "parse_from_rank",
    "sockaddr",
    "versioned_object",
]

#: The environment variable that gives a rank its agent's address.
ADDRESS_ENV = "RECOVERD_RANKS_SOCKET"
#: Largest message either end reads; a longer one is cut by the kernel and then refused.
MAX_MESSAGE = 4096
_MAX_ID = 200
_MAX_TEXT = 1000
#: A rank's own fault id becomes part of the fault's key (the agent's ``fault_id`` keeps it short).
_MAX_FAULT_ID = 64
_KINDS = ("stop", "change")


def node_socket_address(purpose: str, run_uid: str, node: str) -> str:
    """A node agent's socket's printable address (``@`` = Linux's abstract namespace), stable per
    (run, node) so that an agent restarted in place binds the same name and its ranks find it
    again; ``purpose`` keeps the agent's sockets apart (``ranks``, ``progress``)."""
    digest = hashlib.sha256(f"{run_uid}\0{node}".encode()).hexdigest()[:24]
    return f"@recoverd-{purpose}-{digest}"


def address_for(run_uid: str, node: str) -> str:
    """The rank-client socket's address (:func:`node_socket_address`)."""
    return node_socket_address("ranks", run_uid, node)


def sockaddr(address: str) -> str:
    """What ``bind``/``connect`` take for ``address``."""
    return "\0" + address[1:] if address.startswith("@") else address


@dataclass(frozen=True, slots=True)
class Join:
    rank: int
    offer: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Answer:
    signal_id: str
    code: int
    message: str


@dataclass(frozen=True, slots=True)
class RankFault:
    """A retryable fault a rank reports about itself (``fault_type``: one of
    :data:`~recoverd.strategies.RETRYABLE_FAULT_TYPES`)."""

    fault_id: str
    fault_type: str
    detail: str


@dataclass(frozen=True, slots=True)
class Signal:
    signal_id: str
    kind: str
    strategy: str = ""
    uuid: str = ""
    fault_ranks: tuple[int, ...] = ()


def _encode(fields: dict[str, Any]) -> bytes:
    data = json.dumps({"v": 1, **fields}, separators=(",", ":")).encode()
    if len(data) >= MAX_MESSAGE:
        raise ValueError(f"message of {len(data)} bytes is too long")
    return data


def encode_join(rank: int, offer: tuple[str, ...]) -> bytes:
    return _encode({"op": "join", "rank": rank, "offer": list(offer)})


def encode_answer(signal_id: str, code: int, message: str) -> bytes:
    return _encode({"op": "answer", "id": signal_id, "code": code, "message": message[:_MAX_TEXT]})


def encode_fault(fault: RankFault) -> bytes:
    return _encode({"op": "fault", "id": fault.fault_id, "type": fault.fault_type, "detail": fault.detail[:_MAX_TEXT]})


def encode_signal(signal: Signal) -> bytes:
    return _encode(
        {
            "op": "signal",
            "id": signal.signal_id,
            "kind": signal.kind,
            "strategy": signal.strategy,
            "uuid": signal.uuid,
            "fault_ranks": list(signal.fault_ranks),
        }
    )


def versioned_object(data: bytes, limit: int, what: str) -> dict[str, Any]:
    """``data`` as a version-1 JSON object of fewer than ``limit`` bytes, else BadRecord naming
    ``what`` (the agent's local sockets take untrusted bytes: the rank socket, the progress socket)."""
    if len(data) >= limit:
        raise BadRecord(f"{what} of {len(data)} bytes is too long")
    try:
        fields = json.loads(data)
    except Exception as err:  # any bytes at all: ValueError, and RecursionError for "[[[[..."
        raise BadRecord(f"{what} is not JSON: {type(err).__name__}") from None
    if not isinstance(fields, dict) or fields.get("v") != 1:
        raise BadRecord(f"{what} is not a version-1 object")
    return fields


def _object(data: bytes, who: str) -> dict[str, Any]:
    return versioned_object(data, MAX_MESSAGE, f"{who} message")


def _integer(fields: dict[str, Any], name: str, low: int, high: int) -> int:
    value = fields.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRecord(f"field {name!r} is not an integer in {low}..{high}: {str(value)[:40]!r}")
    return value


def _text(fields: dict[str, Any], name: str, limit: int) -> str:
    value = fields.get(name, "")
    if not isinstance(value, str) or len(value) > limit:
        raise BadRecord(f"field {name!r} is not a string of at most {limit} characters")
    return value


def parse_from_rank(data: bytes) -> Join | Answer | RankFault:
    """A rank's message; BadRecord with the reason for anything else (unknown strategies and
    fault types too)."""
    fields = _object(data, "rank")
    op = fields.get("op")
    if op == "join":
        offer = fields.get("offer")
        if not isinstance(offer, list) or not all(isinstance(s, str) and s in TRAITS for s in offer):
            raise BadRecord("field 'offer' is not a list of known strategies")
        return Join(_integer(fields, "rank", 0, 2**31 - 1), tuple(dict.fromkeys(offer)))
    if op == "answer":
        signal_id = _text(fields, "id", _MAX_ID)
        if not signal_id:
            raise BadRecord("answer without a signal id")
        return Answer(signal_id, _integer(fields, "code", -(2**31), 2**31 - 1), _text(fields, "message", _MAX_TEXT))
    if op == "fault":
        fault_id = _text(fields, "id", _MAX_FAULT_ID)
        if not fault_id or not all(c.isascii() and (c.isalnum() or c in "._-") for c in fault_id):
            raise BadRecord(f"field 'id' is not 1..{_MAX_FAULT_ID} of [A-Za-z0-9._-]")
        fault_type = fields.get("type")
        if not isinstance(fault_type, str) or fault_type not in RETRYABLE_FAULT_TYPES:
            raise BadRecord(f"field 'type' is not a retryable fault type ({', '.join(sorted(RETRYABLE_FAULT_TYPES))})")
        return RankFault(fault_id, str(fault_type), _text(fields, "detail", _MAX_TEXT))
    raise BadRecord(f"unknown op {str(op)[:40]!r}")


def parse_from_agent(data: bytes) -> Signal:
    """An agent's signal; BadRecord with the reason for anything else."""
    fields = _object(data, "agent")
    if fields.get("op") != "signal":
        raise BadRecord(f"unknown op {str(fields.get('op'))[:40]!r}")
    kind = fields.get("kind")
    if kind not in _KINDS:
        raise BadRecord(f"unknown signal kind {str(kind)[:40]!r}")
    ranks = fields.get("fault_ranks", [])
    if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        raise BadRecord("field 'fault_ranks' is not a list of ranks")
    return Signal(
        signal_id=_text(fields, "id", _MAX_ID) or "?",
        kind=str(kind),
        strategy=_text(fields, "strategy", 64),
        uuid=_text(fields, "uuid", _MAX_ID),
        fault_ranks=tuple(ranks),
    )
