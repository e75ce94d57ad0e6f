"""The current value of each key an agent watches, kept from its watches: a reconcile reads no etcd.

An agent wakes whenever its recovery record, command, status, node record or job spec changes; its
reconcile then needs those values. Reading them from etcd on every wake cost every agent three range
reads per coordinator pass, ~1,500 reads a pass at 512 nodes (docs/scale.md). The watch that wakes
the agent carries the new value anyway, so it is kept here; a key not seen yet (or after the watch
resynced) is read once, with the revision of the read, and the newer of the two always wins.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from recoverd.errors import BadRecord
from recoverd.records import decode
from recoverd.store import Resync, Store, WatchEvent

__all__ = ["WatchedKeys"]

#: Records decoded in this process, by (class, value): agents that share a process (simulated
#: nodes, docs/scale.md) decode a recovery record once, not once each. Read-only to every user.
_SHARED: OrderedDict[tuple[type, bytes], Any] = OrderedDict()
_SHARED_MAX = 64


class WatchedKeys:
    """Latest values of a few exact keys, from watch events and reads (newest revision wins)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        #: key -> (the revision the value is as of, the value or None when absent)
        self._values: dict[str, tuple[int, bytes | None]] = {}
        #: key -> (value, decoded record) of the last decode, reused while the value is unchanged
        self._decoded: dict[str, tuple[bytes, Any]] = {}

    def apply(self, key: str, item: WatchEvent | Resync) -> None:
        """A watch of ``key`` delivered ``item``: keep the value, or forget it after a resync."""
        if isinstance(item, Resync):
            self._values.pop(key, None)  # events may have been missed: read it again when needed
            return
        self._set(key, item.mod_revision, None if item.is_delete else item.value)

    def forget(self, key: str) -> None:
        """Read ``key`` from etcd the next time it is asked for (a newer watch event still wins)."""
        self._values.pop(key, None)

    def _set(self, key: str, as_of: int, value: bytes | None) -> None:
        known = self._values.get(key)
        if known is None or as_of >= known[0]:
            self._values[key] = (as_of, value)

    async def value(self, key: str) -> bytes | None:
        """The key's current value (None: absent), read from etcd only if not known yet."""
        known = self._values.get(key)
        if known is None:
            snap = await self.store.read(key)
            self._set(key, snap.revision, snap.kvs[0].value if snap.kvs else None)
            known = self._values[key]
        return known[1]

    async def record(self, key: str, cls: type) -> Any | None:
        """The key's value decoded as ``cls`` (None: absent); BadRecord if it does not decode."""
        value = await self.value(key)
        if value is None:
            return None
        cached = self._decoded.get(key)
        if cached is not None and cached[0] == value and isinstance(cached[1], cls):
            return cached[1]
        shared = _SHARED.get((cls, value))
        if shared is not None:
            _SHARED.move_to_end((cls, value))
            record: Any = shared
        else:
            try:
                record = decode(cls, value, key)
            except BadRecord:
                self._decoded.pop(key, None)
                raise
            _SHARED[(cls, value)] = record
            if len(_SHARED) > _SHARED_MAX:
                _SHARED.popitem(last=False)
        self._decoded[key] = (value, record)
        return record
