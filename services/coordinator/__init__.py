"""The recovery coordinator (the ClusterD of recoverd): a pure state machine and its etcd shell."""
