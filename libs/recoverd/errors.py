"""Typed errors with stable reason codes.

Every error recoverd raises on purpose is a :class:`RecoverdError` carrying a :class:`Reason` (a
stable code, the same string written into event records) and a human-readable ``detail``. A
reconcile pass records bad input as an event with its reason and does not retry it: a retry cannot
fix bad input. Anything else is an internal error, logged with its traceback and requeued.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "BadRecord",
    "BadReport",
    "ConfigError",
    "EtcdAccessDenied",
    "EtcdRefused",
    "EtcdUnavailable",
    "FenceLost",
    "IllegalTransition",
    "JobSpecMismatch",
    "LaunchFailed",
    "PermissionDenied",
    "Reason",
    "RecoverdError",
    "RequestTooLarge",
    "StaleEpoch",
    "UnknownRank",
]


class Reason(StrEnum):
    """Stable reason codes; they appear in events and in `recoverctl events` output."""

    ILLEGAL_TRANSITION = "illegal_transition"
    STALE_EPOCH = "stale_epoch"
    FENCE_LOST = "fence_lost"
    BAD_RECORD = "bad_record"
    BAD_REPORT = "bad_report"
    UNKNOWN_RANK = "unknown_rank"
    UNKNOWN_JOB = "unknown_job"
    JOB_SPEC_MISMATCH = "job_spec_mismatch"
    LAUNCH_FAILED = "launch_failed"
    ETCD_UNAVAILABLE = "etcd_unavailable"
    ETCD_REFUSED = "etcd_refused"
    ETCD_LIMIT = "etcd_limit"
    ETCD_ACCESS = "etcd_access"
    ETCD_PERMISSION = "etcd_permission"
    CONFIG_ERROR = "config_error"
    CALLER_DENIED = "caller_denied"
    INTERNAL_ERROR = "internal_error"


class RecoverdError(Exception):
    """Base of recoverd's errors: ``reason`` is a stable code, ``detail`` says what happened."""

    reason: Reason = Reason.INTERNAL_ERROR

    def __init__(self, detail: str, *, reason: Reason | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if reason is not None:
            self.reason = reason

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


class IllegalTransition(RecoverdError):
    """An event arrived in a phase that has no rule for it (recorded, never resets the episode)."""

    reason = Reason.ILLEGAL_TRANSITION


class StaleEpoch(RecoverdError):
    """A report or command for an epoch older than the current one (recorded and ignored)."""

    reason = Reason.STALE_EPOCH


class FenceLost(RecoverdError):
    """This coordinator no longer holds the leader key: its write was rejected."""

    reason = Reason.FENCE_LOST


class BadRecord(RecoverdError):
    """A value under the prefix that does not parse as the record its key names."""

    reason = Reason.BAD_RECORD


class BadReport(RecoverdError):
    """A participant's report that is malformed or names something that does not exist."""

    reason = Reason.BAD_REPORT


class UnknownRank(RecoverdError):
    """A fault or report names a rank outside the job's world."""

    reason = Reason.UNKNOWN_RANK


class JobSpecMismatch(RecoverdError):
    """A launcher's job spec disagrees with the job record already stored."""

    reason = Reason.JOB_SPEC_MISMATCH


class LaunchFailed(RecoverdError):
    """A rank process could not be started."""

    reason = Reason.LAUNCH_FAILED


class EtcdUnavailable(RecoverdError):
    """etcd could not be reached within the configured timeout."""

    reason = Reason.ETCD_UNAVAILABLE


class EtcdAccessDenied(EtcdUnavailable):
    """etcd could not be used with these credentials: the TLS handshake failed (a certificate that
    does not verify, an expired one, TLS against a plaintext server) or the user or password is
    wrong. At startup it is fatal (exit 2: nothing was written); later, a service treats it as etcd
    being unavailable and keeps retrying, touching no rank, until the credentials work again."""

    reason = Reason.ETCD_ACCESS


class ReadCompacted(EtcdUnavailable):
    """A read pinned at a revision that etcd has compacted away since: read again at a fresh one."""


class EtcdRefused(RecoverdError):
    """etcd answered, and refused the request (invalid argument, precondition): a retry of the same
    request gets the same answer, so it is logged loudly and never retried as "etcd unavailable"."""

    reason = Reason.ETCD_REFUSED


class PermissionDenied(EtcdRefused):
    """etcd refused a request outside the user's roles (docs/security.md): another job's keys."""

    reason = Reason.ETCD_PERMISSION


class RequestTooLarge(EtcdRefused):
    """A request over one of etcd's limits (128 operations per transaction, 1.5 MiB per request) or a
    response over the client's 4 MiB: refused before it is sent where the size is known in advance."""

    reason = Reason.ETCD_LIMIT


class ConfigError(RecoverdError):
    """Invalid settings or command-line input."""

    reason = Reason.CONFIG_ERROR
