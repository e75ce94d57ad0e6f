"""How a hung rank's stacks are kept: bounded, and stored as one ``hang_stacks`` event (docs/adr/0026).

A fault record carries the stacks its agent captured (``Fault.stacks``), but the coordinator deletes
the fault key when it merges the fault into a recovery, and the recovery record, rewritten on every
phase, keeps only a small ``FaultInfo``. So the coordinator writes the stacks once, into an event of
reason :data:`REASON` in the same pass: its message is the grouped summary (``recoverctl events``
shows it), its ``data`` holds

* ``fault_id``, ``recovery`` (the recovery id), ``kind`` (the fault's kind), ``summary``;
* ``stacks``: a JSON array of ``recoverd.v1.RankStack`` in proto3 JSON (``recoverctl stacks``).

Every text is bounded (:func:`bounded`): at most :data:`MAX_TEXT_BYTES` per rank, the whole
``stacks`` value at most :data:`MAX_STACKS_BYTES` as stored (after JSON escaping), the hung rank's
stack kept whole before its peers' are cut. The agent applies the same bound to the fault record,
which must stay under validate's 256 KiB per value or be dropped as bad input.

Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from google.protobuf import json_format

from recoverd import stackgroups
from recoverd.records import pb

__all__ = [
    "MAX_ERROR_CHARS",
    "MAX_STACKS",
    "MAX_STACKS_BYTES",
    "MAX_TEXT_BYTES",
    "REASON",
    "HangStacks",
    "bounded",
    "event_data",
    "event_message",
    "from_event",
    "stored_size",
]

REASON = "hang_stacks"
#: One rank's stack text (py-spy's main thread of a deep training step is ~3-6 KiB).
MAX_TEXT_BYTES = 8 * 1024
#: All stacks of one fault, as stored (JSON-escaped): the node's ranks share it.
MAX_STACKS_BYTES = 64 * 1024
#: Stacks kept per fault (a node's ranks); the rest are dropped, the summary says how many.
MAX_STACKS = 64
MAX_ERROR_CHARS = 500
_MAX_WHERE_CHARS = 200
_MIN_TEXT_BYTES = 256


def stored_size(stacks: Sequence[pb.RankStack]) -> int:
    """Bytes the stacks take as the ``stacks`` data value of an event, escaped inside its JSON."""
    inner = _stacks_json(stacks)
    return len(json.dumps(inner).encode())


def _stacks_json(stacks: Sequence[pb.RankStack]) -> str:
    return json.dumps(
        [json_format.MessageToDict(s, preserving_proto_field_name=True) for s in stacks], separators=(",", ":")
    )


def bounded(
    stacks: Sequence[pb.RankStack],
    *,
    keep_rank: int | None = None,
    max_text_bytes: int = MAX_TEXT_BYTES,
    max_bytes: int = MAX_STACKS_BYTES,
) -> list[pb.RankStack]:
    """Copies of ``stacks`` cut to the bounds: each text to ``max_text_bytes`` (the main thread
    kept, with a marker: :func:`stackgroups.trim`), then the peers' texts (all but ``keep_rank``'s)
    halved until the whole fits ``max_bytes`` as stored, then ``keep_rank``'s too. Errors and
    labels are cut to a few hundred characters; at most :data:`MAX_STACKS` stacks are kept
    (``keep_rank``'s among them)."""
    chosen = list(stacks)
    if len(chosen) > MAX_STACKS:
        first = [s for s in chosen if s.rank == keep_rank][:1]
        chosen = first + [s for s in chosen if s.rank != keep_rank][: MAX_STACKS - len(first)]
    out: list[pb.RankStack] = []
    for stack in chosen:
        copy = pb.RankStack()
        copy.CopyFrom(stack)
        if not copy.where and copy.text:
            copy.where = stackgroups.where(copy.text)
        copy.where = copy.where[:_MAX_WHERE_CHARS]
        copy.error = copy.error[:MAX_ERROR_CHARS]
        copy.tool = copy.tool[:32]
        copy.text = stackgroups.trim(copy.text, max_text_bytes) if copy.text else ""
        out.append(copy)
    originals = {id(c): c.text for c in out}
    for keep_whole in (True, False):
        budget = max_text_bytes
        while stored_size(out) > max_bytes and budget > _MIN_TEXT_BYTES:
            budget //= 2
            for copy in out:
                if keep_whole and copy.rank == keep_rank:
                    continue
                copy.text = stackgroups.trim(originals[id(copy)], budget) if copy.text else ""
    while stored_size(out) > max_bytes and out:
        out.pop()  # only with absurd bounds or thousands of ranks: whole stacks go, last first
    return out


def event_message(fault: pb.Fault, stacks: Sequence[pb.RankStack]) -> str:
    """The event's one line: ``stacks at rank 2's hang: 3 ranks in all_reduce (0, 1, 3); rank 2 in Event.wait``."""
    return f"stacks at rank {fault.rank}'s {fault.kind or 'fault'}: {stackgroups.summary(stacks)}"


def event_data(fault: pb.Fault, recovery_id: int, stacks: Sequence[pb.RankStack]) -> dict[str, str]:
    """The ``data`` of the ``hang_stacks`` event for ``fault`` (``stacks`` already :func:`bounded`)."""
    return {
        "fault_id": fault.fault_id,
        "recovery": str(recovery_id),
        "kind": fault.kind,
        "summary": stackgroups.summary(stacks),
        "stacks": _stacks_json(stacks),
    }


@dataclass(frozen=True, slots=True)
class HangStacks:
    """One ``hang_stacks`` event, read back."""

    event: pb.Event
    fault_id: str
    recovery: int
    kind: str
    summary: str
    stacks: tuple[pb.RankStack, ...]


def from_event(event: pb.Event) -> HangStacks | None:
    """The stacks an event holds; None unless it is a readable ``hang_stacks`` event (events are
    input like any other key: a bad one is skipped, never a crash)."""
    if event.reason != REASON:
        return None
    data: Mapping[str, str] = event.data
    try:
        items = json.loads(data.get("stacks", "[]"))
        if not isinstance(items, list):
            return None
        stacks = []
        for item in items:
            stack = pb.RankStack()
            json_format.ParseDict(item, stack, ignore_unknown_fields=True)
            if stack.text and not stack.where:
                stack.where = stackgroups.where(stack.text)
            stacks.append(stack)
        recovery = int(data.get("recovery", "0") or 0)
    except (ValueError, TypeError, AttributeError, json_format.ParseError, RecursionError):
        return None
    return HangStacks(
        event=event,
        fault_id=data.get("fault_id", ""),
        recovery=recovery,
        kind=data.get("kind", ""),
        summary=data.get("summary", "") or stackgroups.summary(stacks),
        stacks=tuple(stacks),
    )
