"""Alias of ``recoverd.mindcluster.recover_pb2`` (one compiled copy per process)."""

import sys

from recoverd.mindcluster import recover_pb2 as _compiled

sys.modules[__name__] = _compiled
