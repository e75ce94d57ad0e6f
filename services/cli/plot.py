"""``recoverctl timeline JOB --plot FILE.png``: the recovery's phases as horizontal bars.

matplotlib is not a dependency of recoverd (it is large, and only this command and the benchmarks
draw): it is imported here, lazily, and :func:`require_matplotlib` is called before etcd is
touched, so a missing one is a clear usage error (exit 2) naming the package to install. The
figure is drawn on a :class:`matplotlib.figure.Figure` with the Agg canvas, not through pyplot:
no global state, no display needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recoverd.errors import ConfigError

__all__ = ["Bar", "bars", "require_matplotlib", "write_png"]

_INSTALL = "pip install matplotlib (or the recoverd[plot] extra)"


@dataclass(frozen=True, slots=True)
class Bar:
    """One phase: where it starts and how long it took, in ms from the fault's detection."""

    label: str
    start_ms: float
    width_ms: float
    text: str


def bars(timeline: dict[str, Any]) -> list[Bar]:
    """The bars of a timeline (``timeline_dict``), top to bottom in phase order. The last phase
    (DONE, FAILED, or the one in progress) has no duration: it is a mark at its start."""
    out = []
    for row in timeline["phases"]:
        took = row["duration_ms"]
        text = f"{took:.1f} ms" if took is not None else ("now" if row["phase"] not in ("DONE", "FAILED") else "end")
        out.append(Bar(f"{row['phase']} (epoch {row['epoch']})", row["at_ms"], took or 0.0, text))
    return out


def require_matplotlib() -> None:
    """ConfigError (exit 2) unless matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise ConfigError(f"timeline --plot needs matplotlib, which is not installed: {_INSTALL}") from err


def write_png(timeline: dict[str, Any], job: str, path: str) -> None:
    """Draw ``timeline`` (``timeline_dict``) into the PNG file ``path``; ConfigError if it cannot be
    written."""
    require_matplotlib()
    from matplotlib.figure import Figure

    rows = bars(timeline)
    total = max((b.start_ms + b.width_ms for b in rows), default=0.0) or 1.0
    fig = Figure(figsize=(9, 1.2 + 0.45 * len(rows)), dpi=100)
    ax = fig.subplots()
    for i, bar in enumerate(rows):
        if bar.width_ms > 0:
            ax.barh(i, bar.width_ms, left=bar.start_ms, height=0.6, color="tab:blue")
        else:
            ax.plot(
                [bar.start_ms], [i], marker="|", markersize=18, color="tab:red" if bar.text == "end" else "tab:blue"
            )
        ax.text(bar.start_ms + bar.width_ms + total * 0.01, i, bar.text, va="center", fontsize=9)
    ax.set_yticks(range(len(rows)), [b.label for b in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, total * 1.15)
    ax.set_xlabel("ms since the fault was detected")
    ax.set_title(
        f"job {job}: recovery {timeline['recovery']} ({timeline['strategy'] or '-'}, ranks {timeline['fault_ranks']}),"
        f" {timeline['total_ms']:.1f} ms"
    )
    fig.tight_layout()
    try:
        fig.savefig(path, format="png")
    except OSError as err:
        raise ConfigError(f"cannot write the plot to {path}: {err.strerror or err}") from err
