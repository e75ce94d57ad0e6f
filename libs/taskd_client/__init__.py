"""The recoverd client library for training scripts.

``DLRecoverManager`` (``taskd_client.manager``) is MindCluster's client API over etcd: a job's
controller registers, receives the recovery signals and reports its answers. See docs/client.md.
"""

from taskd_client.manager import DLRecoverManager, Handler, RecoverManager

__all__ = ["DLRecoverManager", "Handler", "RecoverManager"]
