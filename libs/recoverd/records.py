"""The store edge for records: proto messages to and from proto3 JSON, and wall-clock helpers.

Values in etcd are proto3 JSON with the proto field names (snake_case) and enums by name, so
``etcdctl get --prefix /recoverd/v1/jobs/J/`` is readable during an incident. Decoding ignores
unknown fields (a newer writer may add some) and turns anything unparsable into :class:`BadRecord`
naming the key, so one bad value is recorded and skipped instead of crashing a reconcile pass.
"""

from __future__ import annotations

import json
import time
from typing import TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from recoverd.errors import BadRecord
from recoverd.keys import printable
from recoverd.v1 import records_pb2 as pb

__all__ = [
    "LIVE_RANK_STATES",
    "MAX_DECODE_BYTES",
    "decode",
    "encode",
    "pb",
    "printable",
    "ts_from_s",
    "ts_to_s",
    "wall_now",
]

M = TypeVar("M", bound=Message)

#: Rank states with a process behind them (running, or being started): the one place this is said.
LIVE_RANK_STATES = frozenset({pb.RANK_RUNNING, pb.RANK_PENDING})


def encode(message: Message) -> bytes:
    """Serialise a record as compact proto3 JSON (field names as in the .proto, enums by name)."""
    return json_format.MessageToJson(message, preserving_proto_field_name=True, indent=None, sort_keys=True).encode()


# What the JSON and protobuf parsers raise on hostile input (deep nesting, huge numbers, odd types).
_PARSE_ERRORS = (
    json_format.ParseError,
    UnicodeDecodeError,
    ValueError,
    TypeError,
    RecursionError,
    OverflowError,
    AttributeError,
    KeyError,
)


#: No value is parsed above this (etcd's own request limit is 1.5 MiB; recoverd writes at most 1 MiB).
MAX_DECODE_BYTES = 2 * 1024 * 1024


def decode(cls: type[M], raw: bytes | str, key: str = "") -> M:
    """Parse a stored record; raise BadRecord (with the key) when it is not a valid ``cls``.

    Only a JSON object is a record: ``[]``, ``"str"`` or ``1`` parse as JSON but are refused here
    (protobuf's own parser would take ``[]`` for an empty message). This checks the syntax only;
    ``recoverd.validate`` checks what the fields mean.
    """
    message = cls()
    where = f" at {printable(key)}" if key else ""
    if len(raw) > MAX_DECODE_BYTES:
        # Before parsing: an etcd run with a raised --max-request-bytes could hold anything.
        raise BadRecord(f"{cls.__name__}{where} is {len(raw)} bytes: over the {MAX_DECODE_BYTES}-byte cap")
    try:
        text = raw.decode() if isinstance(raw, bytes) else raw
        data = json.loads(text)
        if not isinstance(data, dict):
            raise BadRecord(f"malformed {cls.__name__}{where}: a {type(data).__name__}, not a JSON object")
        json_format.ParseDict(data, message, ignore_unknown_fields=True)
    except _PARSE_ERRORS as err:
        raise BadRecord(f"malformed {cls.__name__}{where}: {printable(str(err))[:300]}") from err
    return message


def wall_now() -> float:
    """Wall-clock seconds since the epoch: only for instants stored in etcd (deadlines, stamps)."""
    return time.time()


def ts_from_s(seconds: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


def ts_to_s(stamp: Timestamp) -> float:
    return float(stamp.ToNanoseconds()) / 1e9
