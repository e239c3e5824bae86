"""The report of a study: seeds aggregated per cell, comparisons between variants, and the reward–KL frontier.

:func:`build_study_report` reads ``STUDY_DIR/study.json`` and the run directories it names and writes
``STUDY_DIR/report/``: ``report.md``, PNG figures and ``summary.json`` with every number shown.

Conventions:

- A *cell* is a variant plus its axis values; its finished runs are its seeds. Runs that failed, did not finish or
  cannot be read are listed at the top of the report and left out of every aggregate.
- Each metric (task reward, KL, combined reward) is reported per learner and for ``mean``, the average over the
  run's learners at each iteration (for a single-learner run, ``mean`` is that learner), so that a CORY cell (llm1,
  llm2) and a PPO cell (llm1) are compared on ``mean``.
- A seed's final value is the mean of its last ``last_k`` logged iterations; see :mod:`marllm.studies.aggregate`
  for the intervals.
- Comparisons: each ``[a, b]`` pair of ``study.json``'s ``compare`` (when absent or empty, every other variant
  against the first variant in run order) is reported as ``a − b`` (Welch) for each metric on ``mean``, between
  cells with the same axis values, or between every pair of their cells when no axis values match.

The cells and their series are :mod:`marllm.studies.cells`'s, the figures :mod:`marllm.studies.figures`'s; this
module collects the runs into cells, computes every number of ``summary.json`` and writes the markdown.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from marllm.games.study import cell_games, cell_measures, games_lines, measures_lines
from marllm.reporting.plots import curve_colors
from marllm.reporting.runs import load_run
from marllm.reporting.tables import escape_cell, fmt, markdown_table
from marllm.run.run_dir import WrongDirectoryError, has_run_record
from marllm.studies.aggregate import (
    final_value,
    interval_text,
    last_iterations_label,
    mean_curve,
    mean_std_text,
    pareto_front,
    seed_summary,
    welch_difference,
)
from marllm.studies.cells import MEAN, METRICS, ROLE_PREFIX, Cell, show
from marllm.studies.figures import plot_axis, plot_curves, plot_reward_vs_kl
from marllm.studies.files import EXPANSION_FILE, STUDY_FILE

REPORT_DIR = "report"


def build_study_report(study_dir: Path, last_k: int = 5) -> Path:
    """Write ``study_dir/report/report.md`` with its figures and ``summary.json``; returns the markdown path.

    Raises:
        WrongDirectoryError: ``study_dir`` is not a study directory (no ``study.json``), or its study has no runs.
        ValueError: its ``study.json`` is damaged.
    """
    study_dir = Path(study_dir)
    study = read_expansion(study_dir)
    cells, excluded = _collect(study_dir, study)
    out = study_dir / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    colors = dict(zip((c.label for c in cells), curve_colors(max(len(cells), 1)), strict=False))
    summary_cells = [_summarize_cell(cell, last_k) for cell in cells]
    comparisons = _comparisons(study, cells, summary_cells)
    finals = {s["label"]: s["final"] for s in summary_cells}
    pareto = _pareto(cells, finals)
    figures = []
    for metric, title in METRICS.items():
        name = f"curves_{metric}.png"
        if plot_curves(cells, summary_cells, colors, metric, title, out / name):
            figures.append((f"{title} (mean ± std over seeds)", name))
    if any(cell.exchanged_roles for cell in cells):
        name = "curves_task_reward_by_role.png"
        if plot_curves(cells, summary_cells, colors, "task_reward", "task reward", out / name, by_role=True):
            figures.append(("task reward by role, whichever learner plays it (mean ± std over seeds)", name))
    for axis in _grid_axes(cells):
        name = f"axis_{axis.replace('.', '_')}.png"
        if plot_axis(cells, finals, axis, out / name):
            figures.append((f"final metrics against {axis}", name))
    if plot_reward_vs_kl(cells, finals, pareto, colors, out / "reward_vs_kl.png"):
        figures.append(("final task reward vs final KL, with each variant's frontier", "reward_vs_kl.png"))
    averaged = [n for s in summary_cells for n in s["final_iterations"]]
    summary = {
        "name": study.get("name", study_dir.name),
        "last_k": last_k,
        "final_window": last_iterations_label(last_k, averaged),
        "excluded_runs": excluded,
        "cells": summary_cells,
        "comparisons": comparisons,
        "pareto": pareto,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False))
    path = out / "report.md"
    path.write_text(_markdown(summary, figures), encoding="utf-8")
    return path


def read_expansion(study_dir: Path) -> dict[str, Any]:
    """The ``study.json`` of ``study_dir``, checked to be a study's: a mapping with one run or more.

    Raises:
        WrongDirectoryError: ``study_dir`` is not a study directory (the message says what it is and what to give),
            or its ``study.json`` lists no runs.
        ValueError: ``study.json`` is not a JSON object with a list of runs.
    """
    give = "give the directory marllm study wrote (its --out, by default runs/studies/NAME)"
    path = study_dir / EXPANSION_FILE
    if not study_dir.is_dir():
        what = "does not exist" if not study_dir.exists() else "is a file, not a directory"
        if study_dir.suffix in (".yaml", ".yml"):
            what += f" (to run that study file: marllm study {study_dir})"
        raise WrongDirectoryError(f"study directory {study_dir} {what}; {give}")
    if not path.is_file():
        has = f"a {STUDY_FILE} but no {EXPANSION_FILE}" if (study_dir / STUDY_FILE).is_file() else "neither"
        run = f" (it is a run directory: marllm report {study_dir})" if has_run_record(study_dir) else ""
        raise WrongDirectoryError(
            f"{study_dir} is not a study directory: marllm study writes {STUDY_FILE} and {EXPANSION_FILE} there, and "
            f"it has {has}{run}; {give}"
        )
    try:
        study = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}); run the study again to rewrite it") from error
    if not isinstance(study, dict) or not isinstance(study.get("runs"), list):
        raise ValueError(f"{path} does not hold a study's runs (a JSON object with a 'runs' list)")
    if not study["runs"]:
        raise WrongDirectoryError(
            f"the study in {study_dir} has no runs ({EXPANSION_FILE} lists none): nothing to report; run a study "
            f"into it first (marllm study STUDY.yaml --out {study_dir})"
        )
    return study


def _collect(study_dir: Path, study: dict[str, Any]) -> tuple[list[Cell], list[dict[str, Any]]]:
    """Finished runs grouped into cells in order of first appearance; the other runs with the reason."""
    cells: dict[str, Cell] = {}
    excluded = []
    for entry in study.get("runs", []):
        variant, axes = str(entry.get("variant", entry["name"])), dict(entry.get("axes") or {})
        cell = cells.setdefault(json.dumps([variant, sorted(axes.items())], default=str), Cell(variant, axes))
        row = {"run": entry["name"], "variant": variant, "seed": entry.get("seed")}
        try:
            run = load_run(study_dir / entry.get("run_dir", f"runs/{entry['name']}"))
        except (OSError, ValueError) as err:
            excluded.append({**row, "reason": f"unreadable: {err}"})
            continue
        if not run.finished:
            excluded.append({**row, "reason": run.note})
            continue
        cell.runs.append(run)
        cell.seeds.append(entry.get("seed"))
    return list(cells.values()), excluded


def _summarize_cell(cell: Cell, last_k: int) -> dict[str, Any]:
    curves: dict[str, dict[str, Any]] = {}
    finals: dict[str, dict[str, Any]] = {}
    averaged: set[int] = set()  # the iterations each seed's final values averaged: fewer than last_k if it is shorter
    for metric in METRICS:
        for learner in cell.series_names:
            seeds = cell.seed_series(metric, learner)
            if not seeds:
                continue
            its, mean, std, n = mean_curve(seeds)
            curves.setdefault(metric, {})[learner] = {
                "iterations": its.tolist(),
                "mean": mean.tolist(),
                "std": [None if np.isnan(s) else float(s) for s in std],
                "n": n.tolist(),
            }
            per_seed = [final_value(values, last_k) for _, values in seeds]
            finals.setdefault(metric, {})[learner] = seed_summary(per_seed)
            if learner == MEAN:
                averaged.update(min(last_k, len(values)) for _, values in seeds)
    return {
        "label": cell.label,
        "variant": cell.variant,
        "axes": cell.axes,
        "n_seeds": len(cell.runs),
        "seeds": cell.seeds,
        "runs": [run.path.name for run in cell.runs],
        "final": finals,
        "final_iterations": sorted(averaged),
        "curves": curves,
        "role_gaps": _role_gaps(cell, last_k),
        "games": cell_games(cell, last_k),
        "game_measures": cell_measures(cell, last_k),
    }


def _role_gaps(cell: Cell, last_k: int) -> list[dict[str, Any]]:
    """Task reward of each later exchanged role minus the first role's, paired within each seed: at the first
    logged iteration (the untrained models) and over the last ``last_k`` iterations."""
    roles = cell.exchanged_roles
    gaps = []
    for role in roles[1:]:
        first, later = (
            cell.seed_series("task_reward", ROLE_PREFIX + roles[0]),
            cell.seed_series("task_reward", ROLE_PREFIX + role),
        )
        if len(first) != len(later) or not first:
            continue
        start = [b[1][0] - a[1][0] for a, b in zip(first, later, strict=True)]
        end = [final_value(b[1], last_k) - final_value(a[1], last_k) for a, b in zip(first, later, strict=True)]
        gaps.append(
            {
                "role": role,
                "minus": roles[0],
                "metric": "task_reward",
                "first_iteration": seed_summary(start),
                "final": seed_summary(end),
            }
        )
    return gaps


def _comparisons(study: dict[str, Any], cells: list[Cell], summaries: list[dict[str, Any]]) -> list[dict]:
    variants = list(dict.fromkeys(cell.variant for cell in cells))
    pairs = study.get("compare") or [[v, variants[0]] for v in variants[1:]]
    out = []
    for a, b in pairs:
        cells_a = [(c, s) for c, s in zip(cells, summaries, strict=True) if c.variant == a and c.runs]
        cells_b = [(c, s) for c, s in zip(cells, summaries, strict=True) if c.variant == b and c.runs]
        for cell_a, sum_a in cells_a:
            matching = [(c, s) for c, s in cells_b if c.axes == cell_a.axes] or cells_b
            for cell_b, sum_b in matching:
                for metric in METRICS:
                    fa, fb = sum_a["final"].get(metric, {}), sum_b["final"].get(metric, {})
                    if MEAN not in fa or MEAN not in fb:
                        continue
                    diff = welch_difference(fa[MEAN]["per_seed"], fb[MEAN]["per_seed"])
                    out.append(
                        {"a": cell_a.label, "b": cell_b.label, "metric": metric, "learner": MEAN, **diff.as_dict()}
                    )
    return out


def _pareto(cells: list[Cell], finals: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Per variant, the labels of its non-dominated cells on final (task reward, KL) of ``mean``."""
    out: dict[str, list[str]] = {}
    for variant in dict.fromkeys(cell.variant for cell in cells):
        points = {}
        for cell in cells:
            final = finals[cell.label]
            if cell.variant == variant and MEAN in final.get("task_reward", {}) and MEAN in final.get("kl", {}):
                points[cell.label] = (final["task_reward"][MEAN]["mean"], final["kl"][MEAN]["mean"])
        if points:
            out[variant] = pareto_front(points)
    return out


