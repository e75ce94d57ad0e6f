"""The job's recovery client, run by one rank of a ResilientTrainer (rank 0 by default).

recoverd asks a job's client what it can do and tells it what was decided (docs/client.md); without
one, the node agents answer for the ranks and never offer ``elastic-training`` or ``dump``, which
only the job can carry out. :class:`Relay` is that client: a ``DLRecoverManager`` registered as the
job's controller, serving on a daemon thread. It answers each phase for the whole job and relays
what the other ranks must do through the rendezvous store in etcd, which every rank already reads
while it forms a generation of its group:

* ``stopTrain``: stop-complete at once (the trainer's own group stops the ranks: a dead peer's
  collective fails, and the others wait in the group's next formation);
* ``globalFault``: the strategies offered (``offer``);
* ``changeStrategy=downgrade|upgrade``: the recovery record already holds the new membership.
  On an upgrade the relay first waits until the returning ranks are up and ask for a seat. Then
  :meth:`Membership.publish` aborts the generation pinned to the old world, this rank's training
  loop is interrupted at its next step (``interrupt``), every rank forms the next generation with
  the new world, and the status is answered once this rank has trained in it (``wait_world``);
* ``changeStrategy=dump``: a dump request in the store and an aborted generation; every live rank
  saves (:mod:`.dumps`), and the status is answered once they have (``DUMP_ERROR`` if none could);
* ``changeStrategy=exit`` (also after a dump) and ``recover``: answered at once; before an exit the
  client deregisters, since the agents are about to restart this process and the restart's round
  must not wait for this client's lease to expire.

A handler that raises is reported by the manager as this client's failure of the phase.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Sequence

from recoverd.codes import Code
from recoverd.mindcluster import recover_pb2 as pb
from taskd_client.manager import DLRecoverManager
from taskd_client.pytorch.dumps import Dumps
from taskd_client.pytorch.membership import Membership

__all__ = ["Relay", "carry_out_resize"]

log = logging.getLogger(__name__)

CLOSE_JOIN_S = 2.0


def server_addr(etcd: str) -> str:
    """DLRecoverManager's ``server_addr`` for ``$RECOVERD_ETCD`` (comma-separated host:port)."""
    text = etcd.strip()
    return text if text.startswith(("etcd://", "http://", "https://")) else f"etcd://{text}"


