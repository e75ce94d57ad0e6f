"""The Recover gRPC gateway: MindCluster's ClusterD service for unmodified upstream clients, over etcd."""
