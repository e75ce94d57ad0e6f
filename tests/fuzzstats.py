"""Figures of the fuzz tests (cases run, crashes seen), printed at the end of the run.

Test-only shared counters: each fuzz test adds the cases it ran; a case that crashes fails its test
(hypothesis stops at the first), so a green run reports 0 crashes. tests/conftest.py prints them.
"""

from __future__ import annotations

from collections import Counter

__all__ = ["CASES", "FIGURES", "record"]

CASES: Counter[str] = Counter()
#: Other figures (writes per case, passes run), not counted as cases.
FIGURES: Counter[str] = Counter()


def record(name: str, cases: int = 1, **figures: int) -> None:
    CASES[name] += cases
    FIGURES.update(figures)
