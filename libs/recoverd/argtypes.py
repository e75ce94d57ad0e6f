"""argparse value types shared by every recoverd command line."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

__all__ = ["lease_ttl", "non_negative", "positive"]

N = TypeVar("N", int, float)


def _checked(kind: Callable[[str], N], accept: Callable[[N], bool], requirement: str) -> Callable[[str], N]:
    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid {getattr(kind, '__name__', 'value')}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"{text!r} {requirement}")
        return value

    return parse


def positive(kind: Callable[[str], N]) -> Callable[[str], N]:
    """An argparse ``type=`` that parses with ``kind`` and refuses zero and negatives, clearly."""
    return _checked(kind, lambda value: value > 0, "must be positive")


def non_negative(kind: Callable[[str], N]) -> Callable[[str], N]:
    """An argparse ``type=`` that parses with ``kind`` and refuses negatives (zero is allowed)."""
    return _checked(kind, lambda value: value >= 0, "must not be negative")


def lease_ttl(text: str) -> int:
    """An argparse ``type=`` for lease TTLs: whole seconds, at least 1 (etcd grants nothing else)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value < 1 or value != round(value):
        raise argparse.ArgumentTypeError(f"{text!r}: etcd lease TTLs are whole seconds, at least 1 (e.g. 1, 2, 5)")
    return int(value)
