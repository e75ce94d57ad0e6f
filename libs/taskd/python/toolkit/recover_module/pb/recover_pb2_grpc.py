"""Alias of ``recoverd.mindcluster.recover_pb2_grpc`` (one compiled copy per process)."""

import sys

from recoverd.mindcluster import recover_pb2_grpc as _compiled

sys.modules[__name__] = _compiled
