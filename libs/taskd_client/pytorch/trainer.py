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
3. the ranks agree on the step to resume: the lowest step any rank holding the freshest state has
   completed (a survivor whose all-reduce completed when a peer's did not is one step ahead); what
   each holds was written with its join of the generation, so this needs no collective;
4. the lowest-numbered rank at that step sends the model's, the optimizer's and any ``extra``
   object's state (bytes of ``torch.save``) to the ranks that need it (:mod:`.agreement`): the
   replacement needs no checkpoint on disk, a rank that was ahead is put back, a rank that raised
   a :class:`RetryableFault` is repaired, and a survivor at that step keeps its own (it is bitwise
   the same), so every rank carries on from the same step with bitwise the same state. Model
   buffers that a forward pass changes (BatchNorm statistics) are restored to the start of the
   interrupted step first, so re-running it does not count it twice.

The training loop ends with a barrier: a rank that completed the last step while a peer died in it
does not leave before the others have it too (it takes part in their recovery instead).

**Backends and DDP.** The group takes the job's backend (``backend=``, else
``RECOVERD_TORCH_BACKEND``, else ``cpu:gloo,cuda:nccl`` where CUDA is available and ``gloo``
elsewhere). With ``ddp=True`` (or DDP's keyword arguments, or a function building the wrapper)
the trainer wraps the model in torch's own ``DistributedDataParallel`` on every generation's group
(:attr:`ResilientTrainer.ddp`): DDP buckets the gradients and overlaps their all-reduce with the
backward pass as usual, through a communication hook that fails at once when a peer dies, so
``backward()`` raises instead of blocking and ``step_scope`` recovers. Without it, gradients are
averaged by one flat all-reduce in :meth:`ResilientTrainer.apply`.

**Sharded models.** With ``mesh=`` (a mesh from :func:`.mesh.resilient_mesh`: FSDP2, HSDP, tensor
parallel) no rank holds the whole model: a replacement takes its shard from its twin, the rank
holding the same shard in another replica (twins.py, docs/adr/0047), or, with ``ram_copy_every``,
every rank goes back to a copy kept in a peer's RAM (ramcopies.py, docs/adr/0049). Where neither
exists the rank exits with code 86 and recoverd restarts the job from its checkpoint.

The same path serves ``retry``: a rank that raises :class:`RetryableFault` inside ``step_scope``
aborts the generation, and every rank rolls the step back and runs it again, with no process
restarted (through the agents, recoverd decides first: ``RecoveryProtocol.retry_decided``). A
fresh rank (at the job's start, or a replacement) may bring state from disk with ``load_state``;
otherwise the first formation sends rank 0's initial state to every rank, as DDP's broadcast does.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from recoverd.keys import Keyspace, RunRef
from recoverd.strategies import STATE_LOST_EXIT_CODE
from taskd_client import progress
from taskd_client.pytorch.agreement import Holding, Kind, NoTwin, agree, must_read_checkpoints
from taskd_client.pytorch.group import GroupFailed, ResilientGroup, parse_backend
from taskd_client.pytorch.store import open_store

if TYPE_CHECKING:
    from taskd_client.pytorch.protocol import RecoveryProtocol
    from taskd_client.pytorch.twins import TwinHealing

__all__ = ["BACKEND_ENV", "RankEnv", "ResilientTrainer", "RetryableFault", "StateLost", "default_backend"]

#: The job's backend when the script does not pass ``backend=`` (gloo, nccl, cpu:gloo,cuda:nccl).
BACKEND_ENV = "RECOVERD_TORCH_BACKEND"

#: ``ddp=``: False (one flat all-reduce), True, DistributedDataParallel's keyword arguments, or a
#: function ``(module, process_group) -> DistributedDataParallel``.
DdpSpec = bool | Mapping[str, Any] | Callable[[torch.nn.Module, Any], torch.nn.Module]


def default_backend() -> str:
    """What ``init_process_group`` would use: gloo for CPU tensors, NCCL for CUDA ones."""
    chosen = os.environ.get(BACKEND_ENV, "").strip()
    if chosen:
        parse_backend(chosen)  # a clear error now rather than at the first collective
        return chosen
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


log = logging.getLogger(__name__)


_NONE, _FROM_DISK, _SUSPECT, _LIVE = Kind.NONE, Kind.FROM_DISK, Kind.SUSPECT, Kind.LIVE


class StateLost(SystemExit):
    """A sharded model's shard is lost with every copy of it: the rank exits with
    ``STATE_LOST_EXIT_CODE``, which rules out every strategy that keeps live ranks, so recoverd
    restarts the job (`exit`) and the ranks read the checkpoint (docs/adr/0049)."""

    def __init__(self, reason: str) -> None:
        super().__init__(STATE_LOST_EXIT_CODE)
        self.reason = reason


class RetryableFault(RuntimeError):
    """Raise inside ``step_scope`` for a fault the step can be re-run after (an uncorrectable memory
    error, a link flap): every rank rolls the step back and runs it again.

    ``fault_type`` is MindCluster's: "0" an uncorrectable memory error (the default), "2" a link
    error. With ``RecoveryProtocol(via_agent=True)`` recoverd hears of it and decides: ``retry``
    (where the policy allows it), else a costlier strategy (this rank is then restarted)."""

    def __init__(self, *args: object, fault_type: str = "0") -> None:
        super().__init__(*args)
        self.fault_type = fault_type


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


def _from_bytes(data: torch.Tensor, device: torch.device) -> dict[str, Any]:
    """The state broadcast as bytes, its tensors on ``device`` (the source's may be another GPU)."""
    raw = data.cpu().numpy().tobytes()
    return torch.load(io.BytesIO(raw), map_location=device, weights_only=False)  # type: ignore[no-any-return]


class ResilientTrainer:
    """See the module docstring. ``on_event(text)`` receives a line per recovery milestone."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        env: RankEnv | None = None,
        load_state: Callable[[], tuple[int, dict[str, Any] | None] | None] | None = None,
        timeout: timedelta = timedelta(seconds=60),
        recover_timeout: timedelta = timedelta(seconds=300),
        extra: dict[str, Any] | None = None,
        on_event: Callable[[str], None] | None = None,
        backend: str | None = None,
        ddp: DdpSpec = False,
        protocol: RecoveryProtocol | None = None,
        mesh: Any = None,
        replicate_dim: str = "replicate",
        ram_copy_every: int = 0,
        keep_previous_step: bool = True,
    ) -> None:
        self.env = env or RankEnv.from_environ()
        self.model = model
        self.optimizer = optimizer
        #: Other objects with state_dict()/load_state_dict() (LR schedulers, GradScaler, ...) whose
        #: state travels with the model's.
        self.extra = dict(extra or {})
        #: A recovery that cannot form a group within this long ends the rank (exit 1), so
        #: recoverd takes over (a peer that already finished, or one that hangs).
        self.recover_timeout = recover_timeout
        self.rank = self.env.rank
        self.world_size = self.env.world_size
        self._on_event = on_event or (lambda text: log.info("%s", text))
        prefix = Keyspace(self.env.prefix).rendezvous_prefix(RunRef(self.env.job, self.env.run))
        self.store = open_store(self.env.etcd, prefix, timeout=timeout)
        self.group = ResilientGroup(
            self.store, self.rank, self.world_size, timeout=timeout, backend=backend or default_backend()
        )
        #: Each rank says what it holds as it joins a generation (read back in :meth:`_sync`).
        self.group.joining_note = lambda: self._holding().to_note()
        self._ddp_spec: DdpSpec = ddp
        #: A sharded model's healing from its twins (``mesh=``: twins.py); None: every rank holds
        #: the whole model (data parallel).
        self._twins: TwinHealing | None = None
        if mesh is not None:
            if ddp is not False or protocol is not None:
                raise ValueError(
                    "mesh= (a sharded model) does not take ddp= or protocol= (yet): FSDP2 reduces the gradients"
                    " itself, and elastic worlds and dumps of sharded models are not built (docs/pytorch.md)"
                )
            from taskd_client.pytorch.twins import TwinHealing

            self._twins = TwinHealing(
                mesh,
                model,
                optimizer,
                self.group,
                replicate_dim=replicate_dim,
                extra=extra,
                ram_copy_every=ram_copy_every,
                keep_previous_step=keep_previous_step,
                emit=self._emit,
            )
        elif ram_copy_every:
            raise ValueError("ram_copy_every= is for sharded models (mesh=): a DDP rank's peers hold its state")
        #: The model wrapped in DistributedDataParallel on the current generation's group (``ddp=``),
        #: rebuilt on every recovery; call the model through it. None without ``ddp=``.
        self.ddp: torch.nn.Module | None = None
        #: Buckets DDP handed to the hook in this step: none means the backward did not go through
        #: :attr:`ddp`, and the gradients were not averaged.
        self._hooked = 0
        #: The next step to run (= steps completed).
        self.step = 0
        #: What state this rank holds: NONE, FROM_DISK (load_state) or LIVE (trained in this process,
        #: newer than any checkpoint).
        self._state = _NONE
        #: The model's buffers at the start of the current step (a forward pass may change them).
        self._buffers: dict[str, torch.Tensor] = {}
        self._applied = False
        self._step_started = time.monotonic()
        self.recoveries = 0
        #: recoverd's protocol (elastic world, dump): protocol.py; None: survivors only.
        self.protocol = protocol
        if protocol is not None:
            protocol.attach(self)
        #: ``load_state``, not called yet: a fresh rank reads its checkpoint only when no peer
        #: holds live state (:meth:`_sync`); a replacement whose survivors do never reads it.
        self._load_state = load_state
        self._recover("start")

    # ------------------------------------------------------------------ the loop
    def steps(self, total: int) -> Iterator[int]:
        """Yield the step to run until ``total`` steps are done in every rank; after a recovery,
        the agreed step (so a step can come again)."""
        while True:
            while self.step < total:
                if self.protocol is not None and self.protocol.before_step(self):
                    continue  # re-formed for recoverd (world change, dump): the agreed step may differ
                self._applied = False
                recoveries = self.recoveries
                self._buffers = {name: b.detach().clone() for name, b in self.model.named_buffers()}
                if self._twins is not None:
                    self._twins.step_started(self.step)
                self._step_started = time.monotonic()
                yield self.step
                if not self._applied and self.recoveries == recoveries:
                    raise RuntimeError("call trainer.apply() once in every step")
            if self._all_done():
                progress.done()  # what follows (saving, closing the groups) is not a hang
                return

    def _all_done(self) -> bool:
        """The closing barrier: True once every rank has completed every step."""
        try:
            self.group.allreduce_(torch.zeros(1, device=self.group.device))
            return True
        except GroupFailed as err:
            self._emit(f"rank {self.rank}: a peer failed at the end of training: {err}")
            self._recover("peer failure")
            return False

    @contextlib.contextmanager
    def step_scope(self) -> Iterator[None]:
        """A :class:`RetryableFault` raised inside rolls this step back in every rank."""
        try:
            yield
        except RetryableFault as fault:
            decided = self.protocol.retry_decided(self, fault) if self.protocol is not None else ""
            self._emit(
                f"rank {self.rank}: retryable fault in step {self.step}: {fault};"
                f" {decided or 'rolling back everywhere'}"
            )
            self.group.abort(f"rank {self.rank} retries step {self.step}: {fault}")
            if self._state == _LIVE:
                self._state = _SUSPECT  # repaired from a healthy peer in the agreement (if any)
            if self._twins is not None:
                self._twins.reset()
            self._recover("retry")
        except Exception as err:
            if self._twins is not None and self._twins.interrupted(err, self.group):
                # Out of FSDP2's hooks: a collective of the generation failed or was aborted.
                self._emit(f"rank {self.rank}: step {self.step} interrupted: {str(err)[:160]}")
                self.group.abort(f"step interrupted on rank {self.rank}: {str(err)[:100]}")
                self._twins.reset()
                self._recover("peer failure")
                return
            if not isinstance(err, RuntimeError):
                raise
            # DDP's backward raises what its communication hook's future failed with.
            failed = self.group.hook_failure
            if self.ddp is None or failed is None:
                raise
            self._emit(f"rank {self.rank}: step {self.step} interrupted in backward: {failed} ({str(err)[:120]})")
            self.group.abort(f"backward failed on rank {self.rank}: {failed}")
            self._recover("peer failure")

    def apply(self) -> bool:
        """Average the gradients over every rank, then step the optimizer. False when a peer's
        failure interrupted the step: the group was re-formed and ``steps`` yields the agreed step."""
        busy_s = time.monotonic() - self._step_started  # this rank's own work, before the all-reduce
        if self._twins is not None:
            # FSDP2 reduced the gradients during the backward pass (and waited for them there).
            self._twins.before_update(self.step, self._buffers)
        elif self.ddp is not None:
            # DDP averaged the gradients during the backward pass (and waited for them there).
            if self._hooked == 0 and any(p.grad is not None for p in self.model.parameters()):
                raise RuntimeError("with ddp=, run the model through trainer.ddp: these gradients were not averaged")
            self._hooked = 0
        else:
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
        self.optimizer.step()
        if self._twins is not None:
            self._twins.after_update()
        self.step += 1
        self._applied = True
        # Hang and straggler detection: one datagram to the local agent, rate-limited, never blocking.
        progress.heartbeat(self.step, busy_s=busy_s)
        return True

    def _state_device(self) -> torch.device:
        """Where this rank keeps its model (a state received from a peer is loaded there)."""
        for tensor in (*self.model.parameters(), *self.model.buffers()):
            return tensor.device
        return torch.device("cpu")

    def state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "extra": {name: obj.state_dict() for name, obj in self.extra.items()},
        }

    def regroup(self, why: str) -> None:
        """Leave the current generation and form the next one (every rank must, e.g. when recoverd
        changed the job's world)."""
        self.group.abort(why)
        self._recover(why)

    def close(self) -> None:
        if self.protocol is not None:
            self.protocol.close()
        self.group.close()
        self.store.close()

    # ------------------------------------------------------------------ recovery
    def _emit(self, text: str) -> None:
        self._on_event(text)

    def _load(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for name, obj in self.extra.items():
            if name in state.get("extra", {}):
                obj.load_state_dict(state["extra"][name])

    def _recover(self, why: str) -> None:
        started = time.monotonic()
        if self._buffers and self._state in (_SUSPECT, _LIVE):
            # The interrupted step's forward pass may have changed them; it will run again.
            with torch.no_grad():
                for name, buffer in self.model.named_buffers():
                    if name in self._buffers:
                        buffer.copy_(self._buffers[name])
        while True:
            if time.monotonic() - started > self.recover_timeout.total_seconds():
                raise RuntimeError(
                    f"rank {self.rank}: no group formed within {self.recover_timeout.total_seconds():g}s ({why});"
                    " giving up so that recoverd takes over"
                )
            try:
                generation = self.group.form(deadline=started + self.recover_timeout.total_seconds())
                self.rank, self.world_size = self.group.rank, self.group.world_size  # may change (protocol.py)
                if self._twins is not None:
                    self._twins.connect(generation)
                formed = time.monotonic()
                resumed_with = self._sync()
                self._wrap_ddp()
                break
            except GroupFailed as err:
                self._emit(f"rank {self.rank}: generation failed while recovering ({err}); forming the next")
        if why != "start":
            self.recoveries += 1
        ahead = "; etcd store made ahead" if why == "start" and self.store.made_ahead else ""
        self._emit(
            f"rank {self.rank}: generation {generation} formed in {1000 * (formed - started):.0f} ms ({why}{ahead});"
            f" resuming at step {self.step} with {resumed_with}"
            f" ({1000 * (time.monotonic() - formed):.0f} ms to sync)"
        )

    def _wrap_ddp(self) -> None:
        """Wrap the model in DistributedDataParallel on the new generation's group (``ddp=``).

        The ranks hold the same state already (:meth:`_sync`), so DDP's initial broadcast is skipped;
        its construction still checks every rank's parameter shapes (a collective), so it runs where
        an abort can release it. The hook averages each bucket as DDP's default hook does."""
        self.ddp = None
        self._hooked = 0
        spec = self._ddp_spec
        if spec is False:
            return
        from torch.nn.parallel import DistributedDataParallel

        pg = self.group.process_group
        if callable(spec):
            build = lambda: spec(self.model, pg)  # noqa: E731
        else:
            options = dict(spec) if isinstance(spec, Mapping) else {}
            options.setdefault("init_sync", False)
            build = lambda: DistributedDataParallel(self.model, process_group=pg, **options)  # noqa: E731

        def build_and_bucket() -> torch.nn.Module:
            # DDP lays its buckets out again after a wrapper's first backward, in the order the
            # gradients became ready, and a ring all-reduce sums each element in an order that
            # follows its place in the bucket: a wrapper built after a recovery would sum its first
            # step differently from the fault-free run's long-lived one. Laid out at once in
            # parameter order (what DDP's own Join does for a joined rank), every wrapper of every
            # generation has the same buckets, and a recovered run is bitwise the fault-free one.
            wrapper = build()
            reducer: Any = wrapper.reducer
            reducer._push_all_rebuilt_params()
            reducer._rebuild_buckets()  # a broadcast from rank 0: here, where an abort can end it
            return wrapper

        wrapper = self.group.run_abortable("DistributedDataParallel", build_and_bucket)
        # A lambda: DDP rejects a hook whose annotations are strings (this module's are).
        wrapper.register_comm_hook(None, lambda _state, bucket: self._average_bucket(bucket))
        self.ddp = wrapper

    def _average_bucket(self, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        self._hooked += 1
        tensor = bucket.buffer()
        tensor.div_(self.world_size)
        return self.group.allreduce_future(tensor)

    def _holding(self) -> Holding:
        """What this rank says in :meth:`_sync`: the kind of state it holds, its step, and whether
        it has a checkpoint it has not read (``load_state``; read only if no rank holds live
        state: reading it is on a replacement's critical path, ~10 ms on a loaded node for a small
        model)."""
        previous = self._twins is not None and self._twins.holds_previous(self.step)
        return Holding(Kind(self._state), self.step, self._load_state is not None, previous)

    def _holdings(self, device: torch.device, *, as_joined: bool) -> list[Holding]:
        """Every rank's :meth:`_holding`. ``as_joined``: as each wrote it when it joined this
        generation (the group's joining notes: no collective, so a survivor that needs nothing
        starts its next step as soon as the group is formed); else said again in an all-gather
        (after reading a checkpoint, or if a note is not a holding: every rank reads the same
        notes, so every rank takes the same way)."""
        if as_joined:
            read = [Holding.from_note(note) for note in self.group.notes()]
            if all(holding is not None for holding in read):
                return read  # type: ignore[return-value]
        mine = self._holding()
        said = self.group.allgather(
            torch.tensor([mine.kind, mine.step, int(mine.unread_checkpoint)], dtype=torch.int64, device=device)
        )
        return [Holding(Kind(int(t[0])), int(t[1]), bool(int(t[2]))) for t in said]

    def _read_checkpoint(self) -> None:
        load_state, self._load_state = self._load_state, None
        loaded = load_state() if load_state is not None else None
        if loaded is not None:
            self.step, state = loaded
            if self._twins is not None:
                # A sharded checkpoint is read by every rank together (torch.distributed.checkpoint's
                # load is a collective, over the mesh's groups: connected by now), in place.
                if state is not None:
                    raise ValueError(
                        "with mesh=, load_state loads the checkpoint in place (torch.distributed.checkpoint)"
                        " and returns (step, None)"
                    )
            elif state is None:
                raise ValueError("load_state returned no state (None is for mesh=: a checkpoint loaded in place)")
            else:
                self._load(state)
            self._state = _FROM_DISK

    def _sync(self) -> str:
        """Agree on the step and the source (:mod:`.agreement`); the source sends its state to the
        ranks that need it, point to point, and only to them (the survivors at the agreed step
        keep theirs: it is bitwise the source's). Returns whose state this rank resumes with."""
        device = self.group.device
        everyone = self._holdings(device, as_joined=True)
        if must_read_checkpoints(everyone):
            self._read_checkpoint()
            everyone = self._holdings(device, as_joined=False)
        if self._twins is not None:
            try:
                self.step, resumed_with = self._twins.sync(everyone, self.rank, self._emit)
            except NoTwin as lost:
                why = (
                    f"rank {self.rank}: the model cannot be rebuilt from peers ({lost.reason}); exiting with code"
                    f" {STATE_LOST_EXIT_CODE} so that recoverd restarts every rank from the job's checkpoint"
                )
                self._emit(why)
                print(why, file=sys.stderr, flush=True)  # the agent shows a failed rank's last lines
                raise StateLost(why) from lost
            self._state = _LIVE
            return resumed_with
        agreed = agree(everyone)
        source = agreed.source
        ahead = self._state == max(h.kind for h in everyone) != _NONE and self.step > agreed.step
        if ahead:  # a receiver: its all-reduce completed when a peer's did not
            self._emit(f"rank {self.rank}: back from step {self.step} to {agreed.step}")
        if agreed.receivers:
            mine = _to_bytes(self.state()).to(device) if self.rank == source else None
            received = self.group.share(mine, source, agreed.receivers)
            if received is not None:
                self._load(_from_bytes(received, self._state_device()))
        self.step = agreed.step
        self._state = _LIVE
        self._load_state = None  # live state from now on: a later recovery never reads the disk
        if self.rank == source:
            return "its own state (the source)"
        if agreed.receives(self.rank):
            return f"the state of rank {source}"
        return f"its own state (equal to rank {source}'s)"
