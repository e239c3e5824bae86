"""PNG figures of a report.

Figures are drawn on ``matplotlib.figure.Figure`` objects and saved with the Agg renderer, without pyplot, so
building a report never changes the caller's matplotlib backend or global figure state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from marllm.reporting.evaluation import collapse_per_iteration
from marllm.reporting.indicators import moving_average
from marllm.reporting.runs import Curve, Run

Color = tuple[float, ...]

FIGSIZE = (7.0, 4.2)
"""The size in inches of a one-panel figure, a report's or a study report's."""
DPI = 120

SMOOTHING_SPAN = 3
"""A curve is smoothed only when it has at least this many windows of points: a moving average over a third or more
of a short run mostly shows its own lag, so such a curve is drawn raw, bold."""


def smooths(points: int, smoothing: int) -> bool:
    """Whether a curve of ``points`` values is drawn as its moving average over ``smoothing`` iterations (see
    :data:`SMOOTHING_SPAN`)."""
    return smoothing > 1 and points >= SMOOTHING_SPAN * smoothing


def _finish_axes(fig: Figure, ax: Axes) -> None:
    """Whole-number iteration ticks, a grid, and the legend beside the plot, where it covers no data."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        fig.legend(*ax.get_legend_handles_labels(), loc="outside right upper", fontsize="small")


def curve_colors(n: int) -> list[Color]:
    """``n`` distinct colours, one per curve, reused by every figure so a curve keeps its colour."""
    palette = matplotlib.colormaps["tab10" if n <= 10 else "tab20"].colors
    return [palette[i % len(palette)] for i in range(n)]


def save_figure(fig: Figure | None, path: Path) -> bool:
    """Save ``fig`` as the PNG ``path``; returns False (and writes nothing) when there is no figure (None: nothing to
    draw)."""
    if fig is None:
        return False
    fig.savefig(path, dpi=DPI)
    return True


def metric_figure(
    curves: Sequence[Curve], colors: Sequence[Color], metric: str, title: str, smoothing: int = 1
) -> Figure | None:
    """One line per curve of ``<learner>/<metric>`` against the iteration (see :func:`line_figure`), or None when no
    curve has a value of ``metric``."""
    lines, line_colors = [], []
    for curve, color in zip(curves, colors, strict=True):
        iterations, values = curve.series(metric)
        if len(values):
            lines.append((curve.label, iterations, values))
            line_colors.append(color)
    return line_figure(lines, line_colors, metric, title, smoothing)


def line_figure(
    lines: Sequence[tuple[str, np.ndarray, np.ndarray]],
    colors: Sequence[Color],
    metric: str,
    title: str,
    smoothing: int = 1,
) -> Figure | None:
    """``metric`` against the iteration, one line per ``(label, iterations, values)`` of ``lines`` in its colour of
    ``colors``; None when there is no line.

    With ``smoothing > 1`` a curve long enough for it (:func:`smooths`) is drawn bold as its trailing moving average
    over the faint raw values; a shorter one is drawn raw, bold, with a dot per iteration.
    """
    if not lines:
        return None
    fig = Figure(figsize=FIGSIZE, layout="constrained")
    ax = fig.add_subplot()
    smoothed = False
    for (label, iterations, values), color in zip(lines, colors, strict=True):
        _draw(ax, iterations, values, color, label, smoothing)
        smoothed |= smooths(len(values), smoothing)
    note = f" (moving average over {smoothing} iterations)" if smoothed else ""
    ax.set(xlabel="iteration", ylabel=metric, title=title + note)
    _finish_axes(fig, ax)
    return fig


def _draw(ax: Axes, iterations: np.ndarray, values: np.ndarray, color: Color, label: str, smoothing: int) -> None:
    if smooths(len(values), smoothing):
        ax.plot(iterations, values, color=color, alpha=0.25, linewidth=1)
        ax.plot(iterations, moving_average(values, smoothing), color=color, linewidth=2, label=label)
    else:
        ax.plot(iterations, values, color=color, linewidth=2, marker="." if len(values) < 50 else None, label=label)


def changes_roles(run: Run, learner: str) -> bool:
    """Whether ``learner`` played more than one role in ``run`` (``agents.role_period``)."""
    return len(run.roles_held(learner)) > 1


def role_figure(runs: Sequence[Run], metric: str, title: str, smoothing: int = 1) -> Figure | None:
    """One line per role of each run whose learners change roles: ``metric`` of whichever learner played the role
    at each iteration (see :func:`line_figure`). None when no run has a learner that changed role."""
    lines = []
    for run in runs:
        if not any(changes_roles(run, learner) for learner in run.learners):
            continue
        roles = list(dict.fromkeys(role for learner in run.learners for role in run.roles_held(learner)))
        for role in roles:
            iterations, values = run.role_series(metric, role)
            if len(values):
                lines.append((f"{run.display} {role}", iterations, values))
    return line_figure(lines, curve_colors(len(lines)), metric, title, smoothing)


def plot_reward_vs_kl(curves: Sequence[Curve], colors: Sequence[Color], path: Path) -> bool:
    """Task reward against KL, one point per iteration, the final iteration starred: the Pareto view (up and
    to the left is better). Returns False when no iteration logs both numbers."""
    fig = Figure(figsize=FIGSIZE, layout="constrained")
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
    fig.legend(*ax.get_legend_handles_labels(), loc="outside right upper", fontsize="small")
    return save_figure(fig, path)


def plot_collapse(curves: Sequence[Curve], colors: Sequence[Color], path: Path) -> bool:
    """Distinct-2 and repeated-token fraction of the logged training samples per iteration; False when no run
    has samples."""
    fig = Figure(figsize=(FIGSIZE[0], 1.6 * FIGSIZE[1]), layout="constrained")
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
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.legend(*top.get_legend_handles_labels(), loc="outside right upper", fontsize="small")
    return save_figure(fig, path)
