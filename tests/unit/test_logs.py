"""--log-format json: one object per line, with the job/run/node/rank/epoch known where it is logged."""

from __future__ import annotations

import asyncio
import json
import logging
import sys

import pytest

from recoverd import logs


def _line(record: logging.LogRecord) -> dict[str, object]:
    return json.loads(logs.JsonFormatter().format(record))  # type: ignore[no-any-return]


def _record(message: str = "rank %d failed", *args: object, **extra: object) -> logging.LogRecord:
    args = args or ((3,) if "%" in message else ())
    record = logging.LogRecord("recoverd.agent", logging.WARNING, __file__, 1, message, args, None)
    record.__dict__.update(extra)
    return record


def test_a_line_has_time_level_logger_message_and_no_unknown_fields() -> None:
    line = _line(_record())
    assert line["level"] == "WARNING" and line["logger"] == "recoverd.agent" and line["message"] == "rank 3 failed"
    assert str(line["time"]).endswith("+00:00")
    assert not set(logs.FIELDS) & set(line)


def test_bound_fields_reach_the_task_and_its_children_and_extra_wins() -> None:
    async def go() -> list[dict[str, object]]:
        logs.bind(job="j", node="n0")
        lines = [_line(_record())]

        async def child() -> None:
            with logs.bound(run="r1", epoch=4):
                lines.append(_line(_record(rank=7)))
            lines.append(_line(_record()))

        await asyncio.create_task(child())
        return lines

    first, inner, after = asyncio.run(go())
    assert (first["job"], first["node"]) == ("j", "n0") and "run" not in first
    assert (inner["run"], inner["epoch"], inner["rank"], inner["job"]) == ("r1", 4, 7, "j")
    assert "run" not in after


def test_an_exception_is_one_field_of_the_same_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = _record("failed")
        record.exc_info = sys.exc_info()
    assert "ValueError: boom" in str(_line(record)["exception"])


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="one of text, json"):
        logs.setup("INFO", "xml")
