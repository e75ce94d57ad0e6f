"""What a committed pass reports to Prometheus, from the recovery record before and after it."""

from __future__ import annotations

import dataclasses

from recoverd.coordinator.model import FaultInfo, Phase, Recovery
from recoverd.coordinator.telemetry import observe

FAULT = FaultInfo("f1", rank=1, node="n0", fault_type="0", source="agent", detected_at=100.0)


def _rec(*log: tuple[Phase, float], **changes: object) -> Recovery:
    phase = log[-1][0] if log else Phase.DONE
    fields = {"phase": phase, "recovery_id": 1, "phase_log": tuple((p, t, 1) for p, t in log)}
    return dataclasses.replace(Recovery(), **{**fields, **changes})  # type: ignore[arg-type]


def test_a_recovery_opening_counts_its_faults_and_no_phase() -> None:
    seen = observe(Recovery(), _rec((Phase.COLLECTING, 100.2), faults=(FAULT,)), now=100.25)
    assert seen.phases == () and seen.closed is None
    assert [(t, s, round(d, 3)) for t, s, d in seen.faults] == [("0", "agent", 0.25)]


def test_each_phase_left_is_observed_once_with_its_time() -> None:
    before = _rec((Phase.COLLECTING, 100.2), (Phase.STOPPING, 100.3), faults=(FAULT,))
    after = _rec((Phase.COLLECTING, 100.2), (Phase.STOPPING, 100.3), (Phase.GLOBAL_FAULT, 100.5),
                 (Phase.DECIDING, 100.6), faults=(FAULT,))  # fmt: skip
    seen = observe(before, after, now=100.6)
    assert [(p, round(d, 3)) for p, d in seen.phases] == [("STOPPING", 0.2), ("GLOBAL_FAULT", 0.1)]
    assert seen.faults == ()  # already counted when merged
    assert observe(after, after, now=101.0).phases == ()  # a pass that changed nothing


def test_closing_counts_the_outcome_and_fault_to_done() -> None:
    before = _rec((Phase.COLLECTING, 100.2), (Phase.RECOVERING, 100.6), faults=(FAULT,), strategy="recover-in-place")
    done = _rec((Phase.COLLECTING, 100.2), (Phase.RECOVERING, 100.6), (Phase.DONE, 100.9), faults=(FAULT,),
                strategy="recover-in-place")  # fmt: skip
    seen = observe(before, done, now=100.9)
    assert seen.closed is not None
    assert seen.closed[:2] == ("recover-in-place", "succeeded") and round(seen.closed[2], 3) == 0.9
    failed = dataclasses.replace(done, phase=Phase.FAILED, phase_log=(*before.phase_log, (Phase.FAILED, 101.0, 1)))
    assert observe(before, failed, now=101.0).closed[1] == "failed"  # type: ignore[index]


def test_a_new_recovery_after_a_closed_one_starts_afresh() -> None:
    old = _rec((Phase.COLLECTING, 10.0), (Phase.DONE, 11.0), faults=(FAULT,))
    new = _rec((Phase.COLLECTING, 200.0), recovery_id=2, faults=(dataclasses.replace(FAULT, fault_id="f2"),))
    seen = observe(old, new, now=200.1)
    assert seen.phases == () and len(seen.faults) == 1 and seen.closed is None


def test_the_grafana_dashboard_uses_only_metrics_recoverd_exports() -> None:
    import json
    import re
    from pathlib import Path

    from recoverd import metrics

    exported = {m.name for m in metrics.enable().collect()}
    dashboard = json.loads((Path(__file__).parents[2] / "deploy" / "grafana" / "recoverd-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {re.sub(r"_(bucket|sum|count|total)$", "", name) for e in exprs for name in re.findall(r"recoverd_\w+", e)}
    assert used and used <= {re.sub(r"_total$", "", n) for n in exported}, used - exported
    assert {re.sub(r"_total$", "", n) for n in exported} <= used  # every metric has a panel


def test_metrics_record_nothing_and_import_nothing_until_enabled() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from recoverd import metrics; metrics.FAULTS.labels('1', 'agent').inc();"
        " assert 'prometheus_client' not in sys.modules; reg = metrics.enable();"
        " metrics.FAULTS.labels('1', 'agent').inc();"
        " print(reg.get_sample_value('recoverd_faults_total', {'type': '1', 'source': 'agent'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1.0"  # the increment before enable() was not kept
