"""What tests/deploy checks: every object under deploy/kubernetes, rendered as it is applied.

The kustomizations are rendered (tests/deploy/kustomize.py); the examples are plain files applied
with ``kubectl apply -f``. Each object comes with where it was found.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.deploy.kustomize import load_documents, render

__all__ = [
    "DEPLOY",
    "KUBERNETES",
    "Found",
    "all_objects",
    "distinct",
    "example_files",
    "kustomization_dirs",
    "pod_specs",
]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBERNETES = DEPLOY / "kubernetes"


@dataclass(frozen=True)
class Found:
    source: str  # the kustomization folder or the file, relative to deploy/kubernetes
    obj: dict[str, Any]


def kustomization_dirs(root: Path = KUBERNETES) -> list[Path]:
    return sorted(path.parent for path in root.rglob("kustomization.yaml"))


def example_files(root: Path = KUBERNETES) -> list[Path]:
    return sorted((root / "examples").glob("*.yaml"))


def all_objects(root: Path = KUBERNETES) -> list[Found]:
    """Every object of every kustomization and example file (an object in two overlays twice)."""
    found: list[Found] = []
    for directory in kustomization_dirs(root):
        found += [Found(f"{directory.relative_to(root)}/", obj) for obj in render(directory)]
    for path in example_files(root):
        found += [Found(str(path.relative_to(root)), doc) for doc in load_documents(path)]
    return found


def distinct(found: list[Found]) -> list[Found]:
    """One of each object, whatever its namespace (base objects in base/ and in both overlays):
    a schema does not look at the namespace's value."""
    seen: set[str] = set()
    out: list[Found] = []
    for item in found:
        meta = {k: v for k, v in (item.obj.get("metadata") or {}).items() if k != "namespace"}
        key = json.dumps({**item.obj, "metadata": meta}, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


def pod_specs(obj: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod template metadata, pod spec) of every pod an object makes."""
    kind, spec = obj["kind"], obj.get("spec") or {}
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"):
        templates = [spec["template"]]
    elif kind == "PyTorchJob":
        templates = [replica["template"] for replica in spec["pytorchReplicaSpecs"].values()]
    elif kind == "JobSet":
        templates = [job["template"]["spec"]["template"] for job in spec["replicatedJobs"]]
    else:
        templates = []
    return [(template.get("metadata") or {}, template["spec"]) for template in templates]
