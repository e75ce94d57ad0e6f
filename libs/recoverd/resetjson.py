"""The reset ConfigMap's ``reset.json``: parse it, and write it back with every key.

``reset.json`` is MindCluster's per-job reset record (contract §10). Its keys are the Go field names
of ``TaskResetInfo``/``TaskDevInfo``/``DevFaultInfo`` (the structs have no JSON tags), and three
writers replace the whole document: the device plugin (per-chip ``unrecovered`` → ``recovered`` /
``failed`` entries), ClusterD (``fault`` entries, ``FaultFlushing``, ``RestartFaultProcess``) and the
Volcano plugin (``RetryTime``, ``GracefulExit``). Readers are TaskD's ``FaultProcessor`` and
``reset_process.py`` (§11).

This module is pure: :func:`parse` and :func:`dumps` do no I/O and touch no clock.
:func:`read_file` and :func:`write_file` are the small edge helpers.

Choices that differ from upstream, and why (contract §12):

* ``json.loads``, never ``ast.literal_eval``: current writers emit the JSON booleans ``true``/``false``
  for ``FaultFlushing`` and ``RestartFaultProcess``, which ``literal_eval`` rejects.
* A missing key, or ``null``, takes the Go zero value (what Go's ``json.Unmarshal`` does): ClusterD
  marshals a nil ``ErrorCode`` as ``null``, older writers omit ``FaultFlushing`` and friends, and
  TaskD's own fixtures carry ``"InitialPolicy": null``. Two keys have no safe default and are
  required: an entry's ``RankId`` (a default of 0 would invent a fault on rank 0) and ``Status``.
* The XDL sample seed ``{"status":"initializing"}`` is the empty state; any other top-level
  ``status`` is rejected. Other unknown keys are ignored, so a newer writer's additions do not break
  this reader (they are not carried through :func:`dumps`).
* Anything else malformed raises :class:`~recoverd.errors.BadRecord` naming the key, the value and the
  JSON type found: truncated JSON (with line, column and offset), a wrong type (``"3"`` or ``true``
  for an integer), an integer outside its Go type's range, a negative or duplicate ``RankId``, an
  unknown ``Status``, a key repeated in one object, a document over ``max_bytes``. Parsing either
  returns a whole :class:`ResetState` or raises: nothing is applied partially.
* :func:`dumps` always emits every key in Go's declaration order, compact, with ``RankList`` sorted by
  ``RankId``. Upstream writers clobber each other's keys; recoverd never drops one.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import suppress
from dataclasses import dataclass
from enum import StrEnum
from itertools import pairwise
from typing import Any

from recoverd.errors import BadRecord

__all__ = [
    "MAX_BYTES",
    "SEED",
    "RankEntry",
    "RankStatus",
    "ResetState",
    "dumps",
    "parse",
    "read_file",
    "write_file",
]

#: The largest document :func:`parse` accepts. A ConfigMap holds at most 1 MiB in all.
MAX_BYTES = 1 << 20

#: What the XDL sample YAMLs seed ``reset.json`` with before any writer has run.
SEED = '{"status":"initializing"}'

_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)


class RankStatus(StrEnum):
    """A ``RankList`` entry's ``Status``, stored by its upstream string.

    The device plugin's hot-reset path moves a chip ``UNRECOVERED`` → ``RECOVERED`` or ``FAILED``;
    ClusterD marks the ranks of a process-level fault list ``FAULT``. A rank needs action while it
    is ``FAULT`` or ``UNRECOVERED`` (see :meth:`ResetState.fault_ranks`).
    """

    UNRECOVERED = "unrecovered"
    """Device plugin: the chip faulted and its reset has not finished yet."""
    RECOVERED = "recovered"
    """Device plugin: the chip was reset and is healthy again; its rank may be restarted."""
    FAILED = "failed"
    """Device plugin: the reset was retried and gave up; the job is rescheduled instead."""
    FAULT = "fault"
    """ClusterD: the rank is in the current fault list (its process must be restarted)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankEntry:
    """One ``RankList`` entry (Go ``TaskDevInfo`` with ``DevFaultInfo`` embedded).

    ``policy`` and ``initial_policy`` stay plain strings (upstream uses ``empty``, ``ignore``,
    ``restart_request``, ``restart``, ``free_reset``, ``reset``, ``isolate``): this reader passes a
    newer policy through rather than rejecting the whole document.
    """

    rank_id: int
    logic_id: int = 0
    status: RankStatus
    policy: str = ""
    initial_policy: str = ""
    error_code: tuple[int, ...] = ()
    error_code_hex: str = ""

    def __post_init__(self) -> None:
        if self.rank_id < 0:
            raise ValueError(f"rank_id must not be negative, got {self.rank_id}")
        # Accept the plain string too (a StrEnum compares equal to it) but always store the enum.
        object.__setattr__(self, "status", RankStatus(self.status))
        object.__setattr__(self, "error_code", tuple(self.error_code))


