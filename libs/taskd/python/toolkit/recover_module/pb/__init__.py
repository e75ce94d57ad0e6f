"""TaskD's ``pb``: MindCluster's ``recover.proto`` messages (``pb.ClientInfo``, ``pb.Status``, ...).

The proto is compiled once, as ``recoverd.mindcluster.recover_pb2``; this module and
``pb.recover_pb2`` re-export that module. A second compiled copy of the same message names in one
process would fail with "duplicate symbol".
"""

from recoverd.mindcluster.recover_pb2 import *  # noqa: F403
from recoverd.mindcluster.recover_pb2 import DESCRIPTOR  # noqa: F401
