"""PNG figures of a report.

Figures are drawn on ``matplotlib.figure.Figure`` objects and saved with the Agg renderer, without pyplot, so
building a report never changes the caller's matplotlib backend or global figure state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from marllm.reporting.evaluation import collapse_per_iteration
from marllm.reporting.indicators import moving_average
from marllm.reporting.runs import Curve

Color = tuple[float, ...]

_FIGSIZE = (7.0, 4.2)
_DPI = 120


def curve_colors(n: int) -> list[Color]:
    """``n`` distinct colours, one per curve, reused by every figure so a curve keeps its colour."""
    palette = matplotlib.colormaps["tab10" if n <= 10 else "tab20"].colors
    return [palette[i % len(palette)] for i in range(n)]


def plot_metric(
    curves: Sequence[Curve],
    colors: Sequence[Color],
    metric: str,
    title: str,
    path: Path,
    smoothing: int = 1,
) -> bool:
    """One line per curve of ``<learner>/<metric>`` against the iteration.

    Returns False (and writes nothing) when no curve has a value of that metric.

    With ``smoothing > 1`` the raw values are drawn faint under their trailing moving average.
    """
    fig = Figure(figsize=_FIGSIZE, layout="constrained")
    ax = fig.add_subplot()
    drawn = False
    for curve, color in zip(curves, colors, strict=True):
        iterations, values = curve.series(metric)
        if len(values) == 0:
            continue
        if smoothing > 1:
            ax.plot(iterations, values, color=color, alpha=0.25, linewidth=1)
            values = moving_average(values, smoothing)
        ax.plot(iterations, values, color=color, linewidth=2, label=curve.label)
        drawn = True
    if not drawn:
        return False
    note = f" (moving average over {smoothing} iterations)" if smoothing > 1 else ""
    ax.set(xlabel="iteration", ylabel=metric, title=title + note)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=_DPI)
    return True


def plot_reward_vs_kl(curves: Sequence[Curve], colors: Sequence[Color], path: Path) -> bool:
    """Task reward against KL, one point per iteration, the final iteration starred: the Pareto view (up and
    to the left is better). Returns False when no iteration logs both numbers."""
    fig = Figure(figsize=_FIGSIZE, layout="constrained")
    ax = fig.add_subplot()
    drawn = False
    for curve, color in zip(curves, colors, strict=True):
        kl_at, kl = curve.series("kl")
        reward_at, reward = curve.series("task_reward")
        _, in_kl, in_reward = np.intersect1d(kl_at, reward_at, assume_unique=True, return_indices=True)
        if len(in_kl) == 0:
            continue
        x, y = kl[in_kl], reward[in_reward]
        ax.scatter(x, y, color=color, s=14, alpha=0.6, label=curve.label)
        ax.scatter(
            x[-1:], y[-1:], color=color, s=180, marker="*", edgecolors="black", linewidths=0.8, zorder=3
        )
        drawn = True
    if not drawn:
        return False
    ax.set(xlabel="KL to reference", ylabel="task reward", title="Task reward vs KL (★ = final iteration)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=_DPI)
    return True


def plot_collapse(curves: Sequence[Curve], colors: Sequence[Color], path: Path) -> bool:
    """Distinct-2 and repeated-token fraction of the logged training samples per iteration; False when no run
    has samples."""
    fig = Figure(figsize=(_FIGSIZE[0], 1.6 * _FIGSIZE[1]), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    drawn = False
    for curve, color in zip(curves, colors, strict=True):
        iterations, stats = collapse_per_iteration(curve.run, curve.learner)
        if len(iterations) == 0:
            continue
        top.plot(iterations, stats["distinct_2"], color=color, marker=".", label=curve.label)
        bottom.plot(iterations, stats["repeated_fraction"], color=color, marker=".", label=curve.label)
        drawn = True
    if not drawn:
        return False
    top.set(ylabel="distinct-2", title="Collapse indicators of the logged training samples")
    bottom.set(xlabel="iteration", ylabel="repeated-token fraction")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend()
    fig.savefig(path, dpi=_DPI)
    return True