@dataclass(frozen=True, slots=True, kw_only=True)
class ResetState:
    """A whole ``reset.json`` (Go ``TaskResetInfo``); the defaults are Go's zero values.

    ``rank_list`` is sorted by ``rank_id`` with no rank twice (checked on construction), so two
    states that say the same thing compare equal and :func:`dumps` is stable. ``update_time`` is
    the writer's wall clock in Unix seconds.
    """

    rank_list: tuple[RankEntry, ...] = ()
    update_time: int = 0
    retry_time: int = 0
    fault_flushing: bool = False
    graceful_exit: int = 0
    restart_fault_process: bool = False

    def __post_init__(self) -> None:
        rank_list = tuple(self.rank_list)
        ids = [entry.rank_id for entry in rank_list]
        if any(a >= b for a, b in pairwise(ids)):
            raise ValueError(f"rank_list must be sorted by rank_id with no rank twice, got {ids}")
        object.__setattr__(self, "rank_list", rank_list)

    def entry(self, rank_id: int) -> RankEntry | None:
        """The entry for ``rank_id``, or None when the document does not name it."""
        return next((entry for entry in self.rank_list if entry.rank_id == rank_id), None)

    def fault_ranks(self) -> tuple[int, ...]:
        """Ranks that need action: ``fault`` (ClusterD) or ``unrecovered`` (device plugin), ascending."""
        return self._ranks_with(RankStatus.FAULT, RankStatus.UNRECOVERED)

    def recovered_ranks(self) -> tuple[int, ...]:
        """Ranks whose chip the device plugin reports ``recovered``, ascending."""
        return self._ranks_with(RankStatus.RECOVERED)

    def unrecovered_ranks(self) -> tuple[int, ...]:
        """Ranks whose chip the device plugin reports ``unrecovered``, ascending."""
        return self._ranks_with(RankStatus.UNRECOVERED)

    def _ranks_with(self, *statuses: RankStatus) -> tuple[int, ...]:
        return tuple(entry.rank_id for entry in self.rank_list if entry.status in statuses)


# ---------------------------------------------------------------------------------------- parse


