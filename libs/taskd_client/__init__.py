"""The recoverd client library for training scripts.

``DLRecoverManager`` (``taskd_client.manager``) is MindCluster's client API over etcd: a job's
controller registers, receives the recovery signals and reports its answers. See docs/client.md.
``heartbeat(step)`` (``taskd_client.progress``) reports a training loop's progress to the local
agent, for hang and straggler detection (docs/detectors.md).
"""

from taskd_client.manager import DLRecoverManager, Handler, RecoverManager
from taskd_client.progress import heartbeat

__all__ = ["DLRecoverManager", "Handler", "RecoverManager", "heartbeat"]
