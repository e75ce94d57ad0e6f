"""The committed protobuf code is what `make proto` generates from proto/ (docs/adr/0004)."""

from __future__ import annotations

from pathlib import Path

import pytest

grpc_tools = pytest.importorskip("grpc_tools", reason="grpcio-tools is a dev dependency")
from grpc_tools import protoc  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GENERATED = [
    ("recoverd/v1/records.proto", ["recoverd/v1/records_pb2.py", "recoverd/v1/records_pb2.pyi"], False),
    (
        "recoverd/mindcluster/recover.proto",
        ["recoverd/mindcluster/recover_pb2.py", "recoverd/mindcluster/recover_pb2.pyi",
         "recoverd/mindcluster/recover_pb2_grpc.py"],
        True,
    ),
]  # fmt: skip


@pytest.mark.parametrize(("proto", "outputs", "with_grpc"), GENERATED, ids=[g[0] for g in GENERATED])
def test_committed_code_matches_the_proto(tmp_path: Path, proto: str, outputs: list[str], with_grpc: bool) -> None:
    include = str(Path(protoc.__file__).parent / "_proto")
    args = ["protoc", f"-I{ROOT / 'proto'}", f"-I{include}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}"]
    if with_grpc:
        args.append(f"--grpc_python_out={tmp_path}")
    assert protoc.main([*args, str(ROOT / "proto" / proto)]) == 0
    for output in outputs:
        fresh = (tmp_path / output).read_text()
        committed = (ROOT / "libs" / output).read_text()
        assert fresh == committed, f"libs/{output} is stale: run `make proto` and commit"
