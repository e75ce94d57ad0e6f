"""ElasticShards: a step's global batch is the same samples whatever the world, each taken once."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="taskd_client.pytorch needs PyTorch (pip install -r requirements-torch.txt)")

from taskd_client.pytorch.sharding import ElasticShards, shard_indices


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_a_steps_batch_does_not_depend_on_the_world(world: int) -> None:
    shards = ElasticShards(1000, 64, seed=3)
    for step in (0, 7, 15, 16, 40):  # 15 -> 16 crosses an epoch (1000 / 64 = 15.6 steps)
        parts = [shards.indices(step, r, world) for r in range(world)]
        taken = [i for part in parts for i in part]
        assert len(taken) == 64
        assert sorted(taken) == sorted(shards.indices(step, 0, 1))
        assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1


def test_an_epoch_visits_every_sample_once() -> None:
    shards = ElasticShards(256, 32, seed=1)
    seen = [i for step in range(8) for r in range(4) for i in shards.indices(step, r, 4)]
    assert sorted(seen) == list(range(256))
    epoch2 = [i for step in range(8, 16) for i in shards.indices(step, 0, 1)]
    assert sorted(epoch2) == list(range(256)) and epoch2 != seen  # reshuffled


def test_the_function_form_and_bad_input() -> None:
    assert shard_indices(10, 0, 0, 1, 10, seed=0) == ElasticShards(10, 10).indices(0, 0, 1)
    with pytest.raises(ValueError):
        shard_indices(10, 0, 2, 2, 4)
    with pytest.raises(ValueError):
        ElasticShards(0, 4)
