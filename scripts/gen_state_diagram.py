#!/usr/bin/env python3
"""Print the coordinator's recovery state machine as a Mermaid ``stateDiagram-v2``.

The diagram is generated, never drawn by hand:

* every arrow of the table comes from ``recoverd.coordinator.recovery.TRANSITIONS``;
* the arrows that the table leaves to guards in code (a failed stop, a failed strategy, a give-up,
  everything that ends in FAILED) are found by *running* :func:`recovery.step` on a small scenario
  each, so a change to the guards changes the diagram too.

Usage (from the repository root, with the project installed, e.g. ``make venv``)::

    .venv/bin/python scripts/gen_state_diagram.py           # print the fenced Mermaid block
    .venv/bin/python scripts/gen_state_diagram.py --write   # replace the block in docs/architecture.md
    .venv/bin/python scripts/gen_state_diagram.py --check   # exit 1 if docs/architecture.md is stale

The block in the document sits between ``<!-- BEGIN GENERATED STATE DIAGRAM -->`` and
``<!-- END GENERATED STATE DIAGRAM -->``.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

try:
    from recoverd.coordinator import inputs, model
    from recoverd.coordinator.recovery import TRANSITIONS, step
except ImportError as err:  # pragma: no cover - a setup problem, not a code path
    sys.exit(f"gen_state_diagram: cannot import recoverd ({err}); run it with the project's venv: .venv/bin/python")

BEGIN = "<!-- BEGIN GENERATED STATE DIAGRAM -->"
END = "<!-- END GENERATED STATE DIAGRAM -->"
DOC = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"


def _scenario_rec(phase: model.Phase, **changes: object) -> model.Recovery:
    """A recovery in ``phase`` with one participant, one fault and a deadline already passed."""
    return model.Recovery(
        phase=phase,
        epoch=1,
        recovery_id=1,
        opened_at=0.0,
        deadline_at=0.0,
        faults=(model.FaultInfo("n0.r0.g0.c0", 0, "n0"),),
        participants=frozenset({"agent.n0"}),
        **changes,  # type: ignore[arg-type]
    )


def guarded_edges() -> list[tuple[model.Phase, model.Phase, str]]:
    """The transitions decided by guards in code, each found by running ``step`` once."""
    scenarios: list[tuple[str, model.Recovery, inputs.Event]] = [
        ("StopCompleted (code != 0)", _scenario_rec(model.Phase.STOPPING), inputs.StopCompleted(1, "agent.n0", code=1)),
        (
            "RecoverStatusReported (code != 0)",
            _scenario_rec(model.Phase.RECOVERING, strategy="recover-in-place"),
            inputs.RecoverStatusReported(1, "agent.n0", code=1),
        ),
        (
            "RecoverStatusReported (code != 0, strategy exit)",
            _scenario_rec(model.Phase.RECOVERING, strategy="exit"),
            inputs.RecoverStatusReported(1, "agent.n0", code=1),
        ),
        (
            "DeadlinePassed (strategy exit)",
            _scenario_rec(model.Phase.RECOVERING, strategy="exit"),
            inputs.DeadlinePassed(1),
        ),
        (
            "CommandedNodeLost (strategy exit)",
            _scenario_rec(model.Phase.RECOVERING, strategy="exit", command_nodes=frozenset({"n1"})),
            inputs.CommandedNodeLost(1, frozenset({"n1"})),
        ),
        (
            "RecoverStatusReported (all confirmed, strategy dump: its exit follows)",
            _scenario_rec(model.Phase.RECOVERING, strategy="dump"),
            inputs.RecoverStatusReported(1, "agent.n0", code=0),
        ),
        (
            "DecisionMade (give up)",
            _scenario_rec(model.Phase.DECIDING),
            inputs.DecisionMade(1, "", give_up=True),
        ),
    ]
    edges = []
    for label, rec, event in scenarios:
        new, _ = step(rec, event, now=1.0)
        if new.phase is not rec.phase or new.epoch != rec.epoch:  # a new round in the same phase too
            edges.append((rec.phase, new.phase, label))
    return edges


def render() -> str:
    """The fenced Mermaid block, deterministic for a given TRANSITIONS table and ``step``."""
    labels: dict[tuple[model.Phase, model.Phase], list[str]] = {}
    for (src, event_type), dst in TRANSITIONS.items():
        labels.setdefault((src, dst), []).append(event_type.__name__)
    for src, dst, label in guarded_edges():
        labels.setdefault((src, dst), []).append(label)

    start = model.Recovery().phase
    order = [start, *(p for p in model.Phase if p is not start)]  # the walk's order: DONE first
    sources = {src for src, _ in labels}
    lines = ["```mermaid", "stateDiagram-v2", f"    [*] --> {start.value}"]
    for (src, dst), names in sorted(labels.items(), key=lambda kv: (order.index(kv[0][0]), order.index(kv[0][1]))):
        lines.append(f"    {src.value} --> {dst.value} : {', '.join(names)}")
    for phase in order:
        if phase not in sources:  # no way out: terminal
            lines.append(f"    {phase.value} --> [*]")
    lines.append("```")
    return "\n".join(lines) + "\n"


def _current_block(text: str) -> str | None:
    begin, end = text.find(BEGIN), text.find(END)
    if begin < 0 or end < begin:
        return None
    return text[begin + len(BEGIN) : end].strip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help=f"exit 1 if {DOC.name} does not hold the current diagram")
    mode.add_argument("--write", action="store_true", help=f"replace the generated block in {DOC.name}")
    parser.add_argument("--doc", type=Path, default=DOC, help="the document holding the markers (%(default)s)")
    args = parser.parse_args(argv)

    diagram = render()
    if not (args.check or args.write):
        sys.stdout.write(diagram)
        return 0
    text = args.doc.read_text()
    current = _current_block(text)
    if current is None:
        print(f"{args.doc}: markers {BEGIN} ... {END} not found", file=sys.stderr)
        return 1
    if args.check:
        if current == diagram:
            return 0
        diff = difflib.unified_diff(current.splitlines(), diagram.splitlines(), "in the doc", "generated", lineterm="")
        print(f"{args.doc}: the state diagram is stale; run scripts/gen_state_diagram.py --write", file=sys.stderr)
        print("\n".join(diff), file=sys.stderr)
        return 1
    begin, end = text.find(BEGIN), text.find(END)
    args.doc.write_text(text[: begin + len(BEGIN)] + "\n" + diagram + text[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
