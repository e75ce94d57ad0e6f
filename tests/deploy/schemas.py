"""Strict, offline validation of Kubernetes objects and of the compose file.

* **Core kinds** (Deployment, StatefulSet, Service, NetworkPolicy, ...): kubernetes-validate with
  Kubernetes 1.37's OpenAPI schemas, strict (an unknown field is an error, as with
  ``kubectl apply --validate=strict``).
* **CRD kinds** (cert-manager's Issuer and Certificate, Kubeflow's PyTorchJob, JobSet): the CRDs'
  own schemas, vendored in schemas/crds/ (tests/deploy/README.md says from where), made strict the
  same way (``additionalProperties: false`` wherever the CRD lists properties and does not keep
  unknown fields). Their metadata is checked as core ObjectMeta, and the pod and job templates they
  embed are checked again as core objects, against 1.37.
* A kind with no schema is an error, never skipped.

Not checked (no cluster): CEL rules (``x-kubernetes-validations``), admission webhooks, and what
needs other objects to exist; test_kubernetes.py checks the references between our own objects.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

__all__ = ["KUBERNETES_VERSION", "ManifestError", "compose_errors", "crd_kinds", "validate_object"]

KUBERNETES_VERSION = "1.37"
_HERE = Path(__file__).parent
_CRD_DIR = _HERE / "schemas" / "crds"
_COMPOSE_SCHEMA = _HERE / "schemas" / "compose-spec.json"


class ManifestError(AssertionError):
    """An object its schema refuses, or one with no schema at all."""


def _strict(node: Any) -> Any:
    if isinstance(node, dict):
        out = {key: _strict(value) for key, value in node.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(value) for value in node]
    return node


@cache
def _crd_validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    validators: dict[tuple[str, str], jsonschema.protocols.Validator] = {}
    for path in sorted(_CRD_DIR.glob("*.json")):
        schema = json.loads(path.read_text())
        key = (schema["x-recoverd-api-version"], schema["x-recoverd-kind"])
        # OpenAPI v3.0 schemas: draft 4's keywords.
        validators[key] = jsonschema.Draft4Validator(_strict(schema))
    return validators


def crd_kinds() -> set[tuple[str, str]]:
    """(apiVersion, kind) of every vendored CRD schema."""
    return set(_crd_validators())


def _name(obj: dict[str, Any]) -> str:
    return f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"


def _core(obj: dict[str, Any], where: str) -> None:
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError as err:
        kind = f"{obj.get('apiVersion')} {obj.get('kind')}"
        raise ManifestError(f"{where}: no schema for {kind}: {err.message}") from None
    except kubernetes_validate.ValidationError as err:
        path = ".".join(str(part) for part in err.absolute_path) or "(top)"
        raise ManifestError(f"{where}: {path}: {err.message}") from None


def _embedded(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The core objects a CRD object carries, wrapped so that their core schema applies."""
    name = {"name": obj["metadata"]["name"]}
    if obj["kind"] == "PyTorchJob":
        for replica, spec in obj["spec"]["pytorchReplicaSpecs"].items():
            yield (
                f"spec.pytorchReplicaSpecs.{replica}.template",
                {"apiVersion": "v1", "kind": "PodTemplate", "metadata": name, "template": spec["template"]},
            )
    elif obj["kind"] == "JobSet":
        for index, job in enumerate(obj["spec"]["replicatedJobs"]):
            meta = {**name, **(job["template"].get("metadata") or {})}
            yield (
                f"spec.replicatedJobs.{index}.template",
                {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job["template"]["spec"]},
            )


def validate_object(obj: dict[str, Any], source: str) -> str:
    """Raise :class:`ManifestError` unless ``obj`` is valid; return what it was checked against."""
    where = f"{source}: {_name(obj)}"
    validator = _crd_validators().get((obj.get("apiVersion", ""), obj.get("kind", "")))
    if validator is None:
        _core(obj, where)
        return f"Kubernetes {KUBERNETES_VERSION} (strict)"
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        path = ".".join(str(part) for part in first.absolute_path) or "(top)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ManifestError(f"{where}: {path}: {first.message}{more}")
    # ObjectMeta is only `type: object` in a CRD: check it as core metadata.
    _core({"apiVersion": "v1", "kind": "ConfigMap", "metadata": copy.deepcopy(obj["metadata"])}, f"{where} metadata")
    embedded = list(_embedded(obj))
    for path, core in embedded:
        _core(core, f"{where} {path}")
    extra = f" + {len(embedded)} embedded template(s) as Kubernetes {KUBERNETES_VERSION}" if embedded else ""
    return f"its CRD's schema (strict){extra}"


@cache
def _compose_validator() -> jsonschema.protocols.Validator:
    schema = json.loads(_COMPOSE_SCHEMA.read_text())
    return jsonschema.Draft7Validator(schema)


def compose_errors(document: dict[str, Any]) -> list[str]:
    """Every error of a compose file (as loaded: anchors and merges resolved) against the spec."""
    return [
        f"{'.'.join(str(p) for p in err.absolute_path) or '(top)'}: {err.message}"
        for err in sorted(_compose_validator().iter_errors(document), key=lambda e: list(e.absolute_path))
    ]
