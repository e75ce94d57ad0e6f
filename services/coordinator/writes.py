"""What the state machine's effects mean in etcd: the puts and deletes of one pass. Pure.

Each effect becomes the record its reader watches: a signal (``signals/<seq>``, for the clients), a
command (``commands/<node>``, for that node's agent), the run's history (restart budgets), its final
status, or the removal of a lost node's rank table; ``EmitEvent`` and each command also become an
event (through ``note``). The ops come out in the effects' order; ``commit.py`` applies them.
Signals and history are capped here, so a crash-looping job cannot grow them without bound.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from recoverd.coordinator.codec import phase_log_to_pb
from recoverd.coordinator.effects import (
    Effect,
    EmitEvent,
    FinishJob,
    ForgetNode,
    PublishSignal,
    RecordOutcome,
    SendCommand,
)
from recoverd.coordinator.model import Recovery
from recoverd.coordinator.settings import CoordinatorSettings
from recoverd.jobview import JobView
from recoverd.keys import Keyspace, RunRef
from recoverd.records import encode, pb, ts_from_s
from recoverd.store import Delete, DeletePrefix, Op, Put

__all__ = ["Note", "effect_ops", "job_removal_ops"]


class Note(Protocol):
    """Records one coordinator event of the pass (committed with the pass's writes)."""

    def __call__(
        self,
        reason: str,
        message: str,
        *,
        epoch: int = 0,
        phase: str = "",
        rank: int | None = None,
        node: str = "",
        data: dict[str, str] | None = None,
    ) -> None: ...


def effect_ops(
    effects: Iterable[Effect],
    *,
    keys: Keyspace,
    view: JobView,
    run: RunRef,
    rec: Recovery,
    uuid: str,
    now: float,
    note: Note,
    settings: CoordinatorSettings,
) -> list[Op]:
    """The ops that carry out ``effects`` for ``rec`` (the record they come with), and the trimming
    of signals beyond ``signal_cap`` (a bounded number per pass)."""
    ops: list[Op] = []
    signal_seq = view.last_signal_seq
    history = pb.History()
    if view.history is not None:
        history.CopyFrom(view.history)
    history_changed = False
    commands = [e for e in effects if isinstance(e, SendCommand)]
    # An exit commands every node: one event says so, not one per node (512 of them would push the
    # run's other events out of its 1,000-event cap, and cost the pass their encoding).
    summarize = len(commands) > COMMAND_EVENTS_PER_PASS
    if summarize:
        _note_commands(commands, rec, note)
    for effect in effects:
        if isinstance(effect, EmitEvent):
            note(effect.reason, effect.message, epoch=rec.epoch, phase=rec.phase.value)
        elif isinstance(effect, PublishSignal):
            signal_seq += 1
            ops.append(Put(keys.signal(run, signal_seq), encode(_signal(effect, signal_seq, rec, uuid, now))))
        elif isinstance(effect, SendCommand):
            ops.append(Put(keys.command(run, effect.node), encode(_command(effect, rec, now))))
            if summarize:
                continue
            note(
                "command_sent",
                f"{effect.action} {list(effect.ranks) or 'all'} to {effect.node} (epoch {rec.epoch}, seq {effect.seq})",
                epoch=rec.epoch,
                node=effect.node,
            )
        elif isinstance(effect, RecordOutcome):
            history.outcomes.append(_outcome(effect, rec, now))
            history_changed = True
        elif isinstance(effect, ForgetNode):
            ops.append(Delete(keys.ranks(run, effect.node)))
            note("node_forgotten", f"lost node {effect.node}: its rank table is removed", node=effect.node)
        elif isinstance(effect, FinishJob):
            ops.append(Put(keys.status(run), encode(_status(effect, run, now))))
    if history_changed:
        del history.outcomes[: max(0, len(history.outcomes) - settings.history_cap)]
        ops.append(Put(keys.history(run), encode(history)))
    excess = min(len(view.signals) - settings.signal_cap, settings.cleanups_per_pass)
    for key in view.signals[: max(0, excess)]:
        ops.append(Delete(key))
    return ops


#: Commands of one pass noted one event each; more are summarized in one event per action.
COMMAND_EVENTS_PER_PASS = 8


def _note_commands(commands: list[SendCommand], rec: Recovery, note: Note) -> None:
    by_action: dict[str, list[SendCommand]] = {}
    for command in commands:
        by_action.setdefault(command.action, []).append(command)
    for action, group in by_action.items():
        nodes = [c.node for c in group]
        shown = ", ".join(nodes[:4]) + (f", ... {nodes[-1]}" if len(nodes) > 4 else "")
        ranks = sorted({r for c in group for r in c.ranks})
        seqs = sorted(c.seq for c in group)
        note(
            "command_sent",
            f"{action} {ranks or 'all'} to {len(nodes)} nodes ({shown}) (epoch {rec.epoch}, seq {seqs[0]}-{seqs[-1]})",
            epoch=rec.epoch,
            data={"nodes": ",".join(nodes)[:65536]},
        )


def job_removal_ops(keys: Keyspace, job: str) -> list[Op]:
    """A finished job past its retention goes whole: its record, every run's keys and its events."""
    return [
        DeletePrefix(keys.job_prefix(job)),
        DeletePrefix(keys.job_events_prefix(job)),
        DeletePrefix(keys.job_rendezvous_prefix(job)),
    ]


def _signal(effect: PublishSignal, seq: int, rec: Recovery, uuid: str, now: float) -> pb.Signal:
    return pb.Signal(
        seq=seq,
        epoch=rec.epoch,
        uuid=uuid,
        signal_type=effect.signal_type,
        actions=list(effect.actions),
        fault_ranks=[pb.FaultRankWire(rank_id=str(r), fault_type=t) for r, t in effect.fault_ranks],
        change_strategy=effect.change_strategy,
        extra_params=effect.extra_params,
        sent_at=ts_from_s(now),
    )


def _command(effect: SendCommand, rec: Recovery, now: float) -> pb.Command:
    return pb.Command(
        epoch=rec.epoch,
        seq=effect.seq,
        action=getattr(pb, f"ACTION_{effect.action}"),
        ranks=list(effect.ranks),
        strategy=effect.strategy,
        issued_at=ts_from_s(now),
    )


def _outcome(effect: RecordOutcome, rec: Recovery, now: float) -> pb.RecoveryOutcome:
    detected = [f.detected_at for f in rec.faults if f.detected_at > 0]
    return pb.RecoveryOutcome(
        epoch=rec.epoch,
        strategy=effect.strategy,
        ranks=list(effect.ranks),
        opened_at=ts_from_s(rec.opened_at),
        closed_at=ts_from_s(now),
        ok=effect.ok,
        recovery_id=rec.recovery_id,
        phase_log=phase_log_to_pb(rec),
        detected_at=ts_from_s(min(detected) if detected else rec.opened_at),
    )


def _status(effect: FinishJob, run: RunRef, now: float) -> pb.JobStatus:
    return pb.JobStatus(
        uid=run.uid,
        state=pb.JOB_SUCCEEDED if effect.succeeded else pb.JOB_FAILED,
        reason=effect.reason,
        finished_at=ts_from_s(now),
    )
