"""MindCluster's return codes (reference/mindcluster-contract.md section 8), as the client API and
the gRPC gateway return them in ``Status.code``. 4xx: the caller's error, not retryable; 5xx: the
server's, retryable."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["Code"]


class Code(IntEnum):
    OK = 0
    SUCCESS = 200
    EXIT_ISOLATE_RANKS = 201
    UNREGISTERED = 400
    ORDER_MIXED = 401
    JOB_NOT_EXIST = 402
    RECOVER_DISABLED = 403
    PROCESS_NOT_READY = 404
    RECOVERABLE_RETRY_ERROR = 405
    UNRECOVERABLE_RETRY_ERROR = 406
    DUMP_ERROR = 407
    UNINIT = 408
    INVALID_PARAM = 409
    CLIENT_ERROR = 499
    OUT_OF_MAX_JOBS = 500
    SCHEDULE_TIMEOUT = 503
    WAIT_REPORT_TIMEOUT = 507
    SERVER_INNER_ERROR = 599
