"""flag > $RECOVERD_<FLAG> > --config file > default, validated with each flag's own type."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from recoverd import config
from recoverd.errors import ConfigError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recoverd coordinator")
    parser.add_argument("--fault-window", type=float, default=0.05)
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--no-hang-detection", action="store_true")
    parser.add_argument("--job", action="append", default=[])
    return parser


def _resolve(tmp_path: Path, text: str | None, env: dict[str, str], argv: list[str]) -> argparse.Namespace:
    parser = _parser()
    path = None
    if text is not None:
        path = tmp_path / "c.yaml"
        path.write_text(text)
    config.resolve(parser, "agent", config_path=str(path) if path else None, env=env, commands=("agent", "coordinator"))
    return parser.parse_args(argv)


def test_the_precedence_is_flag_env_file_default(tmp_path: Path) -> None:
    text = "fault-window: 0.2\nnproc-per-node: 8\nagent:\n  log-format: json\n"
    args = _resolve(tmp_path, text, {}, [])
    assert (args.fault_window, args.nproc_per_node, args.log_format) == (0.2, 8, "json")
    args = _resolve(tmp_path, text, {"RECOVERD_FAULT_WINDOW": "0.3"}, [])
    assert args.fault_window == 0.3
    args = _resolve(tmp_path, text, {"RECOVERD_FAULT_WINDOW": "0.3"}, ["--fault-window", "0.4"])
    assert args.fault_window == 0.4
    assert _resolve(tmp_path, None, {}, ["--nproc-per-node", "2"]).fault_window == 0.05


def test_a_command_section_wins_over_the_top_level_and_other_sections_are_ignored(tmp_path: Path) -> None:
    text = "fault-window: 0.2\nagent:\n  fault_window: 0.7\ncoordinator:\n  fault-window: 9\n"
    assert _resolve(tmp_path, text, {}, ["--nproc-per-node", "1"]).fault_window == 0.7


def test_switches_and_lists(tmp_path: Path) -> None:
    args = _resolve(tmp_path, "no-hang-detection: true\njob: [a, b]\n", {}, ["--nproc-per-node", "1"])
    assert args.no_hang_detection is True and args.job == ["a", "b"]
    env = {"RECOVERD_NO_HANG_DETECTION": "false", "RECOVERD_JOB": "x,y"}
    args = _resolve(tmp_path, None, env, ["--nproc-per-node", "1"])
    assert args.no_hang_detection is False and args.job == ["x", "y"]


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("fault-window: soon\n", {}, "--config .*: --fault-window: invalid value 'soon'"),
        ("log-format: xml\n", {}, "'xml' is not one of text, json"),
        ("bogus: 1\n", {}, "'bogus' is no flag of any recoverd command"),
        ("agent:\n  bogus: 1\n", {}, "agent.bogus: `recoverd agent` has no such flag"),
        ("agent: 3\n", {}, "the 'agent' section must be a mapping"),
        ("- a\n- b\n", {}, "expected a mapping"),
        ("a: [\n", {}, "not valid YAML"),
        ("fault-window: [1, 2]\n", {}, "takes one value"),
        ("no-hang-detection: maybe\n", {}, "takes true or false"),
        (None, {"RECOVERD_NPROC_PER_NODE": "many"}, r"\$RECOVERD_NPROC_PER_NODE: --nproc-per-node: invalid value"),
    ],
)
def test_every_bad_value_is_a_config_error_naming_its_source(
    tmp_path: Path, text: str | None, env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _resolve(tmp_path, text, env, [])


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        config.resolve(_parser(), "agent", config_path=str(tmp_path / "none.yaml"), env={})


def test_config_show_prints_each_flag_with_its_source(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("etcd: 127.0.0.1:2379\ncoordinator:\n  fault-window: 0.2\n")
    show = ["config", "show", "coordinator", "--config", str(tmp_path / "c.yaml")]
    done = subprocess.run(
        [sys.executable, "-m", "recoverd.cli.main", *show],
        capture_output=True, text=True, timeout=60, env={"RECOVERD_EVENT_CAP": "7", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines()}
    assert (
        "# file" in lines["--etcd"] and "0.2" in lines["--fault-window"] and "[coordinator]" in lines["--fault-window"]
    )
    assert "7" in lines["--event-cap"] and "env RECOVERD_EVENT_CAP" in lines["--event-cap"]
    assert "# default" in lines["--retention"]
    bad = subprocess.run(
        [sys.executable, "-m", "recoverd.cli.main", "coordinator", "--config", str(tmp_path / "none.yaml")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "cannot read it" in bad.stderr
