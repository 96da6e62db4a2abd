"""Plots of `engram curve --plot` and `engram skills --plot`: in the terminal (plotext) or, with
`--out FILE.png`, as a PNG (matplotlib, headless); what they show: docs/api.md, "Command line". Both
come with the `plot` extra; each is imported only when a plot is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from engram_episodic.types import CurvePoint, SkillProfile

MISSING = (
    "plots need the plot extra ({error}): pip install './client[plot]' (engram-episodic[plot], from an "
    "Engram checkout; `make install` has it)"
)
WEAK_COLOR, OK_COLOR = "#c0392b", "#2e86c1"


def _module(name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise click.ClickException(MISSING.format(error=exc)) from None


def _pyplot() -> Any:
    matplotlib = _module("matplotlib")
    matplotlib.use("Agg")  # no display needed, nor wanted
    return _module("matplotlib.pyplot")


def _series(points: Sequence[CurvePoint]) -> tuple[list[int], list[float], list[float], list[float]]:
    xs = [p.episode for p in points]
    rate = [p.success_rate for p in points]
    reward = [p.avg_reward if p.avg_reward is not None else float("nan") for p in points]
    cumulative = [p.cumulative_reward for p in points]
    return xs, rate, reward, cumulative


def curve_figure(points: Sequence[CurvePoint], window: int) -> Any:
    """The learning curve as a matplotlib Figure (10x5 in at 120 dpi); the caller closes it."""
    plt = _pyplot()
    xs, rate, reward, cumulative = _series(points)
    fig, left = plt.subplots(figsize=(10, 5), dpi=120)
    left.plot(xs, rate, color=OK_COLOR, label=f"success rate (rolling {window})")
    left.plot(xs, reward, color="#27ae60", label=f"reward (rolling {window})")
    left.set_ylim(-0.05, 1.05)
    left.set_xlabel("episode")
    # episodes are counted: a short curve would get ticks at 1.5, 2.5
    left.xaxis.set_major_locator(_module("matplotlib.ticker").MaxNLocator(integer=True))
    left.set_ylabel("rolling success rate / reward")
    right = left.twinx()
    right.plot(xs, cumulative, color="#7f8c8d", linestyle="--", label="cumulative reward")
    right.set_ylabel("cumulative reward")
    lines = left.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    left.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left")
    left.set_title("Learning curve")
    left.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def curve_terminal(points: Sequence[CurvePoint], window: int) -> str:
    """The learning curve drawn with plotext, as text (the caller echoes it)."""
    plt = _module("plotext")
    xs, rate, reward, cumulative = _series(points)
    plt.clear_figure()
    plt.plot(xs, rate, label=f"success rate (rolling {window})", color="blue")
    plt.plot(xs, [r if r == r else 0.0 for r in reward], label=f"reward (rolling {window})", color="green")
    plt.plot(xs, cumulative, label="cumulative reward", color="gray", yside="right")
    plt.title("Learning curve")
    plt.xlabel("episode")
    plt.plotsize(100, 25)
    return str(plt.build())


def _bars(profiles: Sequence[SkillProfile]) -> tuple[list[str], list[float], list[bool]]:
    ranked = sorted(profiles, key=lambda p: (p.success_rate is None, p.success_rate or 0.0, p.category))
    return (
        [p.category for p in ranked],
        [p.success_rate or 0.0 for p in ranked],
        [p.weak for p in ranked],
    )


def skills_figure(profiles: Sequence[SkillProfile], threshold: float) -> Any:
    """The success rate per category as a matplotlib Figure (10 in wide at 120 dpi, 0.45 in per
    category): weak categories red and marked, the threshold a dashed line; the caller closes it."""
    plt = _pyplot()
    names, rates, weak = _bars(profiles)
    fig, ax = plt.subplots(figsize=(10, max(3.0, 0.45 * len(names) + 1.5)), dpi=120)
    ax.barh(names, rates, color=[WEAK_COLOR if w else OK_COLOR for w in weak])
    ax.axvline(threshold, color="#555555", linestyle="--", label=f"weak below {threshold:.0%}")
    for y, (rate, is_weak) in enumerate(zip(rates, weak, strict=True)):
        ax.text(min(rate, 0.98) + 0.01, y, f"{rate:.0%}{'  WEAK' if is_weak else ''}", va="center")
    for label, is_weak in zip(ax.get_yticklabels(), weak, strict=True):
        if is_weak:  # a 0% bar has no width: the name says it too
            label.set_color(WEAK_COLOR)
            label.set_fontweight("bold")
    ax.set_xlim(0, 1.15)
    ax.set_xlabel("success rate")
    ax.set_title("Success rate per category")
    ax.legend(loc="lower right")
    fig.tight_layout()
    return fig


def skills_terminal(profiles: Sequence[SkillProfile], threshold: float) -> str:
    """The success rate per category as a plotext bar chart (weak ones marked `WEAK`), as text."""
    plt = _module("plotext")
    names, rates, weak = _bars(profiles)
    plt.clear_figure()
    labels = [f"{n} WEAK" if w else n for n, w in zip(names, weak, strict=True)]
    plt.bar(labels, [round(r * 100, 1) for r in rates], orientation="horizontal", width=0.3)
    plt.xlim(0, 100)
    plt.title(f"Success rate per category, % (weak below {threshold:.0%})")
    plt.plotsize(100, max(8, 3 * len(names) + 5))
    return str(plt.build())


def png(fig: Any, out: Path) -> Path:
    """Write the Figure `fig` (of `curve_figure` or `skills_figure`) to `out` as PNG and close it;
    ClickException saying on one line why it cannot be written (a missing directory, no permission)."""
    try:
        fig.savefig(out, format="png")
    except OSError as exc:
        raise click.ClickException(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        _pyplot().close(fig)
    return out
