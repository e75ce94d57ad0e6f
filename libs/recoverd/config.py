"""Every flag of a command also from the environment and a YAML file, one precedence (docs/configuration.md).

    flag  >  RECOVERD_<FLAG>  >  --config FILE  >  the built-in default

A flag ``--fault-window`` is ``RECOVERD_FAULT_WINDOW`` in the environment and ``fault-window`` (or
``fault_window``) in the file. The file is a mapping; its top-level keys apply to every command
that has that flag, and a section named after a command (``coordinator:``, ``agent:``, ...)
applies to that command only and wins over the top level::

    etcd: https://etcd-0:2379,https://etcd-1:2379
    etcd-cacert: /etc/recoverd/ca.pem
    coordinator:
      fault-window: 0.1
    agent:
      nproc-per-node: 8

Everything is validated with the flag's own type and choices before anything starts: a key that
is no flag of any command, a value of the wrong type, or an invalid environment value is a
:class:`ConfigError` naming where it came from. Secrets are never configuration: a password comes
from its own file (``--etcd-password-file``) or ``RECOVERD_ETCD_PASSWORD`` (docs/security.md).

:func:`resolve` is applied to a subcommand's parser before it parses the command line, by setting
the parser's defaults; argparse then lets a flag given on the command line win.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from recoverd.errors import ConfigError

__all__ = ["Setting", "env_name", "load_file", "resolve"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
#: Flags that never come from the environment or a file (they choose the file, or are one-shot).
_NOT_CONFIGURABLE = {"help", "config", "version", "command"}


@dataclass(frozen=True, slots=True)
class Setting:
    """One flag's effective value and where it came from (``recoverd config show``)."""

    flag: str
    value: Any
    source: str


def env_name(dest: str) -> str:
    return "RECOVERD_" + dest.upper()


def load_file(path: str) -> dict[str, Any]:
    """The file's mapping (ConfigError when it is unreadable, not YAML, or not a mapping)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as err:
        raise ConfigError(f"--config {path}: cannot read it: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"--config {path}: not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of flag names to values, got a {type(data).__name__}")
    return data


def _configurable(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {
        a.dest: a
        for a in parser._actions
        if a.option_strings and a.dest not in _NOT_CONFIGURABLE and not isinstance(a, argparse._HelpAction)
    }


def _key(name: str) -> str:
    return str(name).strip().replace("-", "_")


def _convert(action: argparse.Action, raw: Any, where: str) -> Any:
    """``raw`` (a string from the environment, or a YAML value) as the flag's type; ConfigError if not."""
    flag = action.option_strings[-1]
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if isinstance(raw, bool):
            return raw if isinstance(action, argparse._StoreTrueAction) else not raw
        text = str(raw).strip().lower()
        if text not in _TRUE | _FALSE:
            raise ConfigError(f"{where}: {flag} takes true or false, not {raw!r}")
        on = text in _TRUE
        return on if isinstance(action, argparse._StoreTrueAction) else not on
    if isinstance(action, argparse._AppendAction):
        items = raw if isinstance(raw, list) else [x for x in str(raw).split(",") if x.strip()]
        return [_convert_one(action, item, where, flag) for item in items]
    if isinstance(raw, list | dict):
        raise ConfigError(f"{where}: {flag} takes one value, not a {type(raw).__name__}")
    return _convert_one(action, raw, where, flag)


def _convert_one(action: argparse.Action, raw: Any, where: str, flag: str) -> Any:
    text = str(raw)
    try:
        value = action.type(text) if callable(action.type) else text  # type: ignore[misc]
    except (argparse.ArgumentTypeError, TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {flag}: invalid value {text!r}: {err}") from None
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(str(c) for c in action.choices)
        raise ConfigError(f"{where}: {flag}: {text!r} is not one of {choices}")
    return value


def resolve(
    parser: argparse.ArgumentParser,
    command: str,
    *,
    config_path: str | None,
    env: Mapping[str, str] | None = None,
    all_flags: Sequence[str] = (),
    commands: Sequence[str] = (),
) -> list[Setting]:
    """Set ``parser``'s defaults from the file and the environment (see the module docstring) and
    return every configurable flag's effective default with its source.

    ``all_flags``: the destinations of every command's flags (a top-level file key that is none of
    them is a typo: refused); ``commands``: the section names that may appear in the file."""
    env = os.environ if env is None else env
    actions = _configurable(parser)
    chosen: dict[str, tuple[Any, str]] = {}
    if config_path:
        data = load_file(config_path)
        known_flags = set(all_flags) | set(actions)
        sections = {str(k): v for k, v in data.items() if str(k) in commands}
        for name, raw in data.items():
            if str(name) in commands:
                continue
            dest = _key(name)
            if dest not in known_flags:
                raise ConfigError(f"--config {config_path}: {name!r} is no flag of any recoverd command")
            if dest in actions:
                chosen[dest] = (_convert(actions[dest], raw, f"--config {config_path}"), f"file {config_path}")
        section = sections.get(command)
        if section is not None and not isinstance(section, dict):
            raise ConfigError(f"--config {config_path}: the {command!r} section must be a mapping")
        for name, raw in (section or {}).items():
            dest = _key(name)
            if dest not in actions:
                raise ConfigError(f"--config {config_path}: {command}.{name}: `recoverd {command}` has no such flag")
            where = f"--config {config_path} ({command} section)"
            chosen[dest] = (_convert(actions[dest], raw, where), f"file {config_path} [{command}]")
    for dest, action in actions.items():
        variable = env_name(dest)
        if variable in env:
            chosen[dest] = (_convert(action, env[variable], f"${variable}"), f"env {variable}")
    parser.set_defaults(**{dest: value for dest, (value, _) in chosen.items()})
    for dest in chosen:
        actions[dest].required = False  # given by the environment or the file: no longer missing
    return [
        Setting(
            action.option_strings[-1],
            chosen[dest][0] if dest in chosen else action.default,
            chosen[dest][1] if dest in chosen else "default",
        )
        for dest, action in sorted(actions.items())
    ]
