r"""A job's recovery policy: the YAML file given with ``--policy`` / ``recoverctl policy set``.

Format (every key optional; docs/policy.md)::

    strategies: [recover-in-place, exit]    # allowed, in order; `exit` is always appended
    deadlines: {fault_window: 0.2, stop: 10, strategies: 10, decide: 30, recover: 60}   # seconds
    budgets:                                # at most `max` uses per `window_s` seconds
      recover-in-place: {max: 3, window_s: 3600}   # counted per rank
      exit: {max: 3, window_s: 600}                # the job's restart budget
    spares: [node7, node8]                  # only these --spare agents take ranks (default: any)
    allow_rank0_in_place: true              # may rank 0's node be recovered in place?
    independent_ranks: false                # true: ranks never talk to each other (a plain script's
                                            # rank may then be restarted alone; docs/adr/0041)
    hang:                                   # progress-based hang and straggler detection
      timeout: 0          # seconds; 0 = learned: multiplier x the step time, at least floor
      multiplier: 3
      floor: 5
      startup: 300        # allowance for start-up and the first warmup_steps steps
      warmup_steps: 3
      log_pattern: 'step (?P<step>\d+)'   # progress from log lines (scripts with no client)
      straggler_ratio: 1.5                 # slower than the node's peers' median by this much...
      straggler_window: 60                 # ...for this long: a straggler event
      enabled: true       # false: no hang faults (stragglers are still reported)

:func:`parse_policy` validates the text into a frozen :class:`JobPolicy` and raises
:class:`~recoverd.errors.ConfigError` naming the key, the bad value and what is allowed.
:meth:`JobPolicy.to_pb` turns it into the stored ``pb.Policy``; :func:`policy_dict` turns a stored
policy back into the file's form (what ``recoverctl policy show`` prints).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recoverd.errors import ConfigError, RecoverdError
from recoverd.keys import check_id
from recoverd.records import pb
from recoverd.strategies import ALL_STRATEGIES

__all__ = [
    "DEADLINE_KEYS",
    "DEFAULT_BUDGET_WINDOW_S",
    "DEFAULT_REPLACEMENT_WAIT_S",
    "KNOWN_STRATEGIES",
    "Budget",
    "Deadlines",
    "JobPolicy",
    "load_policy",
    "parse_policy",
    "policy_dict",
    "replacement_wait_s",
]

#: Strategy names, in MindCluster's priority order (recoverd.strategies owns them).
KNOWN_STRATEGIES = ALL_STRATEGIES
#: The file's deadline keys -> the fields of pb.PolicyDeadlines (and of the coordinator's Timeouts).
DEADLINE_KEYS = {
    "fault_window": "fault_window_s",
    "stop": "stop_s",
    "strategies": "strategies_s",
    "decide": "decide_s",
    "recover": "recover_s",
    "replacement": "replacement_s",
}
#: How long a recovery waits for a lost node's replacement when the policy does not say (seconds).
DEFAULT_REPLACEMENT_WAIT_S = 120.0
_MAX_REPLACEMENT_WAIT_S = 7 * 24 * 3600.0
DEFAULT_BUDGET_WINDOW_S = 600.0
_TOP_KEYS = ("strategies", "deadlines", "budgets", "spares", "allow_rank0_in_place", "independent_ranks", "hang")
#: The file's hang keys -> (pb.HangPolicy field, kind): seconds, ratio (> 1 or >= 1), count, ...
HANG_KEYS = {
    "enabled": ("enabled", "bool"),
    "timeout": ("timeout_s", "seconds0"),
    "multiplier": ("multiplier", "factor"),
    "floor": ("floor_s", "seconds"),
    "startup": ("startup_s", "seconds"),
    "warmup_steps": ("warmup_steps", "count"),
    "log_pattern": ("log_pattern", "regex"),
    "straggler_ratio": ("straggler_ratio", "ratio"),
    "straggler_window": ("straggler_window_s", "seconds"),
}
_MAX_PATTERN = 1024
_BUDGET_KEYS = ("max", "window_s")


@dataclass(frozen=True, slots=True)
class Budget:
    max: int
    window_s: float = DEFAULT_BUDGET_WINDOW_S


@dataclass(frozen=True, slots=True)
class Deadlines:
    """Seconds; ``None`` = not set (the coordinator's own ``--*-timeout`` applies)."""

    fault_window_s: float | None = None
    stop_s: float | None = None
    strategies_s: float | None = None
    decide_s: float | None = None
    recover_s: float | None = None
    #: How long to wait for an agent to replace a lost node; 0 = no wait (the only deadline that
    #: may be 0). The coordinator and the selector both read it from the stored policy.
    replacement_s: float | None = None


@dataclass(frozen=True, slots=True)
class JobPolicy:
    #: Allowed strategies in order, `exit` last; ``None`` when the file does not say.
    strategies: tuple[str, ...] | None = None
    deadlines: Deadlines = field(default_factory=Deadlines)
    #: (strategy, budget) pairs, in the file's order.
    budgets: tuple[tuple[str, Budget], ...] = ()
    spares: tuple[str, ...] = ()
    allow_rank0_in_place: bool = True
    #: The ranks never talk to each other: one restarted alone needs no client to go on (ADR 0041).
    independent_ranks: bool = False
    #: The ``hang`` section, already in stored form; None when the file has none.
    hang: pb.HangPolicy | None = None

    def budget(self, strategy: str) -> Budget | None:
        return dict(self.budgets).get(strategy)

    def to_pb(self, base: pb.Policy | None = None) -> pb.Policy:
        """The stored policy. ``base`` supplies what the file does not set: the strategies and the
        flag-level budgets (max_rank_restarts, max_job_restarts, restart_window_s, and the budgets
        of recover-in-place and exit) and the replacement wait; the other deadlines, other budgets,
        spares and allow_rank0_in_place come from the file alone; independent_ranks is true when
        either says so."""
        out = pb.Policy(strategies=["exit"], max_rank_restarts=3, max_job_restarts=3, restart_window_s=600.0)
        if base is not None:
            out.strategies[:] = list(base.strategies) or ["exit"]
            out.max_rank_restarts = base.max_rank_restarts or 3
            out.max_job_restarts = base.max_job_restarts or 3
            out.restart_window_s = base.restart_window_s or 600.0
            for kept in ("recover-in-place", "exit"):
                if kept in base.budgets:
                    out.budgets[kept].CopyFrom(base.budgets[kept])
            if base.independent_ranks:
                out.independent_ranks = True
            if base.deadlines.HasField("replacement_s"):  # --replacement-wait
                out.deadlines.replacement_s = base.deadlines.replacement_s
        if self.strategies is not None:
            out.strategies[:] = list(self.strategies)
        for name in DEADLINE_KEYS.values():
            value = getattr(self.deadlines, name)
            if value is not None:
                setattr(out.deadlines, name, value)
        for strategy, budget in self.budgets:
            out.budgets[strategy].max = budget.max
            out.budgets[strategy].window_s = budget.window_s
        # The flag-level fields keep their meaning for readers that know only them.
        if (rip := self.budget("recover-in-place")) is not None:
            out.max_rank_restarts = rip.max
        if (ex := self.budget("exit")) is not None:
            out.max_job_restarts = ex.max
        out.spares[:] = list(self.spares)
        out.allow_rank0_in_place = self.allow_rank0_in_place
        if self.independent_ranks:
            out.independent_ranks = True
        if self.hang is not None:
            out.hang.CopyFrom(self.hang)
        return out


def _fail(where: str, key: str, value: object, allowed: str) -> ConfigError:
    return ConfigError(f"{where}: {key}: {value!r} is not valid; {allowed}")


def _seconds(where: str, key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise _fail(where, key, value, "expected a positive number of seconds")
    return float(value)


def _mapping(where: str, key: str, value: object, allowed: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise _fail(where, key, value, f"expected a mapping of {allowed}")
    return value


def _unknown(where: str, key: str, found: dict[Any, Any], allowed: tuple[str, ...]) -> None:
    extra = [k for k in found if k not in allowed]
    if extra:
        raise ConfigError(f"{where}: unknown key {key}{extra[0]!r}; allowed: {', '.join(allowed)}")


def _strategy_list(where: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise _fail(where, "strategies", value, f"expected a non-empty list of {', '.join(KNOWN_STRATEGIES)}")
    out: list[str] = []
    for item in value:
        if item not in KNOWN_STRATEGIES:
            raise _fail(where, "strategies", item, f"allowed: {', '.join(KNOWN_STRATEGIES)}")
        if item in out:
            raise _fail(where, "strategies", item, "each strategy may be listed once")
        out.append(item)
    if "exit" in out:
        out.remove("exit")
    return (*out, "exit")


def _deadlines(where: str, value: object) -> Deadlines:
    raw = _mapping(where, "deadlines", value, ", ".join(DEADLINE_KEYS))
    _unknown(where, "deadlines.", raw, tuple(DEADLINE_KEYS))
    out = {}
    for key, item in raw.items():
        name = f"deadlines.{key}"
        # A replacement wait of 0 is meaningful (a lost node with no spare fails the job at once).
        zero = key == "replacement" and item == 0 and not isinstance(item, bool)
        out[DEADLINE_KEYS[key]] = 0.0 if zero else _seconds(where, name, item)
    return Deadlines(**out)


def replacement_wait_s(policy: pb.Policy) -> float:
    """How long a recovery waits for an agent to replace a lost node (a new agent registering for
    its node rank, or a spare): the policy's ``deadlines.replacement``, else the default."""
    if not policy.deadlines.HasField("replacement_s"):
        return DEFAULT_REPLACEMENT_WAIT_S
    value = policy.deadlines.replacement_s
    # The stored policy is untrusted input (anyone can write the key): a value that is no duration
    # falls back to the default rather than a deadline that never comes or cannot be stored.
    if not math.isfinite(value) or value < 0:
        return DEFAULT_REPLACEMENT_WAIT_S
    return min(value, _MAX_REPLACEMENT_WAIT_S)


def _budgets(where: str, value: object) -> tuple[tuple[str, Budget], ...]:
    raw = _mapping(where, "budgets", value, "strategy: {max: N, window_s: S}")
    out = []
    for strategy, spec in raw.items():
        if strategy not in KNOWN_STRATEGIES:
            raise _fail(where, "budgets", strategy, f"allowed strategies: {', '.join(KNOWN_STRATEGIES)}")
        key = f"budgets.{strategy}"
        entry = _mapping(where, key, spec, "max: N, window_s: S")
        _unknown(where, f"{key}.", entry, _BUDGET_KEYS)
        if "max" not in entry:
            raise ConfigError(f"{where}: {key}: missing key 'max' (the number of uses allowed per window_s)")
        count = entry["max"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise _fail(where, f"{key}.max", count, "expected a positive integer")
        window = _seconds(where, f"{key}.window_s", entry.get("window_s", DEFAULT_BUDGET_WINDOW_S))
        out.append((strategy, Budget(count, window)))
    return tuple(out)


def _spares(where: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _fail(where, "spares", value, "expected a list of node names")
    out: list[str] = []
    for item in value:
        try:
            check_id("node", item)
        except RecoverdError:
            raise _fail(
                where, "spares", item, "node names are 1-253 of [A-Za-z0-9._:-], starting alphanumeric"
            ) from None
        if item in out:
            raise _fail(where, "spares", item, "each node may be listed once")
        out.append(item)
    return tuple(out)


def _hang(where: str, value: object) -> pb.HangPolicy:
    raw = _mapping(where, "hang", value, ", ".join(HANG_KEYS))
    _unknown(where, "hang.", raw, tuple(HANG_KEYS))
    out = pb.HangPolicy()
    for key, item in raw.items():
        field_name, kind = HANG_KEYS[key]
        name = f"hang.{key}"
        if kind == "bool":
            if not isinstance(item, bool):
                raise _fail(where, name, item, "expected true or false")
            out.enabled = item
        elif kind == "seconds0":
            if item != 0:
                setattr(out, field_name, _seconds(where, name, item))
        elif kind == "seconds":
            setattr(out, field_name, _seconds(where, name, item))
        elif kind in ("factor", "ratio"):
            low_ok = (lambda v: v >= 1) if kind == "factor" else (lambda v: v > 1)
            good = not isinstance(item, bool) and isinstance(item, int | float) and math.isfinite(item) and low_ok(item)
            if not good:
                raise _fail(
                    where,
                    name,
                    item,
                    "expected a number of at least 1" if kind == "factor" else "expected a number above 1",
                )
            setattr(out, field_name, float(item))
        elif kind == "count":
            if isinstance(item, bool) or not isinstance(item, int) or not 0 < item <= 10_000:
                raise _fail(where, name, item, "expected an integer from 1 to 10000")
            setattr(out, field_name, item)
        else:
            if not isinstance(item, str) or not item or len(item) > _MAX_PATTERN:
                raise _fail(where, name, item, f"expected a regular expression of 1 to {_MAX_PATTERN} characters")
            try:
                compiled = re.compile(item)
            except re.error as err:
                raise _fail(where, name, item, f"not a regular expression: {err}") from None
            if "step" in compiled.groupindex and compiled.groupindex.keys() != {"step"}:
                raise _fail(where, name, item, "the only named group allowed is (?P<step>...)")
            out.log_pattern = item
    return out


def parse_policy(text: str, where: str = "policy") -> JobPolicy:
    """Validate a policy file's text; ``where`` names it in errors (usually the path)."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not valid YAML: {err}") from None
    if raw is None:
        raise ConfigError(f"{where}: the policy file is empty; expected a mapping with keys {', '.join(_TOP_KEYS)}")
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with keys {', '.join(_TOP_KEYS)}, got {type(raw).__name__}")
    _unknown(where, "", raw, _TOP_KEYS)
    allow = raw.get("allow_rank0_in_place", True)
    if not isinstance(allow, bool):
        raise _fail(where, "allow_rank0_in_place", allow, "expected true or false")
    independent = raw.get("independent_ranks", False)
    if not isinstance(independent, bool):
        raise _fail(where, "independent_ranks", independent, "expected true or false")
    return JobPolicy(
        strategies=_strategy_list(where, raw["strategies"]) if "strategies" in raw else None,
        deadlines=_deadlines(where, raw["deadlines"]) if "deadlines" in raw else Deadlines(),
        budgets=_budgets(where, raw["budgets"]) if "budgets" in raw else (),
        spares=_spares(where, raw["spares"]) if "spares" in raw else (),
        allow_rank0_in_place=allow,
        independent_ranks=independent,
        hang=_hang(where, raw["hang"]) if "hang" in raw else None,
    )


def load_policy(path: str | Path) -> JobPolicy:
    """Read and validate a policy file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read policy file {path}: {err}") from None
    return parse_policy(text, str(path))


def policy_dict(policy: pb.Policy) -> dict[str, Any]:
    """A stored policy in the file's form (every key explicit; deadlines only where set)."""
    budgets: dict[str, dict[str, Any]] = {
        "recover-in-place": {"max": policy.max_rank_restarts or 3, "window_s": policy.restart_window_s or 600.0},
        "exit": {"max": policy.max_job_restarts or 3, "window_s": policy.restart_window_s or 600.0},
    }
    for strategy in KNOWN_STRATEGIES:
        if strategy in policy.budgets:
            entry = policy.budgets[strategy]
            budgets[strategy] = {"max": entry.max, "window_s": entry.window_s}
    return {
        "strategies": list(policy.strategies) or ["exit"],
        "deadlines": {
            key: getattr(policy.deadlines, name)
            for key, name in DEADLINE_KEYS.items()
            if getattr(policy.deadlines, name) or (name == "replacement_s" and policy.deadlines.HasField(name))
        },
        "budgets": {s: budgets[s] for s in KNOWN_STRATEGIES if s in budgets},
        "spares": list(policy.spares),
        "allow_rank0_in_place": policy.allow_rank0_in_place if policy.HasField("allow_rank0_in_place") else True,
        "independent_ranks": policy.independent_ranks,
        "hang": _hang_dict(policy.hang),
    }


def _hang_dict(hang: pb.HangPolicy) -> dict[str, Any]:
    """The hang section as the file says it: the values set, the rest explained by the defaults."""
    out: dict[str, Any] = {}
    for key, (field_name, kind) in HANG_KEYS.items():
        if kind == "bool":
            if hang.HasField("enabled"):
                out[key] = hang.enabled
        elif value := getattr(hang, field_name):
            out[key] = value
    return out
