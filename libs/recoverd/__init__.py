"""recoverd: process-level fault recovery for distributed training, on etcd."""

__version__ = "0.1.0"
