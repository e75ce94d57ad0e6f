"""recoverd's ``dump`` for a ResilientTrainer: every rank saves its state, the job restarts, every
rank resumes from the saved step.

The controller (:mod:`.relay`) turns ``changeStrategy=dump`` into a request in the rendezvous store
(``dump/request``: the dump's id) and aborts the current generation, so every rank leaves its
training loop for the group's next formation, where :meth:`Dumps.pending` finds the request. Each
rank writes ``<dir>/dump-<id>/rank<RANK>.pt`` (``torch.save`` of ``{"step", "state"}``, written
to a temporary file and renamed) and marks ``dump/<id>/saved/<RANK>``; the controller waits for
the marks of the ranks still alive, records ``dump/latest`` and answers recoverd, which restarts
every rank (``dump_exit``). A restarted rank loads its file of ``dump/latest`` (:meth:`load`); a
rank that has none (the one whose death caused the dump) gets the state from a peer, as a
replacement does. The ranks of a data-parallel job hold the same state, one step apart at most;
the trainer resumes at the lowest saved step.

Through the node agents (docs/adr/0036) nothing goes through etcd: the agents relay the dump to
every rank and collect the answers, and each rank that saved records its own latest dump of the run
beside its file (:meth:`Dumps.save_local`, ``<dir>/latest-<run>-rank<RANK>``), which a restarted
rank loads (:meth:`load_local`). A rank whose save failed keeps its earlier pointer, if any; the
trainer's agreement (the lowest step among the ranks that loaded one) keeps the ranks consistent.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from taskd_client.pytorch.store import EtcdStore

__all__ = ["Dumps"]

REQUEST = "dump/request"
LATEST = "dump/latest"
POLL_MIN_S = 0.005
POLL_MAX_S = 0.1


def _saved_key(dump_id: str, rank: int) -> str:
    return f"dump/{dump_id}/saved/{rank}"


class Dumps:
    """One rank's side of a dump (``rank``: its global rank) and the controller's (request, wait)."""

    def __init__(self, store: EtcdStore, directory: str | os.PathLike[str] | None, rank: int, run: str = "") -> None:
        self.store = store
        self.directory = Path(directory) if directory is not None else None
        self.rank = rank
        self.run = run
        #: A request older than this process is not ours (its controller died before clearing it).
        self._handled = self._request()

    def _request(self) -> str | None:
        raw = self.store.peek(REQUEST)
        return raw.decode() if raw else None

    def _file(self, dump_id: str, rank: int) -> Path:
        assert self.directory is not None
        return self.directory / f"dump-{dump_id}" / f"rank{rank}.pt"

    # ------------------------------------------------------------------ every rank
    def pending(self) -> str | None:
        """The id of a dump requested since this process started and not yet saved by it."""
        dump_id = self._request()
        return dump_id if dump_id and dump_id != self._handled else None

    def _write(self, dump_id: str, step: int, state: dict[str, Any]) -> Path:
        if self.directory is None:
            raise OSError("no dump directory (RecoveryProtocol(dump_dir=...))")
        path = self._file(dump_id, self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save({"step": step, "state": state}, tmp)
        os.replace(tmp, path)
        self._handled = dump_id
        return path

    def save(self, dump_id: str, step: int, state: dict[str, Any]) -> Path:
        """Write this rank's state for dump ``dump_id`` (not marked saved yet: :meth:`mark_saved`,
        after which the job may be restarted at any moment). Raises OSError."""
        return self._write(dump_id, step, state)

    def mark_saved(self, dump_id: str, step: int) -> None:
        """Tell the relay this rank's part of ``dump_id`` is saved."""
        self.store.set(_saved_key(dump_id, self.rank), str(step))

    def _pointer(self) -> Path:
        assert self.directory is not None
        return self.directory / f"latest-{self.run}-rank{self.rank}"

    def save_local(self, dump_id: str, step: int, state: dict[str, Any]) -> Path:
        """Write this rank's state for dump ``dump_id`` and make it the one this rank loads after a
        restart of this run (no etcd write: the agents collect the answers). Raises OSError."""
        path = self._write(dump_id, step, state)
        pointer = self._pointer()
        tmp = pointer.with_suffix(".tmp")
        tmp.write_text(dump_id)
        os.replace(tmp, pointer)
        return path

    def load_local(self) -> tuple[int, dict[str, Any]] | None:
        """(step, state) of this rank's latest dump of this run (:meth:`save_local`); None if none."""
        if self.directory is None or not self._pointer().exists():
            return None
        path = self._file(self._pointer().read_text().strip(), self.rank)
        if not path.exists():
            return None
        saved = torch.load(path, weights_only=False)
        return int(saved["step"]), saved["state"]

    def load(self) -> tuple[int, dict[str, Any]] | None:
        """(step, state) of this rank's file of the latest completed dump; None if there is none."""
        if self.directory is None:
            return None
        raw = self.store.peek(LATEST)
        if not raw:
            return None
        path = self._file(raw.decode(), self.rank)
        if not path.exists():
            return None
        saved = torch.load(path, weights_only=False)
        return int(saved["step"]), saved["state"]

    # ------------------------------------------------------------------ the controller
    def request(self, dump_id: str) -> None:
        self.store.set(REQUEST, dump_id)

    def wait_saved(self, dump_id: str, ranks: list[int], timeout_s: float) -> list[int]:
        """Wait until every one of ``ranks`` has saved, or ``timeout_s``; return those that did."""
        deadline = time.monotonic() + timeout_s
        delay = POLL_MIN_S
        while True:
            saved = [r for r in ranks if self.store.check([_saved_key(dump_id, r)])]
            if len(saved) == len(ranks) or time.monotonic() >= deadline:
                return saved
            time.sleep(delay)
            delay = min(delay * 2, POLL_MAX_S)

    def complete(self, dump_id: str) -> None:
        """Make ``dump_id`` the one restarted ranks load, and withdraw its request."""
        self.store.set(LATEST, dump_id)
        self.store.delete_key(REQUEST)
