"""recoverctl's read commands: ``jobs``, ``status`` (``--watch``), ``events`` (``--follow``),
``decisions``, ``timeline`` (``--recovery``, ``--plot``) and ``stacks``: each reads (:mod:`reads`,
or a watch: :mod:`watchview`, :mod:`follow`), builds its dict (:mod:`render`, :mod:`timeline`)
and prints it as JSON or text. Nothing here writes to etcd.

``--json`` output follows the schemas in docs/recoverctl-schemas/ (one JSON document, or with
``--watch``/``--follow`` one compact JSON object per line). Updates are flushed as they are
printed: a pipe (``| jq``, a log file) gets each one at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import Any

from recoverd.cli import plot
from recoverd.cli.follow import follow_events
from recoverd.cli.reads import NotFound, hangs, read_events, read_jobs, read_view
from recoverd.cli.render import (
    as_dict,
    decision_lines,
    format_event,
    format_jobs,
    format_stacks,
    format_status,
    has_ended,
    job_row,
    stacks_list,
    status_dict,
)
from recoverd.cli.timeline import format_timeline, timeline_dict, unavailable
from recoverd.cli.watchview import frame, watch_status
from recoverd.jobview import JobView
from recoverd.keys import Keyspace
from recoverd.records import pb
from recoverd.store import Store

__all__ = ["COMMANDS", "run"]

COMMANDS = ("jobs", "status", "events", "decisions", "timeline", "stacks")


def _emit(text: str) -> None:
    print(text, flush=True)


def _emit_lines(lines: Iterable[str]) -> None:
    for line in lines:
        print(line)


def _document(data: Any) -> str:
    return json.dumps(data, indent=2)


async def run(store: Store, keys: Keyspace, args: argparse.Namespace) -> int:
    """Run the read command ``args.cmd``; return the exit status."""
    if args.cmd == "jobs":
        rows = [job_row(name, view) for name, view in (await read_jobs(store, keys)).items()]
        _emit(_document(rows) if args.json else format_jobs(rows, keys.prefix))
        return 0
    if args.cmd == "status" and args.watch:
        is_tty = sys.stdout.isatty()

        def show(view: JobView) -> None:
            _emit(frame(status_dict(view), as_json=args.json, is_tty=is_tty, ended=has_ended(view)))

        await watch_status(store, keys, args.job, show)
        return 0
    view = await read_view(store, keys, args.job)
    assert view.run is not None
    if args.cmd == "status":
        data = status_dict(view)
        _emit(_document(data) if args.json else format_status(data))
    elif args.cmd == "events" and args.follow:

        def show_event(event: pb.Event) -> None:
            _emit(json.dumps(as_dict(event), separators=(",", ":")) if args.json else format_event(event))

        await follow_events(store, keys, view.run, show_event)
    elif args.cmd == "events":
        evs = await read_events(store, keys, view.run)
        if args.json:
            _emit(_document([as_dict(e) for e in evs]))
        else:
            _emit_lines(map(format_event, evs))
    elif args.cmd == "timeline":
        if (why := unavailable(view, args.recovery)) is not None:
            raise NotFound(why)
        timeline = timeline_dict(view, hangs(await read_events(store, keys, view.run)), args.recovery)
        if args.plot:
            if timeline is None:
                raise NotFound(f"job {args.job} has had no recovery so far: nothing to plot")
            plot.write_png(timeline, args.job, args.plot)
            print(f"recoverctl: timeline of recovery {timeline['recovery']} drawn in {args.plot}", file=sys.stderr)
        _emit(_document(timeline) if args.json else format_timeline(timeline))
    elif args.cmd == "stacks":
        found = stacks_list(hangs(await read_events(store, keys, view.run)), args.recovery, args.rank)
        if args.json:
            _emit(_document(found))
        elif not found:
            which = f" in recovery {args.recovery}" if args.recovery is not None else ""
            _emit(f"no stacks recorded for job {args.job}{which}")
        else:
            _emit(format_stacks(found))
    elif args.cmd == "decisions":
        decisions = [view.decisions[e] for e in sorted(view.decisions)]
        if args.json:
            _emit(_document([as_dict(d) for d in decisions]))
        else:
            _emit_lines(decision_lines(decisions))
    return 0