def _grid_axes(cells: list[Cell]) -> list[str]:
    """Axes that take more than one value across the cells."""
    values: dict[str, set[str]] = {}
    for cell in cells:
        for key, value in cell.axes.items():
            values.setdefault(key, set()).add(show(value))
    return [key for key, seen in values.items() if len(seen) > 1]


def _interval(entry: dict[str, Any]) -> str:
    if entry["ci_low"] is None and (entry.get("n", entry.get("n_a")) == 1 or entry.get("n_b") == 1):
        return "undefined (n = 1)"
    return interval_text(entry)


def _final_rows(summary: dict[str, Any]) -> list[list[str]]:
    """The final-values table: one row per cell, metric and learner."""
    rows = []
    for cell in summary["cells"]:
        for metric, title in METRICS.items():
            for learner, entry in cell["final"].get(metric, {}).items():
                row = [escape_cell(cell["label"]), title, escape_cell(learner), mean_std_text(entry)]
                rows.append([*row, _interval(entry), str(entry["n"])])
    return rows


def _comparison_lines(summary: dict[str, Any]) -> list[str]:
    window = summary["final_window"]
    lines = [
        f"- {row['a']} − {row['b']}, {METRICS[row['metric']]} ({row['learner']}) over the {window}: "
        f"{fmt(row['diff'])} {_interval(row)} (n = {row['n_a']}, {row['n_b']})"
        for row in summary["comparisons"]
    ]
    return lines or ["No comparison: fewer than two variants with finished runs."]


