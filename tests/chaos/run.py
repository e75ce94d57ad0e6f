"""``make chaos``: run every chaos scenario N times and write the table (JSON and Markdown).

Usage (from the repository root)::

    .venv/bin/python -m tests.chaos.run                      # every scenario, its default trials
    .venv/bin/python -m tests.chaos.run --trials 3 -k etcd   # scenarios whose name contains "etcd"
    .venv/bin/python -m tests.chaos.run --subset             # what make test runs

Each trial prints one line as it ends. The table (scenario x trials: completed, failed, duplicates,
leftovers, median fault-to-DONE time) is printed and written to ``--out`` (default
tests/chaos/results/) as results.json and results.md, with the command line, the host, the etcd
binary and the date. Trial logs go to ``--workdir`` (default a temp dir, kept when a trial fails).
Exit status: 0 when every trial of every scenario passed, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "tests.chaos"

from recoverd.agent.agent import become_subreaper
from recoverd.etcd_server import EmbeddedEtcd

from .harness import Scenario, TrialResult, run_trial
from .scenarios import MAKE_TEST_SUBSET, SCENARIOS

__all__ = ["main"]

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(scenario: Scenario, results: list[TrialResult]) -> dict[str, Any]:
    times = [r.time_s for r in results if r.ok and r.time_s is not None]
    errors: dict[str, int] = {}
    for r in results:
        if r.error:
            key = re.sub(r"\{[^{}]*\}", "{...}", r.error)  # pid maps differ trial by trial
            errors[key] = errors.get(key, 0) + 1
    return {
        "scenario": scenario.name,
        "summary": scenario.summary,
        "trials": len(results),
        "completed": sum(r.completed for r in results),
        "failed": sum(not r.ok for r in results),
        "duplicates": sum(r.duplicates for r in results),
        "lost": sum(r.lost for r in results),
        "leftovers": sum(r.leftovers for r in results),
        "median_s": _median(times),
        "max_s": max(times) if times else None,
        "errors": errors,
    }


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"Command: `{meta['command']}`  ",
        f"Host: {meta['host']}, {meta['cpus']} CPUs; {meta['etcd']}; {meta['date']}; {meta['total_s']:.0f} s in all",
        "",
        "| scenario | trials | completed | failed | duplicates | lost | leftovers | median fault→DONE (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        median = f"{row['median_s']:.2f}" if row["median_s"] is not None else "-"
        lines.append(
            f"| {row['scenario']} | {row['trials']} | {row['completed']} | {row['failed']} | {row['duplicates']}"
            f" | {row['lost']} | {row['leftovers']} | {median} |"
        )
    failures = [(row["scenario"], err, n) for row in rows for err, n in row["errors"].items()]
    if failures:
        lines += ["", "Failures (scenario: first line of the error, trials):", ""]
        lines += [f"- {name}: `{err}` ({n})" for name, err, n in failures]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=None, help="trials per scenario (default: each one's own)")
    parser.add_argument("-k", dest="match", action="append", default=[], help="only scenarios containing this")
    parser.add_argument("--subset", action="store_true", help="only make test's subset (its trial numbers)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where results.json/.md go (%(default)s)")
    parser.add_argument("--workdir", type=Path, default=None, help="trial logs (default: a temp dir)")
    args = parser.parse_args(argv)

    if not become_subreaper():
        print("warning: not a child subreaper; orphaned ranks may escape the census", file=sys.stderr)
    plan: list[tuple[Scenario, list[int]]] = []
    if args.subset:
        for name in dict.fromkeys(n for n, _ in MAKE_TEST_SUBSET):
            plan.append((SCENARIOS[name], [i for n, i in MAKE_TEST_SUBSET if n == name]))
    else:
        for scenario in SCENARIOS.values():
            if args.match and not any(m in scenario.name for m in args.match):
                continue
            plan.append((scenario, list(range(args.trials or scenario.trials))))
    if not plan:
        parser.error("no scenario matches")

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="recoverd-chaos-"))
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    results: list[TrialResult] = []
    failed_required = False
    with EmbeddedEtcd(for_tests=True) as etcd:
        etcd_desc = etcd.etcd_binary.describe()
        for scenario, numbers in plan:
            mine: list[TrialResult] = []
            for number in numbers:
                result = run_trial(scenario, number, etcd.endpoint, workdir / scenario.name / str(number))
                print(result.describe(), flush=True)
                mine.append(result)
            results += mine
            row = summarize(scenario, mine)
            rows.append(row)
            failed_required |= bool(row["failed"])
    meta = {
        "command": " ".join(
            shlex.quote(a) for a in [os.path.relpath(sys.executable), "-m", "tests.chaos.run", *(argv or sys.argv[1:])]
        ),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "etcd": etcd_desc,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "total_s": time.monotonic() - started,
    }
    table = markdown(rows, meta)
    print("\n" + table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(table)
    (args.out / "results.json").write_text(
        json.dumps({"meta": meta, "scenarios": rows, "trials": [r.to_json() for r in results]}, indent=2) + "\n"
    )
    print(f"wrote {args.out / 'results.md'} and results.json; trial logs in {workdir}")
    if not any(not r.ok for r in results):
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed_required else 0


if __name__ == "__main__":
    sys.exit(main())
