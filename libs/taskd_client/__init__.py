"""The recoverd client library for training scripts (DLRecoverManager over etcd arrives with issue 3)."""