def parse(text: str | bytes, *, max_bytes: int = MAX_BYTES, source: str = "reset.json") -> ResetState:
    """Parse a ``reset.json`` document; raise :class:`BadRecord` (naming ``source``) if it is malformed.

    Pure and all-or-nothing: it returns a whole state or raises. See the module docstring for what
    is tolerated (missing keys, ``null``, unknown keys, the seed) and what is rejected.
    """
    if isinstance(text, str) and len(text) > max_bytes:
        # Every character is at least one byte: refuse before encoding a huge string.
        raise BadRecord(f"{source}: at least {len(text)} bytes is larger than the {max_bytes}-byte limit")
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    if len(raw) > max_bytes:
        raise BadRecord(f"{source}: {len(raw)} bytes is larger than the {max_bytes}-byte limit")
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRecord(f"{source}: not UTF-8 ({err.reason} at byte {err.start})") from err
    if not decoded.strip():
        raise BadRecord(f"{source}: empty document (the seed is {SEED})")
    try:
        doc = json.loads(decoded, object_pairs_hook=_reject_duplicate_keys, parse_constant=_reject_constant)
    except json.JSONDecodeError as err:
        truncated = "; the document ends there (truncated?)" if err.pos >= len(decoded.rstrip()) else ""
        raise BadRecord(
            f"{source}: not valid JSON: {err.msg} at line {err.lineno} column {err.colno} (char {err.pos}){truncated}"
        ) from err
    except RecursionError as err:
        raise BadRecord(f"{source}: JSON nested too deeply") from err
    except _DocumentError as err:
        raise BadRecord(f"{source}: {err}") from err
    try:
        return _state_from(doc)
    except _DocumentError as err:
        raise BadRecord(f"{source}: {err}") from err


class _DocumentError(ValueError):
    """Raised inside the parser; :func:`parse` prefixes the source and re-raises it as BadRecord."""


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DocumentError(f"key {key!r} appears twice in one JSON object")
        obj[key] = value
    return obj


def _reject_constant(name: str) -> Any:
    raise _DocumentError(f"{name} is not JSON")


def _state_from(doc: Any) -> ResetState:
    if not isinstance(doc, dict):
        raise _DocumentError(f"top level is {_json_type(doc)}, expected an object")
    seed = doc.get("status")
    if seed is not None and seed != "initializing":
        raise _DocumentError(f"top-level status is {seed!r}; only the seed {SEED} has one")
    raw_list = doc.get("RankList")
    if raw_list is None:
        raw_list = []
    elif not isinstance(raw_list, list):
        raise _DocumentError(f"RankList must be an array, found {_describe(raw_list)}")
    entries = [_entry_from(raw, index) for index, raw in enumerate(raw_list)]
    first_index: dict[int, int] = {}
    for index, entry in enumerate(entries):
        if entry.rank_id in first_index:
            raise _DocumentError(
                f"RankList has RankId {entry.rank_id} twice (entries {first_index[entry.rank_id]} and {index})"
            )
        first_index[entry.rank_id] = index
    entries.sort(key=lambda entry: entry.rank_id)
    return ResetState(
        rank_list=tuple(entries),
        update_time=_int(doc, "UpdateTime", "UpdateTime", _INT64),
        retry_time=_int(doc, "RetryTime", "RetryTime", _INT64),
        fault_flushing=_bool(doc, "FaultFlushing", "FaultFlushing"),
        graceful_exit=_int(doc, "GracefulExit", "GracefulExit", _INT64),
        restart_fault_process=_bool(doc, "RestartFaultProcess", "RestartFaultProcess"),
    )


def _entry_from(raw: Any, index: int) -> RankEntry:
    where = f"RankList[{index}]"
    if not isinstance(raw, dict):
        raise _DocumentError(f"{where} must be an object, found {_describe(raw)}")
    if raw.get("RankId") is None:
        raise _DocumentError(f"{where} has no RankId")
    rank_id = _int(raw, "RankId", f"{where}.RankId", _INT64)
    if rank_id < 0:
        raise _DocumentError(f"{where}.RankId is {rank_id}; a rank id is never negative")
    where = f"{where} (RankId {rank_id})"
    status = raw.get("Status")
    if status is None:
        raise _DocumentError(f"{where} has no Status")
    if not isinstance(status, str):
        raise _DocumentError(f"{where}.Status must be a string, found {_describe(status)}")
    try:
        rank_status = RankStatus(status)
    except ValueError:
        known = ", ".join(member.value for member in RankStatus)
        raise _DocumentError(f"{where}.Status is {status!r}; expected one of {known}") from None
    codes = raw.get("ErrorCode")
    if codes is None:
        codes = []
    elif not isinstance(codes, list):
        raise _DocumentError(f"{where}.ErrorCode must be an array, found {_describe(codes)}")
    error_code = tuple(_check_int(code, f"{where}.ErrorCode[{i}]", _INT64) for i, code in enumerate(codes))
    return RankEntry(
        rank_id=rank_id,
        logic_id=_int(raw, "LogicId", f"{where}.LogicId", _INT32),
        status=rank_status,
        policy=_str(raw, "Policy", f"{where}.Policy"),
        initial_policy=_str(raw, "InitialPolicy", f"{where}.InitialPolicy"),
        error_code=error_code,
        error_code_hex=_str(raw, "ErrorCodeHex", f"{where}.ErrorCodeHex"),
    )


