"""ResilientTrainer's state agreement (``_sync``) as rank 1 of two, its peer played by a fake
group: a replacement joining a peer with live state never reads its checkpoint (it would only
throw it away, on the recovery's critical path); a world with no live state reads it first; a
survivor at the agreed step receives nothing, and a source sends only to the ranks that need it.
(Which ranks those are: test_agreement.py.)"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

from taskd_client.pytorch import trainer as trainer_module  # noqa: E402
from taskd_client.pytorch.agreement import Holding, Kind  # noqa: E402
from taskd_client.pytorch.trainer import ResilientTrainer  # noqa: E402

NONE, FROM_DISK, LIVE = trainer_module._NONE, trainer_module._FROM_DISK, trainer_module._LIVE
SUSPECT = trainer_module._SUSPECT


def _model(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


class _PeerGroup:
    """The group of a two-rank world seen from rank 1: rank 0 says ``says[0]`` in its joining note
    (``note`` instead, when given) and ``says[i]`` in the i-th allgather after it, and shares
    ``blob`` when rank 1 receives; every share is kept in ``shared``."""

    device = torch.device("cpu")

    def __init__(self, says: list[list[int]], blob: torch.Tensor, note: str | None = None) -> None:
        self.says, self.blob, self.note, self.allgathers = says, blob, note, 0
        self.joining_note: Any = None
        #: Each share(): (source, receivers, bytes rank 1 sent or None).
        self.shared: list[tuple[int, tuple[int, ...], int | None]] = []

    def notes(self) -> list[str]:
        if self.note is not None:
            return [self.note, self.joining_note()]
        kind, step, unread = self.says[0]
        return [Holding(Kind(kind), step, bool(unread)).to_note(), self.joining_note()]

    def allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        said = self.allgathers + (1 if self.note is None else 0)
        peer = torch.tensor(self.says[said], dtype=torch.int64)
        self.allgathers += 1
        return [peer, tensor.clone()]

    def share(self, blob: torch.Tensor | None, source: int, receivers: tuple[int, ...]) -> torch.Tensor | None:
        self.shared.append((source, tuple(receivers), None if blob is None else blob.numel()))
        return self.blob if source == 0 and 1 in receivers else None


def _rank1(group: _PeerGroup, load_state: Any) -> ResilientTrainer:
    trainer = ResilientTrainer.__new__(ResilientTrainer)
    trainer.model, trainer.optimizer = _model(seed=1)
    trainer.extra, trainer.rank, trainer.world_size = {}, 1, 2
    trainer.step, trainer._state, trainer._load_state = 0, NONE, load_state
    trainer._twins = None  # data parallel: every rank holds the whole model
    trainer.group = group  # type: ignore[assignment]
    group.joining_note = lambda: trainer._holding().to_note()
    trainer._on_event = lambda _text: None
    return trainer


def _peer_blob(step_state: int = 0) -> tuple[torch.Tensor, dict[str, Any]]:
    model, optimizer = _model(seed=7 + step_state)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "extra": {}}
    return trainer_module._to_bytes(state), state


def test_a_replacement_joining_live_state_never_reads_its_checkpoint() -> None:
    reads: list[int] = []
    blob, peer_state = _peer_blob()
    group = _PeerGroup([[LIVE, 7, 0]], blob)
    rank1 = _rank1(group, lambda: reads.append(1) or (3, {}))

    assert rank1._sync() == "the state of rank 0"
    assert reads == [] and group.allgathers == 0  # what each held was in its joining note
    assert rank1.step == 7 and rank1._state == LIVE and rank1._load_state is None
    assert torch.equal(rank1.model.weight, peer_state["model"]["weight"])


def test_with_no_live_state_the_checkpoints_are_read_and_the_ranks_say_again() -> None:
    reads: list[int] = []
    blob, peer_state = _peer_blob()
    mine = _rank1(group=_PeerGroup([], blob), load_state=None)  # a checkpoint as rank 1 saved it
    disk = mine.state()
    group = _PeerGroup([[NONE, 0, 1], [FROM_DISK, 5, 0]], blob)  # rank 0: "I have one" / read at step 5
    rank1 = _rank1(group, lambda: reads.append(1) or (5, disk))

    assert rank1._sync() == "the state of rank 0"  # both at step 5 from disk: the lowest rank is the source
    assert reads == [1] and group.allgathers == 1  # said again after reading the checkpoint
    assert rank1.step == 5 and rank1._state == LIVE and rank1._load_state is None
    assert torch.equal(rank1.model.weight, peer_state["model"]["weight"])


def test_a_checkpoint_not_read_is_still_offered_after_a_failed_agreement() -> None:
    """The agreement failing before it completed (a peer died) keeps the checkpoint for the next
    one: the live peer may be gone by then."""
    blob, _ = _peer_blob()

    class _DiesInTheTransfer(_PeerGroup):
        def share(self, blob: torch.Tensor | None, source: int, receivers: tuple[int, ...]) -> torch.Tensor | None:
            raise trainer_module.GroupFailed("peer died")

    rank1 = _rank1(_DiesInTheTransfer([[LIVE, 7, 0]], blob), load_state=lambda: (3, {}))
    with pytest.raises(trainer_module.GroupFailed):
        rank1._sync()
    assert rank1._load_state is not None and rank1._state == NONE


def test_a_survivor_at_the_agreed_step_keeps_its_own_state_and_receives_nothing() -> None:
    blob, _ = _peer_blob()
    group = _PeerGroup([[LIVE, 7, 0]], blob)
    rank1 = _rank1(group, load_state=None)
    rank1._state, rank1.step = LIVE, 7
    own = rank1.model.weight.detach().clone()

    assert rank1._sync() == "its own state (equal to rank 0's)"
    assert group.shared == []  # no receiver: no transfer at all
    assert rank1.step == 7 and torch.equal(rank1.model.weight, own)


def test_a_survivor_one_step_ahead_is_put_back_with_the_sources_state() -> None:
    blob, peer_state = _peer_blob()
    group = _PeerGroup([[LIVE, 7, 0]], blob)
    rank1 = _rank1(group, load_state=None)
    rank1._state, rank1.step = LIVE, 8

    assert rank1._sync() == "the state of rank 0"
    assert group.shared == [(0, (1,), None)]
    assert rank1.step == 7 and torch.equal(rank1.model.weight, peer_state["model"]["weight"])


def test_the_source_sends_its_state_only_to_the_ranks_that_need_it() -> None:
    """Rank 1 is the source (rank 0 is a replacement): its state, to rank 0 only."""
    group = _PeerGroup([[NONE, 0, 0]], torch.empty(0, dtype=torch.uint8))
    rank1 = _rank1(group, load_state=None)
    rank1._state, rank1.step = LIVE, 7
    size = trainer_module._to_bytes(rank1.state()).numel()

    assert rank1._sync() == "its own state (the source)"
    assert group.shared == [(1, (0,), size)]


def test_a_rank_that_raised_a_retryable_fault_takes_a_healthy_peers_state() -> None:
    """Its uncorrectable memory error may have corrupted its own state: repaired from rank 0's."""
    blob, peer_state = _peer_blob()
    group = _PeerGroup([[LIVE, 7, 0]], blob)
    rank1 = _rank1(group, load_state=None)
    rank1._state, rank1.step = SUSPECT, 7

    assert rank1._sync() == "the state of rank 0"
    assert group.shared == [(0, (1,), None)]
    assert rank1._state == LIVE and torch.equal(rank1.model.weight, peer_state["model"]["weight"])


def test_when_a_joining_note_is_not_a_holding_every_rank_says_it_again() -> None:
    """Every rank reads the same notes, so every rank falls back to the all-gather together."""
    blob, peer_state = _peer_blob()
    group = _PeerGroup([[LIVE, 7, 0]], blob, note="not a holding")
    rank1 = _rank1(group, load_state=None)

    assert rank1._sync() == "the state of rank 0"
    assert group.allgathers == 1 and rank1.step == 7
    assert torch.equal(rank1.model.weight, peer_state["model"]["weight"])
