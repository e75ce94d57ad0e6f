"""Part of recoverd's MindCluster TaskD import paths (see taskd/__init__.py)."""
