"""Data-parallel training that survives a peer's death without restarting the survivors.

A training script adopts it in a few lines::

    trainer = ResilientTrainer(model, optimizer)        # joins the job's group (rendezvous in etcd)
    for step in trainer.steps(total_steps):             # yields the same step again after a recovery
        with trainer.step_scope():                      # a RetryableFault inside rolls the step back
            optimizer.zero_grad()
            loss_fn(model(inputs(step)), targets(step)).backward()
            trainer.apply()                             # average gradients, then optimizer.step()

What happens on a peer's failure (recover-in-place: recoverd restarts only the dead rank):

1. the survivors' gradient all-reduce fails or is aborted (:mod:`.group`); nobody exits;
2. every rank forms the next generation of the group, the replacement included (it joins when the
   agent has started it);
3. the ranks agree on the step to resume: the lowest step any rank holding state has completed. A
   survivor that already applied that step (the all-reduce completed for it but not for a peer)
   rolls back to the snapshot taken before its optimizer step;
4. the lowest-numbered rank holding state broadcasts the model's and the optimizer's state (bytes of
   ``torch.save``), so the replacement needs no checkpoint on disk, and every rank carries on from
   the same step with bitwise the same state.

The same path serves ``retry``: a rank that raises :class:`RetryableFault` inside ``step_scope``
aborts the generation, and every rank rolls the step back and runs it again, with no process
restarted. A fresh rank (at the job's start, or a replacement) may bring state from disk with
``load_state``; otherwise the first formation broadcasts rank 0's initial state, as DDP does.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from recoverd.keys import Keyspace, RunRef
from taskd_client.pytorch.group import GroupFailed, ResilientGroup
from taskd_client.pytorch.store import EtcdStore

__all__ = ["RankEnv", "ResilientTrainer", "RetryableFault"]

log = logging.getLogger(__name__)


_NONE, _FROM_DISK, _LIVE = 0, 1, 2


class RetryableFault(RuntimeError):
    """Raise inside ``step_scope`` for a fault the step can be re-run after (an uncorrectable memory
    error, a link flap): every rank rolls the step back and runs it again."""


@dataclass(frozen=True, slots=True)
class RankEnv:
    """Where this rank is, from the variables recoverd's agent sets."""

    rank: int
    world_size: int
    etcd: str
    prefix: str
    job: str
    run: str

    @classmethod
    def from_environ(cls) -> RankEnv:
        missing = [
            v for v in ("RANK", "WORLD_SIZE", "RECOVERD_ETCD", "RECOVERD_JOB", "RECOVERD_RUN") if v not in os.environ
        ]
        if missing:
            raise RuntimeError(f"not started by a recoverd agent: {', '.join(missing)} unset")
        return cls(
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            etcd=os.environ["RECOVERD_ETCD"],
            prefix=os.environ.get("RECOVERD_PREFIX") or Keyspace().prefix,
            job=os.environ["RECOVERD_JOB"],
            run=os.environ["RECOVERD_RUN"],
        )


def _to_bytes(state: dict[str, Any]) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _from_bytes(data: torch.Tensor) -> dict[str, Any]:
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False)  # type: ignore[no-any-return]