def _int(obj: dict[str, Any], key: str, where: str, bounds: tuple[int, int]) -> int:
    value = obj.get(key)
    return 0 if value is None else _check_int(value, where, bounds)


def _check_int(value: Any, where: str, bounds: tuple[int, int]) -> int:
    # bool is an int subclass in Python; Go refuses true for an int field, and so do we.
    if not isinstance(value, int) or isinstance(value, bool):
        raise _DocumentError(f"{where} must be an integer, found {_describe(value)}")
    low, high = bounds
    if not low <= value <= high:
        bits = 32 if bounds == _INT32 else 64
        raise _DocumentError(f"{where} is {value}, outside the int{bits} range")
    return value


def _bool(obj: dict[str, Any], key: str, where: str) -> bool:
    value = obj.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _DocumentError(f"{where} must be a boolean, found {_describe(value)}")
    return value


def _str(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _DocumentError(f"{where} must be a string, found {_describe(value)}")
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _describe(value: Any) -> str:
    shown = json.dumps(value, ensure_ascii=False)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"{_json_type(value)} {shown}"


# ---------------------------------------------------------------------------------------- dumps


def dumps(state: ResetState) -> str:
    """Serialise ``state`` as compact JSON with every key, in Go's field order, ``RankList`` by ``RankId``.

    ``parse(dumps(s)) == s`` for every valid state, and equal states give identical text.
    """
    doc = {
        "RankList": [
            {
                "RankId": entry.rank_id,
                "LogicId": entry.logic_id,
                "Status": entry.status.value,
                "Policy": entry.policy,
                "InitialPolicy": entry.initial_policy,
                "ErrorCode": list(entry.error_code),
                "ErrorCodeHex": entry.error_code_hex,
            }
            for entry in sorted(state.rank_list, key=lambda entry: entry.rank_id)
        ],
        "UpdateTime": state.update_time,
        "RetryTime": state.retry_time,
        "FaultFlushing": state.fault_flushing,
        "GracefulExit": state.graceful_exit,
        "RestartFaultProcess": state.restart_fault_process,
    }
    # ensure_ascii=False: Go's encoding/json writes UTF-8 as is.
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


# ----------------------------------------------------------------------------------------- edge


def read_file(path: str, *, max_bytes: int = MAX_BYTES) -> ResetState | None:
    """Read and parse ``path``; None when it does not exist, :class:`BadRecord` when malformed.

    Reads at most ``max_bytes + 1`` bytes, so a huge file is refused without loading it.
    """
    try:
        with open(path, "rb") as handle:
            raw = handle.read(max_bytes + 1)
    except FileNotFoundError:
        return None
    return parse(raw, max_bytes=max_bytes, source=path)


def write_file(path: str, state: ResetState) -> None:
    """Write ``state`` to ``path`` atomically (temp file in the same directory, fsync, rename).

    A reader sees the old document or the new one, never half of one. Not for a mounted ConfigMap
    (read-only, and updated through the API server): for local mode and tests.
    """
    directory = os.path.dirname(os.path.abspath(path))
    data = dumps(state).encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=".reset.json.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        # Cleanup also on cancellation; the original error propagates.
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
