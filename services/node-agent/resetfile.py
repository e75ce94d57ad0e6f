"""reset.json on a node: a device plugin's file becomes faults; recoverd's state mirrors into a file.

* **In** (``--reset-json PATH``): the agent watches the file (inotify on its directory, so a
  Kubernetes ConfigMap's symlink swap is noticed) and turns every local rank the device plugin
  marks ``unrecovered`` (or a ClusterD writer marks ``fault``) into a fault record, once per
  (rank, status, UpdateTime). A malformed file is an event with the parser's reason; nothing is
  applied. The watched file is never written (a mounted ConfigMap is read-only).
* **Out** (``--reset-json-mirror PATH``): after each change of the job's recovery the agent writes
  what ClusterD would (reference/mindcluster-contract.md section 10): the fault list as
  ``{RankId, Status: "fault"}`` with ``RestartFaultProcess`` for recover-in-place, ``FaultFlushing``
  while faults are being collected, ``RetryTime`` counting restarts of the whole job; every key,
  atomically. For tools that read reset.json.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from recoverd.errors import ConfigError
from recoverd.records import pb
from recoverd.resetjson import RankEntry, RankStatus, ResetState

__all__ = ["check_paths", "faults_from", "mirror_state"]

_FAULTY = (RankStatus.UNRECOVERED, RankStatus.FAULT)


def check_paths(watched: str | None, mirror: str | None) -> None:
    """The mirror must never be the watched (possibly mounted, read-only) file or beside it."""
    if watched and mirror:
        same_dir = os.path.dirname(os.path.abspath(watched)) == os.path.dirname(os.path.abspath(mirror))
        if same_dir:
            raise ConfigError(
                f"--reset-json-mirror {mirror} is in the directory of --reset-json {watched}:"
                " recoverd never writes into the watched (ConfigMap) directory"
            )


def faults_from(state: ResetState, local_ranks: Iterable[int]) -> list[tuple[int, str]]:
    """(rank, status) of this node's ranks that the file marks as faulty."""
    mine = set(local_ranks)
    return [(e.rank_id, str(e.status)) for e in state.rank_list if e.rank_id in mine and e.status in _FAULTY]


def mirror_state(recovery: pb.Recovery | None, history: int, previous: ResetState | None) -> ResetState:
    """What ClusterD would write for this recovery (``history``: restarts of the whole job so far)."""
    if recovery is None:
        return ResetState(update_time=int(time.time()), retry_time=history)
    active = recovery.phase in (pb.PHASE_COLLECTING, pb.PHASE_STOPPING, pb.PHASE_GLOBAL_FAULT, pb.PHASE_DECIDING,
                                pb.PHASE_RECOVERING)  # fmt: skip
    ranks = sorted({f.rank for f in recovery.faults}) if active else []
    state = ResetState(
        rank_list=tuple(RankEntry(rank_id=r, status=RankStatus.FAULT) for r in ranks),
        update_time=int(time.time()),
        retry_time=history,
        fault_flushing=recovery.phase in (pb.PHASE_COLLECTING, pb.PHASE_STOPPING),
        graceful_exit=0,
        restart_fault_process=active and recovery.strategy == "recover-in-place",
    )
    if previous is not None and _same(previous, state):
        return previous
    return state


def _same(a: ResetState, b: ResetState) -> bool:
    return (a.rank_list, a.retry_time, a.fault_flushing, a.restart_fault_process) == (
        b.rank_list,
        b.retry_time,
        b.fault_flushing,
        b.restart_fault_process,
    )
