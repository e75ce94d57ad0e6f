"""The JSON schemas of recoverctl's ``--json`` output (docs/recoverctl-schemas/), for tests to check
what recoverctl prints against."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "recoverctl-schemas"


def schemas() -> dict[str, dict[str, Any]]:
    """Every schema by name (``status`` for status.schema.json)."""
    return {path.name.removesuffix(".schema.json"): json.loads(path.read_text()) for path in SCHEMAS.glob("*.json")}


def check(name: str, data: Any) -> Any:
    """``data`` if it matches NAME.schema.json; an assertion listing every mismatch otherwise."""
    known = schemas()
    registry: Registry[Any] = Registry().with_resources(
        (schema["$id"], Resource.from_contents(schema)) for schema in known.values()
    )
    validator = Draft202012Validator(known[name], registry=registry)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(data)]
    assert not errors, f"{name}: {len(errors)} schema error(s):\n" + "\n".join(errors)
    return data
