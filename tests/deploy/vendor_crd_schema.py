"""Vendor a CustomResourceDefinition's schema for tests/deploy: ``openAPIV3Schema`` of one version,
without its ``description`` texts (which are most of a CRD's size), as compact JSON.

    python tests/deploy/vendor_crd_schema.py CRD.yaml VERSION SOURCE OUT.json

SOURCE (where CRD.yaml came from: repository, commit, path) is kept in the file's ``$comment``. Run
by hand when a CRD is updated; the tests only read the result (tests/deploy/README.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

__all__ = ["strip_descriptions", "vendor"]


def strip_descriptions(node: Any) -> Any:
    """The schema without ``description`` keys; everything that validates is kept."""
    if isinstance(node, dict):
        return {key: strip_descriptions(value) for key, value in node.items() if key != "description"}
    if isinstance(node, list):
        return [strip_descriptions(value) for value in node]
    return node


def vendor(crd_path: Path, version: str, source: str) -> dict[str, Any]:
    crd = yaml.safe_load(crd_path.read_text())
    if crd.get("kind") != "CustomResourceDefinition":
        raise ValueError(f"{crd_path} is a {crd.get('kind')}, not a CustomResourceDefinition")
    names = crd["spec"]["names"]
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            schema = strip_descriptions(entry["schema"]["openAPIV3Schema"])
            group = crd["spec"]["group"]
            return {
                "$comment": f"{names['kind']} {group}/{version}: openAPIV3Schema of {source},"
                " descriptions removed (tests/deploy/vendor_crd_schema.py)",
                "x-recoverd-kind": names["kind"],
                "x-recoverd-api-version": f"{group}/{version}",
                **schema,
            }
    raise ValueError(f"{crd_path} has no version {version!r}")


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    crd_path, version, source, out = argv
    Path(out).write_text(json.dumps(vendor(Path(crd_path), version, source), separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
