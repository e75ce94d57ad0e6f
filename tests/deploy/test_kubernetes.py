"""deploy/kubernetes, checked without a cluster: rendered, validated strictly, cross-referenced, and
its recoverd command lines parsed by recoverd's CLI (tests/deploy/README.md)."""

from __future__ import annotations

import copy
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from recoverd import etcd_security
from recoverd.cli import adopt
from tests.deploy.commands import agent_identities, check_recoverd_argv, expand_kubernetes, readme_auth_users
from tests.deploy.kustomize import Unsupported, load_documents, object_id, render
from tests.deploy.manifests import KUBERNETES, Found, all_objects, distinct, example_files, pod_specs
from tests.deploy.schemas import ManifestError, crd_kinds, validate_object

OVERLAYS = ("in-cluster-etcd", "external-etcd")
METRICS_PORT = 9464
#: What the training operator adds to every PyTorchJob pod's environment (examples/pytorchjob.yaml).
PYTORCHJOB_ENV = {
    "MASTER_ADDR": "train-master-0",
    "MASTER_PORT": "23456",
    "PET_NNODES": "2",
    "PET_NODE_RANK": "1",
    "PET_NPROC_PER_NODE": "8",
    "WORLD_SIZE": "16",
    "RANK": "1",
}
#: A value for each downward-API field the examples read.
FIELD_VALUES = {
    "metadata.annotations['batch.kubernetes.io/job-completion-index']": "1",
    "metadata.name": "train-1",
    "spec.nodeName": "node-a",
}


def _validate_all(found: list[Found]) -> list[str]:
    """Every distinct object validated; the errors, all of them (empty: all valid)."""
    errors: list[str] = []
    for item in distinct(found):
        try:
            validate_object(item.obj, item.source)
        except ManifestError as err:
            errors.append(str(err))
    return errors


def _by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels and the In operator, all we use) against a pod's labels."""
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        assert expression["operator"] == "In", f"selector operator {expression['operator']} not handled here"
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


# ------------------------------------------------------------------------------------ rendering