class ResilientTrainer:
    """See the module docstring. ``on_event(text)`` receives a line per recovery milestone."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        env: RankEnv | None = None,
        load_state: Callable[[], tuple[int, dict[str, Any]] | None] | None = None,
        timeout: timedelta = timedelta(seconds=60),
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.env = env or RankEnv.from_environ()
        self.model = model
        self.optimizer = optimizer
        self.rank = self.env.rank
        self.world_size = self.env.world_size
        self._on_event = on_event or (lambda text: log.info("%s", text))
        prefix = Keyspace(self.env.prefix).rendezvous_prefix(RunRef(self.env.job, self.env.run))
        self.store = EtcdStore(self.env.etcd, prefix, timeout=timeout)
        self.group = ResilientGroup(self.store, self.rank, self.world_size, timeout=timeout)
        #: The next step to run (= steps completed).
        self.step = 0
        #: What state this rank holds: NONE, FROM_DISK (load_state) or LIVE (trained in this process,
        #: newer than any checkpoint).
        self._state = _NONE
        self._snapshot: tuple[dict[str, Any], dict[str, Any]] | None = None
        self._applied = False
        self.recoveries = 0
        loaded = load_state() if load_state else None
        if loaded is not None:
            self.step, state = loaded
            self._load(state)
            self._state = _FROM_DISK
        self._recover("start")

    # ------------------------------------------------------------------ the loop
    def steps(self, total: int) -> Iterator[int]:
        """Yield the step to run until ``total`` steps are done; after a recovery, the agreed step."""
        while self.step < total:
            self._applied = False
            recoveries = self.recoveries
            yield self.step
            if not self._applied and self.recoveries == recoveries:
                raise RuntimeError("call trainer.apply() once in every step")

    @contextlib.contextmanager
    def step_scope(self) -> Iterator[None]:
        """A :class:`RetryableFault` raised inside rolls this step back in every rank."""
        try:
            yield
        except RetryableFault as fault:
            self._emit(f"rank {self.rank}: retryable fault in step {self.step}: {fault}; rolling back everywhere")
            self.group.abort(f"rank {self.rank} retries step {self.step}: {fault}")
            self._recover("retry")

    def apply(self) -> bool:
        """Average the gradients over every rank, then step the optimizer. False when a peer's
        failure interrupted the step: the group was re-formed and ``steps`` yields the agreed step."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        flat = _flatten_dense_tensors(grads)
        try:
            self.group.allreduce_(flat)
        except GroupFailed as err:
            self._emit(f"rank {self.rank}: step {self.step} interrupted: {err}")
            self._recover("peer failure")
            return False
        flat /= self.world_size
        for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            grad.copy_(synced)
        self._snapshot = (
            {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            copy.deepcopy(self.optimizer.state_dict()),
        )
        self.optimizer.step()
        self.step += 1
        self._applied = True
        return True

    def state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def close(self) -> None:
        self.group.close()
        self.store.close()

    # ------------------------------------------------------------------ recovery
    def _emit(self, text: str) -> None:
        self._on_event(text)

    def _load(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def _recover(self, why: str) -> None:
        started = time.monotonic()
        while True:
            try:
                generation = self.group.form()
                formed = time.monotonic()
                source = self._sync()
                break
            except GroupFailed as err:
                self._emit(f"rank {self.rank}: generation failed while recovering ({err}); forming the next")
        if why != "start":
            self.recoveries += 1
        self._emit(
            f"rank {self.rank}: generation {generation} formed in {1000 * (formed - started):.0f} ms ({why});"
            f" resuming at step {self.step} with the state of rank {source}"
            f" ({1000 * (time.monotonic() - formed):.0f} ms to sync)"
        )

    def _sync(self) -> int:
        """Agree on the step, roll back if ahead, and copy the state from the lowest holder.

        The holders are the ranks with the freshest kind of state: live state (survivors) wins over
        a checkpoint loaded from disk (a replacement), which wins over none (all fresh)."""
        mine = torch.tensor([self._state, self.step], dtype=torch.int64)
        everyone = self.group.allgather(mine)
        best = max(int(t[0]) for t in everyone)
        holders = [r for r, t in enumerate(everyone) if int(t[0]) == best]
        source = min(holders)
        resume = min(int(everyone[r][1]) for r in holders) if best != _NONE else 0
        if self._state == best != _NONE and self.step > resume:
            if self.step != resume + 1 or self._snapshot is None:
                raise RuntimeError(f"rank {self.rank} is at step {self.step}, cannot roll back to {resume}")
            model_state, optimizer_state = self._snapshot
            self._load({"model": model_state, "optimizer": optimizer_state})
            self._emit(f"rank {self.rank}: rolled back from step {self.step} to {resume}")
        blob = _to_bytes(self.state()) if self.rank == source else torch.empty(0, dtype=torch.uint8)
        size = self.group.broadcast_(torch.tensor([blob.numel()], dtype=torch.int64), source)
        if self.rank != source:
            blob = torch.empty(int(size[0]), dtype=torch.uint8)
        self.group.broadcast_(blob, source)
        if self.rank != source:
            self._load(_from_bytes(blob))
        self.step = resume
        self._state = _LIVE
        self._snapshot = None
        return source
