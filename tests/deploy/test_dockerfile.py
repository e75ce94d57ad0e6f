"""deploy/docker/Dockerfile, checked without a Docker engine: what it must contain, and its
HEALTHCHECK command run for real against a local /healthz."""

from __future__ import annotations

import http.server
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tests.deploy.manifests import DEPLOY

DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
DOCKERIGNORE = DEPLOY / "docker" / "Dockerfile.dockerignore"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        pending += " " + stripped.removesuffix("\\") if pending else stripped.removesuffix("\\")
        if not stripped.endswith("\\"):
            keyword, _, rest = pending.partition(" ")
            out.append((keyword.upper(), rest.strip()))
            pending = ""
    return out


def _final_stage() -> list[tuple[str, str]]:
    instructions = _instructions()
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def _healthcheck_argv() -> list[str]:
    (args,) = [rest for keyword, rest in _final_stage() if keyword == "HEALTHCHECK"]
    command = args[args.index("CMD ") + len("CMD ") :]
    argv = json.loads(command)  # exec form: no shell in the command
    assert argv[0] == "python"
    return [sys.executable, *argv[1:]]


def test_image_is_slim_non_root_and_installs_the_wheel() -> None:
    instructions = _instructions()
    stages = [rest for keyword, rest in instructions if keyword == "FROM"]
    assert all(stage.split()[0] == "python:3.11-slim" for stage in stages), stages
    runs = [rest for keyword, rest in instructions if keyword == "RUN"]
    assert any("pip wheel" in run for run in runs), "the build stage makes the wheel"
    final = _final_stage()
    final_runs = [rest for keyword, rest in final if keyword == "RUN"]
    assert any("pip install" in run and ".whl" in run and "[etcd]" in run for run in final_runs)
    assert not any(rest.startswith(". ") for keyword, rest in final if keyword == "COPY"), "no source tree"
    (user,) = [rest for keyword, rest in final if keyword == "USER"]
    assert user.split(":")[0] not in ("0", "root"), user
    env = " ".join(rest for keyword, rest in final if keyword == "ENV")
    assert "RECOVERD_METRICS_PORT=9464" in env
    (expose,) = [rest for keyword, rest in final if keyword == "EXPOSE"]
    assert set(expose.split()) == {"9464", "8899"}
    (entrypoint,) = [rest for keyword, rest in final if keyword == "ENTRYPOINT"]
    assert json.loads(entrypoint)[-1] == "recoverd"
    ignored = DOCKERIGNORE.read_text().split()
    assert {".git", ".venv", "deploy/certs"} <= set(ignored), "keys and environments stay out of the context"


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def _server(status: int) -> Iterator[int]:
    handler = type("Handler", (_Health,), {"status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _check(port: int) -> int:
    env = {**os.environ, "RECOVERD_METRICS_PORT": str(port)}
    return subprocess.run(_healthcheck_argv(), env=env, capture_output=True, timeout=30).returncode


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_healthcheck_command_asks_healthz() -> None:
    """0 when /healthz answers 200; 1 (Docker's "unhealthy") on an error status or no answer."""
    with _server(200) as port:
        assert _check(port) == 0, shlex.join(_healthcheck_argv())
    with _server(503) as port:
        assert _check(port) == 1
    assert _check(_closed_port()) == 1
