"""PyTorch integration: data-parallel training whose survivors stay alive when a peer dies.

``ResilientTrainer`` (trainer.py) is what a script uses; ``ResilientGroup`` (group.py) is the gloo
process group with abortable collectives and numbered generations; ``EtcdStore`` (store.py) is
torch.distributed's key-value store kept in recoverd's etcd; ``RecoveryProtocol`` (protocol.py) lets the
trainer take part in recoverd's recoveries (elastic world size, dump); ``ElasticShards`` (sharding.py)
shards data for a world whose size changes. Needs ``torch`` (requirements-torch.txt).
See docs/pytorch.md.
"""

from taskd_client.pytorch.group import GroupFailed, ResilientGroup
from taskd_client.pytorch.protocol import RecoveryProtocol
from taskd_client.pytorch.sharding import ElasticShards, shard_indices
from taskd_client.pytorch.store import EtcdStore, GenerationAborted
from taskd_client.pytorch.trainer import RankEnv, ResilientTrainer, RetryableFault
from taskd_client.pytorch.warm import wait_for_rank

__all__ = [
    "ElasticShards",
    "EtcdStore",
    "GenerationAborted",
    "GroupFailed",
    "RankEnv",
    "RecoveryProtocol",
    "ResilientGroup",
    "ResilientTrainer",
    "RetryableFault",
    "shard_indices",
    "wait_for_rank",
]