def _markdown(summary: dict[str, Any], figures: list[tuple[str, str]]) -> str:
    window = summary["final_window"]
    lines = [f"# Study: {summary['name']}", ""]
    if summary["excluded_runs"]:
        lines += ["## Runs left out (failed, unfinished or unreadable)", ""]
        lines += [
            f"- {row['run']} ({row['variant']}, seed {row['seed']}): {row['reason']}"
            for row in summary["excluded_runs"]
        ]
        lines.append("")
    lines += [
        "## Cells",
        "",
        markdown_table(
            ["cell", "seeds (n)", "runs"],
            [
                [c["label"], f"{', '.join(map(str, c['seeds']))} ({c['n_seeds']})", ", ".join(c["runs"])]
                for c in summary["cells"]
            ],
        ),
        "",
    ]
    lines += [
        f"## Final values (mean over the {window} per seed, then across seeds)",
        "",
        "std is the sample std (ddof = 1); the interval is the 95% Student-t interval for the mean.",
        "",
    ]
    header = ["cell", "metric", "learner", "mean ± std", "95% interval", "n"]
    lines += [markdown_table(header, _final_rows(summary), escape=False), ""]
    lines += games_lines(summary["cells"], window)
    lines += measures_lines(summary["cells"], window)
    lines += ["## Comparisons (Welch: difference of means, Welch–Satterthwaite t interval)", ""]
    lines += _comparison_lines(summary)
    gap_lines = [
        f"- {escape_cell(cell['label'])}: {gap['role']} − {gap['minus']}, task reward at the first iteration "
        f"{fmt(gap['first_iteration']['mean'])} {_interval(gap['first_iteration'])}, over the {window} "
        f"{fmt(gap['final']['mean'])} {_interval(gap['final'])} (n = {gap['final']['n']})"
        for cell in summary["cells"]
        for gap in cell.get("role_gaps", [])
    ]
    if gap_lines:
        lines += [
            "",
            "## By role (whichever learner plays it; differences paired within each seed, 95% t interval)",
            "",
            *gap_lines,
        ]
    lines += ["", "## Reward–KL frontier (non-dominated cells per variant, by final mean task reward and KL)", ""]
    lines += [f"- {variant}: {', '.join(labels)}" for variant, labels in summary["pareto"].items()]
    lines.append("")
    if figures:
        lines += ["## Figures", ""]
        for caption, name in figures:
            lines += [f"### {caption}", "", f"![{caption}]({name})", ""]
    return "\n".join(lines)