def test_overlays_render_the_control_plane() -> None:
    inside = render(KUBERNETES / "overlays" / "in-cluster-etcd")
    outside = render(KUBERNETES / "overlays" / "external-etcd")
    for objects in (inside, outside):
        assert {obj["metadata"].get("namespace") for obj in objects} == {"recoverd"}
        deployments = {obj["metadata"]["name"]: obj for obj in _by_kind(objects, "Deployment")}
        assert set(deployments) == {"recoverd-coordinator", "recoverd-strategy", "recoverd-gateway"}
        assert deployments["recoverd-coordinator"]["spec"]["replicas"] == 2
        pdbs = [pdb["metadata"]["name"] for pdb in _by_kind(objects, "PodDisruptionBudget")]
        assert "recoverd-coordinator" in pdbs
        gateway = next(svc for svc in _by_kind(objects, "Service") if svc["metadata"]["name"] == "recoverd-gateway")
        assert [port["port"] for port in gateway["spec"]["ports"]] == [8899]
        assert len(_by_kind(objects, "NetworkPolicy")) >= 2
        config = _by_kind(objects, "ConfigMap")[0]["data"]
        assert all(url.startswith("https://") for url in config["RECOVERD_ETCD"].split(",")), "TLS only"
    (etcd,) = _by_kind(inside, "StatefulSet")
    assert etcd["spec"]["replicas"] == 3
    args = etcd["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--client-cert-auth" in args and "--peer-client-cert-auth" in args
    assert not _by_kind(outside, "StatefulSet"), "external-etcd must not start an etcd"
    assert "example.internal" in _by_kind(outside, "ConfigMap")[0]["data"]["RECOVERD_ETCD"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (and its built-in kustomize) not on PATH")
def test_renderer_agrees_with_kubectl_kustomize() -> None:
    for directory in sorted(path.parent for path in KUBERNETES.rglob("kustomization.yaml")):
        out = subprocess.run(
            ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, check=True, timeout=30
        ).stdout
        theirs = {object_id(obj): obj for obj in yaml.safe_load_all(out) if obj}
        ours = {object_id(obj): obj for obj in render(directory)}
        assert ours == theirs, f"{directory}: the test renderer and kubectl kustomize disagree"


def test_renderer_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {k: v}\n")
    (tmp_path / "kustomization.yaml").write_text("resources: [cm.yaml]\ncommonLabels: {a: b}\n")
    with pytest.raises(Unsupported, match="commonLabels"):
        render(tmp_path)
    (tmp_path / "patch.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {k: [1]}\n")
    (tmp_path / "kustomization.yaml").write_text("resources: [cm.yaml]\npatches: [{path: patch.yaml}]\n")
    with pytest.raises(Unsupported, match="a list in a patch"):
        render(tmp_path)


# ----------------------------------------------------------------------------------- validation


def test_every_manifest_is_valid() -> None:
    """Core kinds against Kubernetes 1.37 (strict); CRD kinds against their vendored CRD schemas
    and their embedded pod templates again as core objects. No kind is left unchecked."""
    found = all_objects()
    kinds = {(item.obj["apiVersion"], item.obj["kind"]) for item in found}
    assert {("kubeflow.org/v1", "PyTorchJob"), ("jobset.x-k8s.io/v1alpha2", "JobSet")} <= kinds
    assert kinds & crd_kinds() == crd_kinds(), "a vendored CRD schema no manifest uses"
    assert _validate_all(found) == []


def _break(root: Path, relative: str, old: str, new: str) -> None:
    path = root / relative
    text = path.read_text()
    assert old in text, f"{relative} no longer contains {old!r}: update this test"
    path.write_text(text.replace(old, new, 1))


def test_a_broken_copy_is_refused(tmp_path: Path) -> None:
    """The same checks on a copy of deploy/kubernetes with one mistake per file."""
    root = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, root)
    # Core: an unknown field (a typo) and a wrong type, each in a rendered overlay.
    _break(root, "base/coordinator.yaml", "readOnly: true", "readonly: true")
    _break(root, "etcd/etcd.yaml", "replicas: 3", "replicas: three")
    # CRDs: a typo in the PyTorchJob's own fields, and one in a pod of the JobSet.
    _break(root, "examples/pytorchjob.yaml", "nprocPerNode:", "nprocsPerNode:")
    _break(root, "examples/jobset.yaml", "terminationGracePeriodSeconds:", "terminationGracePeriodSecond:")
    # A kind nobody has a schema for.
    (root / "examples" / "unknown.yaml").write_text("apiVersion: example.com/v1\nkind: Gadget\nmetadata: {name: g}\n")
    errors = "\n".join(_validate_all(all_objects(root)))
    assert "base/: Deployment/recoverd-coordinator: spec.template.spec.containers.0.volumeMounts.0:" in errors
    assert "'readonly' was unexpected" in errors
    assert "etcd/: StatefulSet/etcd: spec.replicas: 'three' is not of type 'integer'" in errors
    assert "PyTorchJob/train: spec: Additional properties are not allowed ('nprocsPerNode' was unexpected)" in errors
    assert "JobSet/train: spec.replicatedJobs.0.template.spec.template.spec: Additional properties" in errors
    assert "no schema for example.com/v1 Gadget" in errors


# ----------------------------------------------------------------------------------- references


def _pods(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(owner, pod metadata, pod spec) of every pod the objects make."""
    return [
        (f"{obj['kind']}/{obj['metadata']['name']}", meta, spec) for obj in objects for meta, spec in pod_specs(obj)
    ]


def _claims(objects: list[dict[str, Any]], owner: str) -> list[dict[str, Any]]:
    """A StatefulSet's volumeClaimTemplates: volumes of its pods too."""
    kind, _, name = owner.partition("/")
    return [
        claim
        for obj in objects
        if obj["kind"] == kind == "StatefulSet" and obj["metadata"]["name"] == name
        for claim in obj["spec"].get("volumeClaimTemplates") or []
    ]


def _scopes() -> list[tuple[str, list[dict[str, Any]]]]:
    """What is applied together: each overlay with cert-manager/, and with the example jobs."""
    certificates = render(KUBERNETES / "cert-manager")
    examples = [doc for path in example_files() for doc in load_documents(path)]
    return [(overlay, render(KUBERNETES / "overlays" / overlay) + certificates + examples) for overlay in OVERLAYS]


def _env_of(container: dict[str, Any], objects: list[dict[str, Any]], owner: str) -> dict[str, str]:
    """The container's environment as the kubelet builds it (envFrom first, then env)."""
    env: dict[str, str] = dict(PYTORCHJOB_ENV) if owner.startswith("PyTorchJob/") else {}
    config_maps = {cm["metadata"]["name"]: cm.get("data") or {} for cm in _by_kind(objects, "ConfigMap")}
    for source in container.get("envFrom") or []:
        name = source["configMapRef"]["name"]
        assert name in config_maps, f"{owner}: envFrom names ConfigMap {name!r}, which is not deployed"
        env.update(config_maps[name])
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = expand_kubernetes(var["value"], env, owner)
        else:
            env[var["name"]] = FIELD_VALUES[var["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def _check_selectors(scope: str, objects: list[dict[str, Any]]) -> None:
    pod_labels = [meta.get("labels") or {} for _, meta, _ in _pods(objects)]
    for obj in objects:
        spec = obj.get("spec") or {}
        name = f"{scope}: {obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
            labels = spec["template"]["metadata"]["labels"]
            assert _selects(spec["selector"], labels), f"{name}: its selector misses its own pods"
        if obj["kind"] in ("PodDisruptionBudget", "NetworkPolicy"):
            selector = spec.get("podSelector") or spec["selector"]
            assert any(_selects(selector, labels) for labels in pod_labels), f"{name} selects no pod"
        if obj["kind"] == "Service":
            selector = {"matchLabels": spec["selector"]}
            assert any(_selects(selector, labels) for labels in pod_labels), f"{name} selects no pod"


def _check_pod(
    scope: str, owner: str, meta: dict[str, Any], pod: dict[str, Any], objects: list[dict[str, Any]]
) -> None:
    where = f"{scope}: {owner}"
    secrets = {cert["spec"]["secretName"] for cert in _by_kind(objects, "Certificate")}
    for volume in pod.get("volumes") or []:
        if "secret" in volume:
            assert volume["secret"]["secretName"] in secrets, f"{where}: no Certificate makes its Secret"
    volumes = {volume["name"] for volume in pod.get("volumes") or []}
    volumes |= {claim["metadata"]["name"] for claim in _claims(objects, owner)}
    for container in pod["containers"]:
        env = _env_of(container, objects, owner)
        mounts = [mount["mountPath"] for mount in container.get("volumeMounts") or []]
        assert {mount["name"] for mount in container.get("volumeMounts") or []} <= volumes, where
        ports = {port.get("name"): port["containerPort"] for port in container.get("ports") or []}
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if probe in container:
                port = container[probe]["httpGet"]["port"]
                assert port in ports, f"{where}: {probe} on port {port!r}, which the container lacks"
        if "RECOVERD_ETCD" not in env:
            continue
        # A recoverd process: the TLS files are mounted, its metrics port is declared (where the
        # probes go; recoverd adopt has none, so no probe), and a label lets it through the
        # NetworkPolicy to etcd.
        tls_vars = ("RECOVERD_ETCD_CACERT", "RECOVERD_ETCD_CERT", "RECOVERD_ETCD_KEY")
        for var in tls_vars + tuple(v for v in ("RECOVERD_RANK_ETCD_CERT", "RECOVERD_RANK_ETCD_KEY") if v in env):
            assert any(env[var].startswith(path + "/") for path in mounts), f"{where}: {var} not mounted"
        if "recoverd adopt" in " ".join(container.get("command") or []):
            assert not ports and not any(probe in container for probe in ("livenessProbe", "readinessProbe")), where
        else:
            assert ports.get("metrics") == int(env["RECOVERD_METRICS_PORT"]), f"{where}: metrics port"
            assert "readinessProbe" in container, f"{where}: no readiness probe on /readyz"
        labels = meta.get("labels") or {}
        assert labels.get("recoverd.io/client") == "true" or labels.get("app.kubernetes.io/part-of") == "recoverd", (
            f"{where}: the NetworkPolicy keeps it from etcd"
        )


def test_objects_reference_each_other_correctly() -> None:
    """What the schemas cannot see: selectors, volumes, ports, Secrets, ConfigMaps and TLS files
    that must match between objects."""
    for scope, objects in _scopes():
        _check_selectors(scope, objects)
        for owner, meta, pod in _pods(objects):
            _check_pod(scope, owner, meta, pod, objects)


def test_recoverd_command_lines_parse() -> None:
    """Each container that runs recoverd: its arguments, with $(VAR) expanded, parsed by recoverd's
    own CLI (the agent's settings included), as at the container's start."""
    seen: set[str] = set()
    for scope, objects in _scopes():
        for owner, _, pod in _pods(objects):
            for container in pod["containers"]:
                env = _env_of(container, objects, owner)
                where = f"{scope}: {owner}"
                if container.get("command") == ["recoverd"] or container["image"].startswith("recoverd:"):
                    argv = [expand_kubernetes(arg, env, where) for arg in container.get("args") or []]
                    seen.add(check_recoverd_argv(argv, where))
                elif container["command"][:2] == ["bash", "-c"] and "recoverd adopt" in container["command"][2]:
                    argv = ["adopt", *(expand_kubernetes(a, env, where) for a in container["args"]), "--pids", "1"]
                    seen.add(check_recoverd_argv(argv, where))
    assert seen == {"coordinator", "strategy", "gateway", "agent", "adopt"}


# ------------------------------------------------------------------------- the adopt DaemonSet


def _daemonset_container() -> dict[str, Any]:
    (obj,) = load_documents(KUBERNETES / "examples" / "adopt-daemonset.yaml")
    assert obj["spec"]["template"]["spec"]["hostPID"] is True
    assert obj["spec"]["updateStrategy"]["type"] == "OnDelete", "an update would stop the node's ranks"
    return copy.deepcopy(obj["spec"]["template"]["spec"]["containers"][0])


_FAKE_RECOVERD = """#!/bin/sh
# Stands in for recoverd: records its arguments, says it started, then exits with $FAKE_STATUS
# (or 0 at SIGTERM, as recoverd adopt does when the launcher says training finished).
printf '%s\\n' "$@" > "$HANDOFF/argv"
trap 'exit 0' TERM
echo started
if [ "$FAKE_STATUS" = wait ]; then while :; do sleep 0.05; done; fi
exit "$FAKE_STATUS"
"""


def _run_handoff(tmp_path: Path, status: str) -> tuple[subprocess.Popen[str], Path]:
    container = _daemonset_container()
    handoff = tmp_path / "handoff"
    handoff.mkdir(exist_ok=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "recoverd"
    fake.write_text(_FAKE_RECOVERD)
    fake.chmod(0o755)
    (handoff / "status").write_text("7\n")  # the last run's: removed when the new run starts
    (handoff / "pids").write_text("4242 4243\n")
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "HANDOFF": str(handoff),
        "FAKE_STATUS": status,
    }
    proc = subprocess.Popen([*container["command"], *container["args"]], env=env, stdout=subprocess.PIPE, text=True)
    return proc, handoff


def test_adopt_daemonset_hands_pids_over_and_the_outcome_back(tmp_path: Path) -> None:
    proc, handoff = _run_handoff(tmp_path, "1")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1 and out == "started\n"
    assert (handoff / "status").read_text() == "1\n"
    assert not (handoff / "pids").exists(), "the PIDs are taken once"
    argv = (handoff / "argv").read_text().splitlines()
    assert argv[0] == "adopt" and argv[-3:] == ["--pids", "4242", "4243"]
    assert check_recoverd_argv(argv, "adopt-daemonset.yaml") == "adopt"


def test_adopt_daemonset_passes_sigterm_on(tmp_path: Path) -> None:
    proc, handoff = _run_handoff(tmp_path, "wait")
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "started\n"
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, "SIGTERM reached recoverd adopt, which ended the job's run with 0"
    assert (handoff / "status").read_text() == "0\n"


def test_every_example_is_job_train() -> None:
    """The examples are alternatives for one job: the Secrets recoverd-etcd-client-train (its
    agents) and recoverd-etcd-rank-train (its ranks) are its."""
    for path in example_files():
        for doc in load_documents(path):
            for _, pod in pod_specs(doc):
                secrets = [v["secret"]["secretName"] for v in pod.get("volumes") or [] if "secret" in v]
                assert secrets[:1] == ["recoverd-etcd-client-train"], path.name
                assert set(secrets) <= {"recoverd-etcd-client-train", "recoverd-etcd-rank-train"}, path.name


def _common_name(path: str, container: dict[str, Any], pod: dict[str, Any], objects: list[dict[str, Any]]) -> str:
    """The CN of the Certificate behind a TLS file's path in a container (mount -> Secret)."""
    mounts = {mount["mountPath"]: mount["name"] for mount in container.get("volumeMounts") or []}
    folder, _, _ = path.rpartition("/")
    secret = next(v["secret"]["secretName"] for v in pod["volumes"] if v["name"] == mounts[folder])
    (certificate,) = [c for c in _by_kind(objects, "Certificate") if c["spec"]["secretName"] == secret]
    return str(certificate["spec"]["commonName"])


def test_agents_give_their_ranks_the_jobs_client_identity() -> None:
    """Ranks act as job train's client user (CN recoverd-client-train), never as its agent: each
    example that runs `recoverd agent`, as recoverd resolves its flags and environment, hands its
    ranks a certificate of their own, from a Secret whose Certificate has that CN (and whose user
    deploy/README.md makes), and does not warn that they act as it (docs/security.md, "Ranks")."""
    users = readme_auth_users()
    for scope, objects in _scopes():
        agents = set()
        for owner, _, pod in _pods(objects):
            for container in pod["containers"]:
                if (container.get("args") or [""])[0] != "agent":
                    continue
                where = f"{scope}: {owner}"
                env = _env_of(container, objects, owner)
                argv = [expand_kubernetes(arg, env, where) for arg in container["args"]]
                found = agent_identities(argv, env, where)
                agent, ranks = found.agent, found.ranks
                assert found.warnings == [], f"{where}: {found.warnings}"
                assert ranks.cert and ranks.key and ranks.user is None, f"{where}: no certificate of the ranks' own"
                assert {ranks.cert, ranks.key}.isdisjoint({agent.cert, agent.key}), f"{where}: ranks get the agent's"
                assert ranks.cacert == agent.cacert
                assert ranks.cert.endswith("/tls.crt") and ranks.key == ranks.cert.removesuffix("tls.crt") + "tls.key"
                for role, identity in (("agent", agent), ("client", ranks)):
                    common_name = _common_name(str(identity.cert), container, pod, objects)
                    assert common_name == f"recoverd-{role}-{found.job}", f"{where}: {role} as {common_name}"
                    assert (found.job, role, common_name) in users, f"deploy/README.md makes no user {common_name}"
                agents.add(owner)
        assert agents == {"Job/train", "PyTorchJob/train", "JobSet/train"}, scope


def test_the_adopt_daemonset_gives_the_ranks_it_restarts_the_jobs_client_identity() -> None:
    """`recoverd adopt` hands the ranks it restarts job train's client certificate, as an agent does:
    resolved by adopt's own parser from the DaemonSet's environment (docs/security.md, "Ranks")."""
    for scope, objects in _scopes():
        for owner, _, pod in _pods(objects):
            for container in pod["containers"]:
                if "recoverd adopt" not in " ".join(container.get("command") or []):
                    continue
                env = _env_of(container, objects, owner)
                with mock.patch.dict(os.environ, env, clear=True):
                    args = adopt.build_parser().parse_args(["--pids", "1"])
                with mock.patch.object(etcd_security, "_read_pem", lambda flag, path: b""):
                    agent = etcd_security.from_args(args, env)
                    ranks = etcd_security.ranks_from_args(args, agent)
                where = f"{scope}: {owner}"
                assert etcd_security.rank_identity_problem(agent, ranks, "train") is None, where
                assert ranks.cert and ranks.cert != agent.cert, f"{where}: ranks get the adopter's certificate"
                assert _common_name(str(agent.cert), container, pod, objects) == "recoverd-agent-train"
                assert _common_name(str(ranks.cert), container, pod, objects) == "recoverd-client-train"
