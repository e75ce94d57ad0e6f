"""Who may call the gateway, and on which jobs (docs/gateway.md, "Callers"; docs/adr/0040).

The gateway acts on a job for whoever calls it: it registers the job's client, reports faults
that restart the job's ranks, answers its recoveries. So a call is allowed only when the caller's
identity is tied to the call's ``jobId`` in ``--auth-file``:

.. code-block:: yaml

    callers:
      - name: team-a                 # for logs and events
        token_sha256: 9f86d0...      # sha256 of the bearer token (metadata "authorization: Bearer TOKEN")
        jobs: [train-a, eval-a]
      - name: taskd-b
        certificate: taskd-b         # a client certificate's common name or DNS/URI name (mutual TLS)
        jobs: [train-b]
      - name: operator
        certificate: ops
        jobs: ["*"]                  # every job

Tokens are stored as their sha256, so the file does not hand out the tokens it lists. A caller
with no identity, or one the file does not list, is refused with ``UNAUTHENTICATED``; a listed
caller acting on a job it is not given, with ``PERMISSION_DENIED``.

Without an auth file the gateway trusts every caller that reaches its port ("local trust"): only
on a loopback address, or with ``--allow-any-caller`` where a network policy stands in for it.

This module is pure: :func:`load` reads the file, :meth:`CallerTable.authorize` decides. The
servicer takes the token and the certificate's names from the call (:func:`call_identity`).
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import yaml

from recoverd.errors import BadRecord, ConfigError
from recoverd.etcd_security import check_secret_file, read_bounded
from recoverd.keys import check_id

__all__ = [
    "ANY_JOB",
    "Allowed",
    "Caller",
    "CallerTable",
    "Denied",
    "call_identity",
    "is_loopback",
    "load",
    "parse",
]

ANY_JOB = "*"
MAX_FILE_BYTES = 1 << 20
_BEARER = "bearer "


@dataclass(frozen=True, slots=True)
class Caller:
    """One identity of the auth file and the jobs it may act on (``*``: every job)."""

    name: str
    jobs: frozenset[str]

    def may_act_on(self, job: str) -> bool:
        return ANY_JOB in self.jobs or job in self.jobs


@dataclass(frozen=True, slots=True)
class Allowed:
    caller: Caller | None  # None: local trust (no auth file)


@dataclass(frozen=True, slots=True)
class Denied:
    code: grpc.StatusCode
    #: Who asked, for the log and the event: a caller's name, or what was presented.
    who: str
    detail: str


@dataclass(frozen=True, slots=True)
class CallerTable:
    """The auth file, by token digest and by certificate name."""

    by_token: Mapping[str, Caller] = field(default_factory=dict)
    by_certificate: Mapping[str, Caller] = field(default_factory=dict)

    def identify(self, token: str | None, cert_names: Iterable[str]) -> Caller | str:
        """The caller, or why none: a token, when presented, decides (a wrong one is never
        rescued by a certificate); else the first certificate name the file lists."""
        if token is not None:
            # A dict lookup of the digest: its timing says nothing useful about a token (the
            # caller would have to choose sha256 outputs), so no constant-time scan is needed.
            known = self.by_token.get(hashlib.sha256(token.encode()).hexdigest())
            return known if known is not None else "a bearer token the auth file does not list"
        names = list(cert_names)
        for name in names:
            if name in self.by_certificate:
                return self.by_certificate[name]
        if names:
            return f"client certificate {names[0]!r}, which the auth file does not list"
        return "no identity (neither a bearer token nor a client certificate)"

    def authorize(self, token: str | None, cert_names: Iterable[str], job: str) -> Allowed | Denied:
        caller = self.identify(token, cert_names)
        if isinstance(caller, str):
            return Denied(
                grpc.StatusCode.UNAUTHENTICATED,
                caller,
                f"jobId={job}: {caller}: present a bearer token or a client certificate that --auth-file"
                " ties to this job",
            )
        if not caller.may_act_on(job):
            return Denied(
                grpc.StatusCode.PERMISSION_DENIED,
                caller.name,
                f"jobId={job}: caller {caller.name!r} may not act on this job",
            )
        return Allowed(caller)


def parse(data: Any, source: str = "the auth file") -> CallerTable:
    """The table from the file's YAML value; ConfigError naming the entry for anything wrong."""
    if not isinstance(data, dict) or not isinstance(data.get("callers"), list):
        raise ConfigError(f"{source}: expected a mapping with a 'callers' list (docs/gateway.md)")
    by_token: dict[str, Caller] = {}
    by_certificate: dict[str, Caller] = {}
    for i, entry in enumerate(data["callers"]):
        where = f"{source}: callers[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected a mapping")
        unknown = set(entry) - {"name", "token_sha256", "certificate", "jobs"}
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        token, cert = entry.get("token_sha256"), entry.get("certificate")
        if (token is None) == (cert is None):
            raise ConfigError(f"{where}: give exactly one of token_sha256 and certificate")
        jobs = entry.get("jobs")
        if not isinstance(jobs, list) or not jobs or not all(isinstance(j, str) for j in jobs):
            raise ConfigError(f"{where}: 'jobs' must be a non-empty list of job names (or \"*\")")
        for job in jobs:
            if job != ANY_JOB:
                try:
                    check_id("job", job)
                except BadRecord as err:
                    raise ConfigError(f"{where}: {err.detail}") from None
        name = str(entry.get("name") or cert or f"token {str(token)[:8]}")
        caller = Caller(name, frozenset(jobs))
        if token is not None:
            digest = str(token).lower()
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ConfigError(f"{where}: token_sha256 must be 64 hex digits (sha256sum of the token)")
            if digest in by_token:
                raise ConfigError(f"{where}: this token is listed twice")
            by_token[digest] = caller
        else:
            if not isinstance(cert, str) or not cert:
                raise ConfigError(f"{where}: certificate must be a common name or DNS name")
            if cert in by_certificate:
                raise ConfigError(f"{where}: certificate {cert!r} is listed twice")
            by_certificate[cert] = caller
    return CallerTable(by_token, by_certificate)


def load(path: str) -> CallerTable:
    check_secret_file(path, "gateway auth file")
    raw = read_bounded("--auth-file", path, MAX_FILE_BYTES)
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        raise ConfigError(f"--auth-file {path}: not YAML: {err}") from None
    return parse(data, f"--auth-file {path}")


def call_identity(context: Any) -> tuple[str | None, list[str]]:
    """The bearer token (``authorization: Bearer TOKEN`` metadata) and the client certificate's
    names (common name first, then its subject alternative names) of a gRPC call."""
    token = None
    for key, value in context.invocation_metadata() or ():
        if key.lower() == "authorization" and isinstance(value, str) and value.lower().startswith(_BEARER):
            token = value[len(_BEARER) :].strip()
            break
    names: list[str] = []
    auth = context.auth_context() or {}
    for prop in ("x509_common_name", "x509_subject_alternative_name"):
        for raw in auth.get(prop, ()):
            text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            if text not in names:
                names.append(text)
    return token, names


def is_loopback(listen: str) -> bool:
    """Whether ``host:port`` listens on a loopback address only (``localhost``, 127.0.0.0/8, ::1)."""
    host = listen.rsplit(":", 1)[0].strip("[]") if ":" in listen else listen
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
