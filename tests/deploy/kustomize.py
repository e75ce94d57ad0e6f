"""Render deploy/kubernetes's kustomizations without the kustomize binary.

Only the part of kustomize those files use: ``resources`` (files, and folders holding a
kustomization.yaml), ``namespace``, and ``patches`` given by ``path`` whose documents merge
maps into one existing object. Anything else (commonLabels, generators, lists in a patch,
``$patch`` directives, ...) raises :class:`Unsupported` rather than being rendered differently
from kustomize: a kustomization that grows past this subset fails the tests until the renderer
learns it. Where ``kubectl`` is installed, tests/deploy/test_kubernetes.py compares this output
with ``kubectl kustomize``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

__all__ = ["CLUSTER_SCOPED", "Unsupported", "load_documents", "object_id", "render"]

#: libyaml's loader where PyYAML has it (about 10 times faster), the same documents either way.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

#: Kinds kustomize leaves without a namespace (the ones a recoverd kustomization could meet).
CLUSTER_SCOPED = frozenset(
    {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "PersistentVolume",
        "PriorityClass",
        "StorageClass",
        "ClusterIssuer",
    }
)
#: Kinds whose namespace kustomize also rewrites inside the object (subjects): not handled here.
_REFERENCING_NAMESPACES = frozenset({"RoleBinding", "ClusterRoleBinding"})
_FIELDS = frozenset({"apiVersion", "kind", "resources", "namespace", "patches"})


class Unsupported(ValueError):
    """The kustomization uses kustomize beyond what this renderer does."""


def object_id(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    """(group, kind, namespace, name): what kustomize tells resources apart by."""
    group = obj["apiVersion"].rpartition("/")[0]
    meta = obj.get("metadata") or {}
    return group, obj["kind"], meta.get("namespace", ""), meta["name"]


def load_documents(path: Path) -> list[Any]:
    """The YAML documents of a file, empty ones left out."""
    return [doc for doc in yaml.load_all(path.read_text(), Loader=_LOADER) if doc is not None]


def _documents(path: Path) -> list[dict[str, Any]]:
    docs = load_documents(path)
    for doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            raise Unsupported(f"{path}: every document must be a Kubernetes object (apiVersion, kind)")
    return docs


def _merge(target: dict[str, Any], patch: dict[str, Any], where: str) -> None:
    """Strategic merge of maps only: keys of ``patch`` replace or recurse into ``target``'s."""
    for key, value in patch.items():
        if key.startswith("$"):
            raise Unsupported(f"{where}: patch directive {key!r}")
        if isinstance(value, list):
            # kustomize merges some lists by key (containers by name, ...): not reproduced here.
            raise Unsupported(f"{where}: a list in a patch ({key!r})")
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value, f"{where}.{key}")
        elif value is None:
            target.pop(key, None)
        else:
            target[key] = copy.deepcopy(value)


def _apply_patch(objects: list[dict[str, Any]], patch_file: Path) -> None:
    for patch in _documents(patch_file):
        wanted = object_id(patch)[:2] + object_id(patch)[3:]
        targets = [obj for obj in objects if object_id(obj)[:2] + object_id(obj)[3:] == wanted]
        if len(targets) != 1:
            raise Unsupported(f"{patch_file}: the patch of {wanted} matches {len(targets)} objects, not 1")
        body = {key: value for key, value in patch.items() if key not in ("apiVersion", "kind")}
        body["metadata"] = {k: v for k, v in (body.get("metadata") or {}).items() if k != "name"}
        _merge(targets[0], body, f"{patch_file.name}")


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects ``kustomize build directory`` gives, in resource order (kustomize sorts by kind).

    Raises :class:`Unsupported` for a kustomization this renderer cannot reproduce, and for two
    objects with one id (kustomize refuses those too).
    """
    kustomization_file = directory / "kustomization.yaml"
    kustomization = yaml.load(kustomization_file.read_text(), Loader=_LOADER)
    unknown = set(kustomization) - _FIELDS
    if unknown:
        raise Unsupported(f"{kustomization_file}: fields {sorted(unknown)}")
    objects: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        objects.extend(render(path) if path.is_dir() else _documents(path))
    for patch in kustomization.get("patches", []):
        if set(patch) != {"path"}:
            raise Unsupported(f"{kustomization_file}: a patch other than {{path: FILE}}: {patch}")
        _apply_patch(objects, directory / patch["path"])
    namespace = kustomization.get("namespace")
    if namespace:
        for obj in objects:
            if obj["kind"] in _REFERENCING_NAMESPACES:
                raise Unsupported(f"{kustomization_file}: namespace with a {obj['kind']}")
            if obj["kind"] not in CLUSTER_SCOPED:
                obj.setdefault("metadata", {})["namespace"] = namespace
    seen: set[tuple[str, str, str, str]] = set()
    for obj in objects:
        key = object_id(obj)
        if key in seen:
            raise Unsupported(f"{kustomization_file}: {key} twice")
        seen.add(key)
    return objects
