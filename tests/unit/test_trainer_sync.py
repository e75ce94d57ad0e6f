"""ResilientTrainer's state agreement (``_sync``) as rank 1 of two, its peer played by a fake
group: a replacement joining a peer with live state never reads its checkpoint (it would only
throw it away, on the recovery's critical path); a world with no live state reads it first."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

from taskd_client.pytorch import trainer as trainer_module  # noqa: E402
from taskd_client.pytorch.trainer import ResilientTrainer  # noqa: E402

NONE, FROM_DISK, LIVE = trainer_module._NONE, trainer_module._FROM_DISK, trainer_module._LIVE


def _model(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


class _PeerGroup:
    """The collectives of a two-rank world seen from rank 1: rank 0 says ``says[i]`` in the i-th
    allgather and broadcasts ``blob``."""

    device = torch.device("cpu")

    def __init__(self, says: list[list[int]], blob: torch.Tensor) -> None:
        self.says, self.blob, self.allgathers = says, blob, 0

    def allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        peer = torch.tensor(self.says[self.allgathers], dtype=torch.int64)
        self.allgathers += 1
        return [peer, tensor.clone()]

    def broadcast_(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        assert src == 0, "rank 0 is the source in these worlds"
        if tensor.numel() == 1:  # the size
            tensor.copy_(torch.tensor([self.blob.numel()]))
        else:
            tensor.copy_(self.blob)
        return tensor


def _rank1(group: _PeerGroup, load_state: Any) -> ResilientTrainer:
    trainer = ResilientTrainer.__new__(ResilientTrainer)
    trainer.model, trainer.optimizer = _model(seed=1)
    trainer.extra, trainer.rank, trainer.world_size = {}, 1, 2
    trainer.step, trainer._state, trainer._load_state = 0, NONE, load_state
    trainer.group = group  # type: ignore[assignment]
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

    assert rank1._sync() == 0
    assert reads == [] and group.allgathers == 1
    assert rank1.step == 7 and rank1._state == LIVE and rank1._load_state is None
    assert torch.equal(rank1.model.weight, peer_state["model"]["weight"])


def test_with_no_live_state_the_checkpoints_are_read_and_the_ranks_say_again() -> None:
    reads: list[int] = []
    blob, peer_state = _peer_blob()
    mine = _rank1(group=_PeerGroup([], blob), load_state=None)  # a checkpoint as rank 1 saved it
    disk = mine.state()
    group = _PeerGroup([[NONE, 0, 1], [FROM_DISK, 5, 0]], blob)  # rank 0: "I have one" / read at step 5
    rank1 = _rank1(group, lambda: reads.append(1) or (5, disk))

    assert rank1._sync() == 0  # both at step 5 from disk: the lowest rank is the source
    assert reads == [1] and group.allgathers == 2
    assert rank1.step == 5 and rank1._state == LIVE and rank1._load_state is None
    assert torch.equal(rank1.model.weight, peer_state["model"]["weight"])


def test_a_checkpoint_not_read_is_still_offered_after_a_failed_agreement() -> None:
    """The agreement failing before it completed (a peer died) keeps the checkpoint for the next
    one: the live peer may be gone by then."""
    blob, _ = _peer_blob()

    class _DiesAtBroadcast(_PeerGroup):
        def broadcast_(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
            raise trainer_module.GroupFailed("peer died")

    rank1 = _rank1(_DiesAtBroadcast([[LIVE, 7, 0]], blob), load_state=lambda: (3, {}))
    with pytest.raises(trainer_module.GroupFailed):
        rank1._sync()
    assert rank1._load_state is not None and rank1._state == NONE