class Relay:
    """See the module docstring. ``interrupt(why)`` makes the controller rank's training loop leave
    an aborted generation at its next step; ``wait_world(live, timeout_s)`` is True once that rank
    has trained a step with ``live`` as its world."""

    def __init__(
        self,
        *,
        job: str,
        etcd: str,
        prefix: str,
        offer: Sequence[str],
        membership: Membership,
        dumps: Dumps,
        interrupt: Callable[[str], None],
        wait_world: Callable[[list[int], float], bool],
        confirm_timeout_s: float,
        on_event: Callable[[str], None],
    ) -> None:
        self.offer = list(offer)
        self.membership = membership
        self.dumps = dumps
        self.interrupt = interrupt
        self.wait_world = wait_world
        self.confirm_timeout_s = confirm_timeout_s
        self._emit = on_event
        #: When the last downgrade/upgrade arrived (monotonic), for the first step's latency.
        self.changed_at: float | None = None
        self.manager = DLRecoverManager(pb.ClientInfo(jobId=job, role="controller"), server_addr(etcd), prefix=prefix)
        for action, handler in {
            "stop_train": self._stop_train,
            "pause_train": self._stop_train,
            "on_global_rank": self._on_global_rank,
            "change_strategy": self._change_strategy,
        }.items():
            self.manager.set_handler(action, handler)
        self._thread = threading.Thread(target=self._serve, name="recoverd-relay", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Deregister (the agents answer for the job from now on); idempotent."""
        self.manager.close()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(CLOSE_JOIN_S)

    def _serve(self) -> None:
        try:
            self.manager.start_subscribe()
        except Exception:
            # Training goes on; the agents answer for the job (recover-in-place and exit only).
            log.exception("the recovery client failed; the agents answer for the job")
            self.manager.close()

    # ------------------------------------------------------------------ handlers
    def _stop_train(self, fault_ranks: dict[int, int], _signal: pb.ProcessManageSignal) -> None:
        self.manager.report_stop_complete(0, "", fault_ranks)

    def _on_global_rank(self, fault_ranks: dict[int, int], _signal: pb.ProcessManageSignal) -> None:
        self.manager.report_recover_strategy(fault_ranks, self.offer)

    def _change_strategy(self, fault_ranks: dict[int, int], signal: pb.ProcessManageSignal) -> None:
        change = signal.changeStrategy
        if change in ("downgrade", "upgrade"):
            code, message = self._resize(change, fault_ranks)
        elif change == "dump":
            code, message = self._dump(signal.uuid, fault_ranks)
        else:
            code, message = 0, ""
        self.manager.report_recover_status(code, message, fault_ranks, change)
        if change == "exit":
            self.manager.close()  # the agents restart this process now

    def _resize(self, change: str, fault_ranks: dict[int, int]) -> tuple[int, str]:
        self.changed_at = time.monotonic()
        return carry_out_resize(
            change,
            sorted(fault_ranks),
            membership=self.membership,
            interrupt=self.interrupt,
            wait_world=self.wait_world,
            timeout_s=self.confirm_timeout_s,
            emit=self._emit,
            who="relay",
            on_ready=self._ready,
        )

    def _ready(self) -> None:
        self.changed_at = time.monotonic()

    def _dump(self, uuid: str, fault_ranks: dict[int, int]) -> tuple[int, str]:
        dump_id = re.sub(r"[^A-Za-z0-9_.-]", "_", uuid) or str(time.time_ns())
        started = time.monotonic()
        self.dumps.request(dump_id)
        self.membership.abort_current(f"dump {dump_id}")
        self.interrupt(f"dump {dump_id}")
        expected = [r for r in self.membership.live() if r not in fault_ranks]
        saved = self.dumps.wait_saved(dump_id, expected, self.confirm_timeout_s)
        if not saved:
            return Code.DUMP_ERROR, f"no rank of {expected} saved dump {dump_id}"
        self.dumps.complete(dump_id)
        took_ms = 1000 * (time.monotonic() - started)
        self._emit(f"relay: dump {dump_id} saved by ranks {saved} of {expected} in {took_ms:.0f} ms")
        return 0, ""


def carry_out_resize(
    change: str,
    fault_ranks: list[int],
    *,
    membership: Membership,
    interrupt: Callable[[str], None],
    wait_world: Callable[[list[int], float], bool],
    timeout_s: float,
    emit: Callable[[str], None],
    who: str,
    on_ready: Callable[[], None] = lambda: None,
    consume_ready: bool = True,
) -> tuple[int, str]:
    """A downgrade or an upgrade as a rank carries it out once recoverd's record holds the new
    membership: (code, message) for its answer. The relay runs it on one rank; through the agents
    (docs/adr/0036) every rank runs it, and the compare-and-sets of :meth:`Membership.publish`
    make the ranks' concurrent calls agree.

    On an upgrade it first waits until the returning ranks (``fault_ranks``) are up and ask for a
    seat, then calls ``on_ready`` (the wait is not the change's latency); ``consume_ready``: take
    their marks (one waiter) or leave them to the returning ranks (every survivor waits)."""
    started = time.monotonic()
    if change == "upgrade":
        # Train on in the small world until the returning ranks can join at once.
        ready = membership.wait_ready(fault_ranks, timeout_s, consume=consume_ready)
        took_ms = 1000 * (time.monotonic() - started)
        emit(f"{who}: ranks {ready} of {fault_ranks} ready to join after {took_ms:.0f} ms")
        on_ready()
    number, live, aborted = membership.publish(f"{change} of ranks {fault_ranks}")
    emit(
        f"{who}: {change} of ranks {fault_ranks}: world {live}"
        f" ({'aborted' if aborted else 'pinned'} generation {number})"
    )
    interrupt(f"{change} of ranks {fault_ranks}")
    if wait_world(live, timeout_s):
        return 0, ""
    return Code.CLIENT_ERROR, f"no step trained with world {live} within {timeout_s:g}s"
