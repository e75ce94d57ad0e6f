"""The chaos scenarios ``make test`` runs: scenarios.MAKE_TEST_SUBSET, one test per (scenario, trial).

The whole suite, every scenario repeated, is ``make chaos`` (tests/chaos/run.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import run_trial
from .scenarios import MAKE_TEST_SUBSET, SCENARIOS

pytestmark = [pytest.mark.etcd, pytest.mark.chaos]


@pytest.mark.parametrize(("name", "number"), MAKE_TEST_SUBSET, ids=[f"{n}-{i}" for n, i in MAKE_TEST_SUBSET])
def test_chaos_scenario(name: str, number: int, etcd_endpoint: str, tmp_path: Path) -> None:
    scenario = SCENARIOS[name]
    result = run_trial(scenario, number, etcd_endpoint, tmp_path)
    if not result.ok:
        failure = tmp_path / "failure.txt"
        pytest.fail(result.describe() + (f"\n{failure.read_text()}" if failure.exists() else ""), pytrace=False)
