"""A ResilientTrainer taking part in recoverd's protocol: elastic world size and ``dump``.

``ResilientTrainer(model, optimizer, protocol=RecoveryProtocol(...))`` adds, without restarting any
survivor:

* **elastic-training**: after a downgrade the ranks recoverd kept go on as a smaller data-parallel
  world; after an upgrade the ranks started on a spare join them and get the state from a peer, as
  a replacement does. Each generation of the group is formed with the live ranks of recoverd's
  recovery record (:mod:`.membership`); a rank's data-parallel rank (``trainer.rank``) is its
  position among them, ``trainer.world_size`` their number, gradients are averaged over them, and
  ``on_world_change(old, new)`` runs in every rank before the first step in a new world (scale the
  learning rate or the per-rank batch there). Shard data with :mod:`.sharding`.
* **dump**: every live rank saves its state (:mod:`.dumps`), recoverd restarts the job, and
  ``load_state=protocol.load_dump`` resumes every rank from the saved step.

One rank (``controller_rank``, 0 by default) runs the job's recovery client (:mod:`.relay`), which
offers ``offer`` and relays decisions to the others through the rendezvous store. This is the job's
one client: the agents stop answering for the job while it is registered (docs/client.md).

With ``via_agent=True`` there is no such client: every rank joins through its node's agent
(:mod:`taskd_client.agentlink`, docs/adr/0036), which answers for all of its ranks with one report
per phase. Every rank acknowledges a stop at once (the group stops it); on ``dump`` every rank
saves its own file and answers its agent itself; restarted, every rank loads its own
(``load_state=protocol.load_dump``). On a downgrade or upgrade every rank publishes the new world
(the membership's compare-and-sets make them agree: one write wins), leaves its generation, and
answers its agent once it has trained a step in the new world. A rank that raises
``RetryableFault`` tells its agent (a fault of its own) and waits for recoverd: on ``retry`` every
rank aborts the generation it is in, rolls the step back, and answers once the next one is formed.

The trainer calls three hooks: :meth:`attach` when it is built, ``group.seat`` (:meth:`_seat`) each
time its group tries a generation, and :meth:`before_step` before each step.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from recoverd.codes import Code
from recoverd.keys import Keyspace, RunRef
from recoverd.rankwire import RankFault, Signal
from recoverd.strategies import UPGRADE
from taskd_client.agentlink import AgentLink, Reply
from taskd_client.pytorch.dumps import Dumps
from taskd_client.pytorch.membership import Membership
from taskd_client.pytorch.relay import Relay, carry_out_resize

if TYPE_CHECKING:
    from taskd_client.pytorch.trainer import ResilientTrainer

__all__ = ["WORLD_TAG", "RecoveryProtocol"]

log = logging.getLogger(__name__)

#: The name under ``trainer.extra`` of the world size the state was trained with (it travels with
#: the state: a rank that gets it from a peer, or from a dump, knows which world it came from).
WORLD_TAG = "recoverd.world"
#: The recovery rounds an agent relays that change the world: round strategy -> the change.
AGENT_RESIZES = {"elastic-training": "downgrade", UPGRADE: "upgrade"}
#: After saving a dump a rank waits this long to be restarted by recoverd, then fails.
RESTART_WAIT_S = 300.0


class _WorldTag:
    def __init__(self) -> None:
        self.world: int | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"world": self.world}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.world = state.get("world")


class RecoveryProtocol:
    """See the module docstring. ``dump_dir``: where a dump writes (a directory each rank can write;
    ``None``: a dump fails, and recoverd falls back to ``exit``). ``via_agent``: every rank joins
    through its node agent instead of one relay client on ``controller_rank``."""

    def __init__(
        self,
        *,
        offer: Sequence[str] = ("elastic-training", "dump", "exit"),
        dump_dir: str | os.PathLike[str] | None = None,
        on_world_change: Callable[[int, int], None] | None = None,
        controller_rank: int = 0,
        confirm_timeout_s: float = 60.0,
        on_event: Callable[[str], None] | None = None,
        via_agent: bool = False,
    ) -> None:
        self.via_agent = via_agent
        self.link: AgentLink | None = None
        #: A dump the agent asked for and this rank has not saved yet: (dump id, its reply).
        self._agent_dump: tuple[str, Reply] | None = None
        #: The dumps this rank saved (a signal repeated after an agent restart is answered at once).
        self._saved_dumps: set[str] = set()
        self.offer = tuple(offer)
        self.dump_dir = dump_dir
        self.on_world_change = on_world_change or (lambda old, new: None)
        self.controller_rank = controller_rank
        self.confirm_timeout_s = confirm_timeout_s
        self._emit = on_event or (lambda text: log.info("%s", text))
        self._trainer: ResilientTrainer | None = None
        self._membership: Membership | None = None
        self._dumps: Dumps | None = None
        self.relay: Relay | None = None
        self._tag = _WorldTag()
        self._interrupted = threading.Event()
        self._cond = threading.Condition()
        self._seated: list[int] = []
        self._formed: tuple[int, list[int]] = (-1, [])
        #: When this rank's agent last relayed a world change (monotonic), for the first step's latency.
        self._changed_at: float | None = None
        #: Retryable faults this rank reported; the one waiting for recoverd's decision.
        self._faults = 0
        self._retry_told: threading.Event | None = None
        #: A retry being carried out: (the generation aborted, the recovery's uuid, its answer).
        self._retry_answer: tuple[int, str, Reply] | None = None
        #: The retries this rank carried out (a signal repeated after an agent restart is answered at once).
        self._retried: set[str] = set()

    # ------------------------------------------------------------------ hooks
    def attach(self, trainer: ResilientTrainer) -> None:
        """Called by the trainer once its store and group exist, before it loads state or forms."""
        env = trainer.env
        self._trainer = trainer
        key = Keyspace(env.prefix).recovery(RunRef(env.job, env.run))
        self._membership = Membership(trainer.store, key, env.rank, env.world_size)
        self._dumps = Dumps(trainer.store, self.dump_dir, env.rank, run=env.run)
        trainer.group.seat = self._seat
        trainer.extra[WORLD_TAG] = self._tag
        if self.via_agent:
            self.link = AgentLink(env.rank, self.offer, self._on_agent_signal)
            if not self.link.enabled:
                self._emit(f"rank {env.rank}: no agent socket (RECOVERD_RANKS_SOCKET): not in recoverd's protocol")
            self.link.start()
        elif env.rank == self.controller_rank:
            self.relay = Relay(
                job=env.job,
                etcd=env.etcd,
                prefix=env.prefix,
                offer=self.offer,
                membership=self._membership,
                dumps=self._dumps,
                interrupt=self._interrupt,
                wait_world=self._wait_world,
                confirm_timeout_s=self.confirm_timeout_s,
                on_event=self._emit,
            )
            self.relay.start()

    def load_dump(self) -> tuple[int, dict[str, Any]] | None:
        """``load_state`` for the trainer: this rank's state of the latest completed dump."""
        if self._dumps is None:
            raise RuntimeError("pass the protocol to ResilientTrainer(protocol=...) first")
        return self._dumps.load_local() if self.via_agent else self._dumps.load()

    def before_step(self, trainer: ResilientTrainer) -> bool:
        """Before each step: leave a generation the relay aborted (True: the group was re-formed,
        the step may differ), and run ``on_world_change`` once in a new world."""
        if self._interrupted.is_set():
            self._interrupted.clear()
            assert self._membership is not None
            if self._membership.is_aborted(trainer.group.generation):
                trainer.regroup("recoverd changed the job")
                return True
        old, new = self._tag.world, trainer.world_size
        if old != new:
            self._tag.world = new
            if old is not None:
                self._changed(trainer, old, new)
        with self._cond:
            retried = self._retry_answer
            if retried is not None and trainer.group.generation > retried[0]:
                self._retry_answer = None
                self._retried.add(retried[1])
            else:
                retried = None
        if retried is not None:
            retried[2](0, "")  # formed the next generation: the step is rolled back everywhere
        if (self.relay is not None or self.link is not None) and self._formed[0] != trainer.group.generation:
            with self._cond:
                self._formed = (trainer.group.generation, list(self._seated))
                self._cond.notify_all()
        return False

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
        if self.link is not None:
            self.link.close()

    # ------------------------------------------------------------------ internals
    def _changed(self, trainer: ResilientTrainer, old: int, new: int) -> None:
        self.on_world_change(old, new)
        latency = ""
        changed_at = self.relay.changed_at if self.relay is not None else self._changed_at
        if changed_at is not None:
            latency = f", {1000 * (time.monotonic() - changed_at):.0f} ms after recoverd's changeStrategy"
        self._emit(
            f"rank {trainer.env.rank}: world {old} -> {new} (data-parallel rank {trainer.rank});"
            f" first step in it: {trainer.step}{latency}"
        )

    def _seat(self, number: int) -> tuple[int, int] | None:
        """The group's hook for each generation it tries: save a requested dump first (then wait to
        be restarted), else this rank's seat in the generation's world."""
        assert self._membership is not None and self._dumps is not None
        with self._cond:
            asked, self._agent_dump = self._agent_dump, None
        if asked is not None:
            self._save_dump(asked[0], reply=asked[1])
        dump_id = self._dumps.pending()
        if dump_id is not None:
            self._save_dump(dump_id)
        seat = self._membership.seat(number)
        if seat is not None:
            self._seated = self._membership.seated_world
        return seat

    def _save_dump(self, dump_id: str, reply: Reply | None = None) -> None:
        """Save this rank's state for ``dump_id`` (through the store for the relay, or answering the
        agent with ``reply``), then wait to be restarted."""
        assert self._dumps is not None and self._trainer is not None
        trainer = self._trainer
        try:
            if reply is not None:
                path = self._dumps.save_local(dump_id, trainer.step, trainer.state())
            else:
                path = self._dumps.save(dump_id, trainer.step, trainer.state())
        except OSError as err:
            self._emit(f"rank {trainer.env.rank}: dump {dump_id} not saved: {err}")
            if reply is not None:
                reply(Code.DUMP_ERROR, f"dump {dump_id} not saved: {err}")
            raise RuntimeError(f"dump {dump_id} not saved: {err}") from err
        # Said before it is reported: once every rank has reported, recoverd may restart the job
        # at once, and this rank's log would miss the line (make test saw it missing once).
        self._emit(f"rank {trainer.env.rank}: dump {dump_id}: step {trainer.step} saved to {path}; waiting for restart")
        if reply is not None:
            self._saved_dumps.add(dump_id)
            reply(0, "")
        else:
            self._dumps.mark_saved(dump_id, trainer.step)
        # recoverd now restarts every rank (dump_exit). Training must not go on meanwhile.
        time.sleep(RESTART_WAIT_S)
        raise RuntimeError(f"dump {dump_id} saved but the job was not restarted within {RESTART_WAIT_S:g}s")

    def _interrupt(self, why: str) -> None:
        self._interrupted.set()

    def _on_agent_signal(self, signal: Signal, reply: Reply) -> None:
        """A signal from this rank's agent (on the link's thread). A stop is acknowledged at once:
        the trainer's own group stops the rank (a dead peer's collective fails). A dump is saved
        where the rank next forms a generation: the current one is aborted so that every rank
        leaves its step, or the formation that waits for the dead peer."""
        if signal.kind == "stop":
            reply(0, "")
            return
        change = AGENT_RESIZES.get(signal.strategy)
        if change is not None:
            # Its own thread: an upgrade waits for the returning ranks (seconds), and the link must
            # go on reading meanwhile.
            threading.Thread(
                target=self._resize_for_agent, args=(change, signal, reply), name="recoverd-resize", daemon=True
            ).start()
            return
        if signal.strategy == "retry":
            self._retry(signal, reply)
            return
        if signal.strategy != "dump":
            reply(Code.CLIENT_ERROR, f"strategy {signal.strategy!r} is not carried out through the agent")
            return
        dump_id = re.sub(r"[^A-Za-z0-9_.-]", "_", signal.uuid or signal.signal_id)
        if dump_id in self._saved_dumps:
            reply(0, "")  # saved already: the signal came again (the agent restarted)
            return
        assert self._membership is not None
        with self._cond:
            self._agent_dump = (dump_id, reply)
        self._membership.abort_current(f"dump {dump_id}")
        self._interrupt(f"dump {dump_id}")

    def retry_decided(self, trainer: ResilientTrainer, fault: BaseException) -> str:
        """The trainer's hook when this rank raised a ``RetryableFault``: through the agents, report
        it and wait until recoverd decides ``retry`` (the rank then rolls back with the others);
        should recoverd choose a costlier strategy, this rank is restarted meanwhile. What to say
        in the rank's event line; "" when recoverd is not asked (no agent link: roll back at once)."""
        if self.link is None or "retry" not in self.offer:
            return ""  # recoverd would only restart this rank: roll back at once, as without recoverd
        self._faults += 1
        fault_id = f"g{trainer.group.generation}s{trainer.step}n{self._faults}"
        told = threading.Event()
        with self._cond:
            self._retry_told = told
        fault_type = str(getattr(fault, "fault_type", "0"))
        if not self.link.report_fault(RankFault(fault_id, fault_type, str(fault)[:200])):
            return "not joined to recoverd through the agent: rolling back everywhere"
        started = time.monotonic()
        if told.wait(self.confirm_timeout_s):
            return f"recoverd decided retry after {1000 * (time.monotonic() - started):.0f} ms: rolling back everywhere"
        return f"no decision from recoverd within {self.confirm_timeout_s:g}s: rolling back everywhere"

    def _retry(self, signal: Signal, reply: Reply) -> None:
        """recoverd chose ``retry``: leave the generation this rank is in (every rank aborts the
        same one: one abort, one next generation), roll the step back with the others, and answer
        once the next generation is formed (:meth:`before_step`)."""
        assert self._membership is not None and self._trainer is not None
        with self._cond:
            if signal.uuid in self._retried:
                reply(0, "")  # done already: the signal came again (the agent restarted)
                return
            pending = self._retry_answer
            if pending is not None and pending[1] == signal.uuid:
                # Again while this rank carries it out (the agent restarted): answer the new
                # signal when done; aborting again would abort the generation just formed.
                self._retry_answer = (pending[0], signal.uuid, reply)
                return
            told, self._retry_told = self._retry_told, None
            number = self._trainer.group.generation
            # Before the abort: a peer released by it may re-form before this thread runs on.
            self._retry_answer = (number, signal.uuid, reply)
        if number >= 0:  # -1: between generations, this rank forms the next one anyway
            self._membership.abort(number, f"retry {signal.uuid}")
        self._interrupt(f"retry {signal.uuid}")
        if told is not None:
            told.set()  # this rank raised the fault: it rolls back now

    def _resize_for_agent(self, change: str, signal: Signal, reply: Reply) -> None:
        """A downgrade or upgrade relayed by this rank's agent: every rank carries it out (the
        membership's compare-and-sets make them agree) and answers once it has trained a step in
        the new world."""
        assert self._membership is not None
        self._changed_at = time.monotonic()
        try:
            code, message = carry_out_resize(
                change,
                list(signal.fault_ranks),
                membership=self._membership,
                interrupt=self._interrupt,
                wait_world=self._wait_world,
                timeout_s=self.confirm_timeout_s,
                emit=lambda text: log.debug("%s", text),
                who=f"rank {self._membership.rank}",
                on_ready=self._ready_to_change,
                consume_ready=False,
            )
        except Exception as err:  # etcd gone for longer than the store retries: this rank's failure
            log.exception("rank %d: %s failed", self._membership.rank, change)
            code, message = Code.CLIENT_ERROR, f"{change}: {type(err).__name__}: {err}"
        reply(code, message)

    def _ready_to_change(self) -> None:
        self._changed_at = time.monotonic()

    def _wait_world(self, live: list[int], timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._formed[1] == live, timeout_s)
