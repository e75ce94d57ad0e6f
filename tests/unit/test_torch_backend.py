"""The trainer's backend choice (pure parsing; torch imported, no process group made)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (pip install -r requirements-torch.txt)")

from taskd_client.pytorch.group import parse_backend
from taskd_client.pytorch.trainer import BACKEND_ENV, default_backend


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("gloo", {"cpu": "gloo"}),
        ("NCCL", {"cuda": "nccl"}),
        ("cpu:gloo,cuda:nccl", {"cpu": "gloo", "cuda": "nccl"}),
        (" cuda:nccl , cpu:gloo ", {"cuda": "nccl", "cpu": "gloo"}),
        ("cuda:gloo", {"cuda": "gloo"}),
    ],
)
def test_backends_per_device(spec: str, expected: dict[str, str]) -> None:
    assert parse_backend(spec) == expected


@pytest.mark.parametrize("spec", ["mpi", "cpu:nccl,cpu:gloo", "tpu:gloo", "cpu:", "", ","])
def test_a_bad_backend_is_refused_with_the_reason(spec: str) -> None:
    with pytest.raises(ValueError, match="backend"):
        parse_backend(spec)


def test_the_default_follows_the_environment_then_the_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setenv(BACKEND_ENV, "cpu:gloo,cuda:nccl")
    assert default_backend() == "cpu:gloo,cuda:nccl"
    monkeypatch.setenv(BACKEND_ENV, "smoke-signals")
    with pytest.raises(ValueError, match="smoke-signals"):
        default_backend()
    monkeypatch.delenv(BACKEND_ENV)
    assert default_backend() == ("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
