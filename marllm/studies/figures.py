"""The figures of a study report: curves over iterations, final metrics against an axis, and reward against KL.

Each function draws one PNG from the cells and their summaries (as :mod:`marllm.studies.report` computes them) and
returns whether it drew anything; :func:`marllm.studies.report.build_study_report` lists the ones drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from marllm.reporting.plots import FIGSIZE, curve_colors, save_figure
from marllm.studies.cells import MEAN, METRICS, ROLE_PREFIX, Cell, show

_LINESTYLES = ("-", "--", ":", "-.")


def plot_curves(cells, summaries, colors, metric: str, title: str, path: Path, by_role: bool = False) -> bool:
    """Mean ± std curves of ``metric``: each learner of a cell (``mean`` for a single learner), or, ``by_role``, each
    exchanged role of a cell (cells without an exchange are left out)."""
    fig = Figure(figsize=FIGSIZE, layout="constrained")
    ax = fig.add_subplot()
    drawn = False
    for cell, summary in zip(cells, summaries, strict=True):
        if by_role:
            shown = [ROLE_PREFIX + role for role in cell.exchanged_roles]
        else:
            shown = cell.learners if len(cell.learners) > 1 else [MEAN]
        for style, learner in zip(_LINESTYLES * 8, shown, strict=False):
            curve = summary["curves"].get(metric, {}).get(learner)
            if curve is None:
                continue
            its, mean = np.array(curve["iterations"]), np.array(curve["mean"])
            std = np.array([np.nan if s is None else s for s in curve["std"]], dtype=np.float64)
            if learner.startswith(ROLE_PREFIX):
                suffix = f" {learner}"
            else:
                suffix = f"-{learner.upper()}" if learner != MEAN else ""
            color = colors[cell.label]
            ax.plot(
                its,
                mean,
                color=color,
                linestyle=style,
                linewidth=2,
                label=f"{cell.label}{suffix} (n={summary['n_seeds']})",
            )
            ax.fill_between(its, mean - std, mean + std, color=color, alpha=0.2, linewidth=0)
            drawn = True
    if not drawn:
        return False
    ax.set(xlabel="iteration", ylabel=title, title=f"{title}: mean ± std over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save_figure(fig, path)


def _errors(entry: dict[str, Any]) -> float:
    return 0.0 if entry["std"] is None else entry["std"]


def plot_axis(cells: list[Cell], finals, axis: str, path: Path) -> bool:
    """Final ``mean`` metrics against one axis's values, error bars = std over seeds, one line per variant."""
    fig = Figure(figsize=(FIGSIZE[0], 2.2 * FIGSIZE[1]), layout="constrained")
    panels = fig.subplots(len(METRICS), 1, sharex=True)
    ticks = sorted({show(c.axes[axis]) for c in cells if axis in c.axes})
    numeric = all(isinstance(c.axes.get(axis), (int, float)) for c in cells if axis in c.axes)
    variants = list(dict.fromkeys(c.variant for c in cells))
    drawn = False
    for ax, (metric, title) in zip(panels, METRICS.items(), strict=True):
        for variant, color in zip(variants, curve_colors(len(variants)), strict=True):
            rows = []
            for cell in cells:
                entry = finals[cell.label].get(metric, {}).get(MEAN)
                if cell.variant == variant and axis in cell.axes and entry is not None:
                    x = cell.axes[axis] if numeric else ticks.index(show(cell.axes[axis]))
                    rows.append((x, entry["mean"], _errors(entry)))
            if not rows:
                continue
            rows.sort()
            x, y, err = zip(*rows, strict=True)
            ax.errorbar(x, y, yerr=err, color=color, marker="o", capsize=4, label=variant)
            drawn = True
        ax.set(ylabel=f"final {title}")
        ax.grid(alpha=0.3)
    if not drawn:
        return False
    if not numeric:
        panels[-1].set_xticks(range(len(ticks)), ticks)
    panels[-1].set(xlabel=axis)
    panels[0].set(title=f"Final metrics (mean of learners) vs {axis}\nbars = std over seeds")
    panels[0].legend()
    return save_figure(fig, path)


def plot_reward_vs_kl(cells: list[Cell], finals, pareto, colors, path: Path) -> bool:
    fig = Figure(figsize=FIGSIZE, layout="constrained")
    ax = fig.add_subplot()
    points: dict[str, tuple[float, float]] = {}
    for cell in cells:
        reward = finals[cell.label].get("task_reward", {}).get(MEAN)
        kl = finals[cell.label].get("kl", {}).get(MEAN)
        if reward is None or kl is None:
            continue
        points[cell.label] = (kl["mean"], reward["mean"])
        ax.errorbar(
            kl["mean"],
            reward["mean"],
            xerr=_errors(kl),
            yerr=_errors(reward),
            color=colors[cell.label],
            marker="o",
            capsize=4,
            label=f"{cell.label} (n={reward['n']})",
        )
    if not points:
        return False
    variants = list(pareto)
    for variant, color in zip(variants, curve_colors(len(variants)), strict=True):
        front = [points[label] for label in pareto[variant]]
        ax.step(
            [p[0] for p in front],
            [p[1] for p in front],
            where="post",
            color=color,
            alpha=0.6,
            linestyle="--",
            marker="o",
            markersize=14,
            fillstyle="none",
            label=f"{variant} frontier",
        )
    ax.set(
        xlabel="final KL",
        ylabel="final task reward",
        title="Final task reward vs KL (up and left is better); bars = std over seeds",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save_figure(fig, path)
