"""Log setup for every recoverd process: plain text, or one JSON object per line (``--log-format``).

JSON lines carry ``time`` (RFC 3339, UTC), ``level``, ``logger``, ``message`` and, where known,
``job``, ``run``, ``node``, ``rank`` and ``epoch``. Those come from two places:

* :func:`bind` sets them for the current asyncio task and every task it starts afterwards (a
  contextvar): the agent binds its job and node once, the coordinator binds the job (and run) around
  each pass;
* a log call's ``extra={"rank": 3}`` adds or overrides them for one line.

A field that is not known is left out, never written as null. Plain text stays the default (what a
person reads in a terminal); JSON is for log collectors (Loki, Elasticsearch, Cloud Logging).
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import datetime
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["FIELDS", "FORMATS", "JsonFormatter", "add_arguments", "bind", "bound", "setup"]

#: The context fields a JSON line may carry, in this order.
FIELDS = ("job", "run", "node", "rank", "epoch")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_CONTEXT: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("recoverd_log_context", default={})  # noqa: B039


def bind(**fields: Any) -> None:
    """Add ``fields`` to this task's log context (and its future child tasks')."""
    _CONTEXT.set({**_CONTEXT.get(), **{k: v for k, v in fields.items() if v not in (None, "")}})


@contextlib.contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """``fields`` in the log context for the duration of the block."""
    token = _CONTEXT.set({**_CONTEXT.get(), **{k: v for k, v in fields.items() if v not in (None, "")}})
    try:
        yield
    finally:
        _CONTEXT.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per record; see the module docstring."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = _CONTEXT.get()
        for field in FIELDS:
            value = record.__dict__.get(field, context.get(field))
            if value is not None and value != "":
                line[field] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` and ``--log-format``, the same on every recoverd command that runs a service."""
    parser.add_argument("--log-level", default=os.environ.get("RECOVERD_LOG_LEVEL", "INFO"), help="%(default)s")
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default=os.environ.get("RECOVERD_LOG_FORMAT") or "text",
        help="text, or json: one object per line with job, run, node, rank, epoch (default: $RECOVERD_LOG_FORMAT"
        " or %(default)s)",
    )


def setup(level: str = "INFO", fmt: str = "text") -> None:
    """Configure the root logger once for a process: ``fmt`` is ``text`` or ``json``."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, str(level).upper(), logging.INFO))
