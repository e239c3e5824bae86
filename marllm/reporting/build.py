"""``build_report``: run directories in, ``report.md`` + PNG figures + ``summary.json`` out."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from marllm.games.report import game_rows, games_section
from marllm.reporting.evaluation import EvalModel, eval_collapse, eval_models, sample_queries, sample_table
from marllm.reporting.indicators import final_means, final_window, phase_times
from marllm.reporting.plots import (
    SMOOTHING_SPAN,
    curve_colors,
    metric_figure,
    plot_collapse,
    plot_reward_vs_kl,
    role_figure,
    save_figure,
    smooths,
)
from marllm.reporting.report_dir import REPORT_KIND, SUMMARY_FILE, claim_report_dir, remove_stale
from marllm.reporting.runs import EVAL_FILE, HELD_OUT, SAMPLES_FILE, Run, curves, load_runs
from marllm.reporting.tables import fmt, markdown_table

REPORT_FILE = "report.md"
PASS_AT_K_FILE = "pass_at_k.json"

# (metric suffix, figure title); one PNG each, named <metric>.png.
CURVE_METRICS = (
    ("task_reward", "Task reward r(q, a)"),
    ("kl", "KL to the reference"),
    ("combined_reward", "Combined reward: task reward − η·KL"),
)
# Metrics of the final table, as (metric suffix, column header).
FINAL_METRICS = (
    ("task_reward", "task reward"),
    ("kl", "KL"),
    ("combined_reward", "combined reward"),
    ("received_reward", "trained-on reward"),
    ("response_length", "response length"),
)
BY_ROLE_FILE = "task_reward_by_role.png"
SCATTER_FILE = "reward_vs_kl.png"
COLLAPSE_FILE = "collapse_per_iteration.png"


def build_report(
    run_dirs: Sequence[Path | str],
    out_dir: Path | str,
    *,
    smoothing: int = 5,
    final_k: int = 5,
    n_sample_queries: int = 8,
) -> Path:
    """Write ``report.md``, its PNG figures and ``summary.json`` comparing the given training runs.

    Args:
        run_dirs: run directories written by the training loop (see ``marllm.reporting.runs``). Runs sharing a
            name are told apart by their directory name.
        out_dir: where the report goes; created if missing. An earlier report there is replaced (its figures
            that this one does not draw are deleted); a file of the user's under a report's name is never written
            over: the directory is refused (:func:`~marllm.reporting.report_dir.claim_report_dir`).
        smoothing: moving-average window of the curves; 1 draws the raw values only, more draws them faint
            under the smoothed line. Smoothing hides noise but also delays and flattens peaks such as a
            reward collapse. A run shorter than 3 windows (:data:`~marllm.reporting.plots.SMOOTHING_SPAN`) is
            drawn raw, bold.
        final_k: the final table averages the last ``final_k`` iterations of each run (fewer for a shorter
            run). A wider window is less noisy but mixes in earlier, less trained iterations.
        n_sample_queries: how many held-out queries the sample table shows (0 for none).

    Returns:
        The path of ``report.md``.
    """
    _check_options(smoothing, final_k, n_sample_queries)
    runs = load_runs(run_dirs)
    out_dir = Path(out_dir)
    earlier = claim_report_dir(out_dir)
    all_curves = curves(runs)
    figures = _draw_figures(runs, all_curves, out_dir, smoothing)
    finals = _final_rows(all_curves, final_k)
    times = {run.display: phase_times(run) for run in runs}
    models = eval_models(runs)
    queries = sample_queries(models, n_sample_queries)
    collapse = eval_collapse(models)
    pass_at_k = {run.display: rows for run in runs if (rows := read_pass_at_k(run.path))}

    summary = {
        "kind": REPORT_KIND,
        "runs": [_run_summary(run) for run in runs],
        "final_k": final_k,
        "smoothing": smoothing,
        "final": finals,
        "games": game_rows(runs, final_k),
        "wall_time_s": times,
        "eval": collapse,
        "pass_at_k": pass_at_k,
        "figures": figures,
    }
    (out_dir / SUMMARY_FILE).write_text(json.dumps(_json_safe(summary), indent=2) + "\n", encoding="utf-8")

    sections = [
        _runs_section(runs),
        _figures_section(runs, figures, smoothing),
        _final_section(finals, final_k, summary["games"]),
        _time_section(times),
        _samples_section(runs, models, queries),
        _collapse_section(collapse, held_out=not _training_queries(runs)),
        *([_pass_at_k_section(pass_at_k)] if pass_at_k else []),
    ]
    report = out_dir / REPORT_FILE
    report.write_text("\n\n".join(["# marllm run report", *sections]) + "\n", encoding="utf-8")
    remove_stale(out_dir, earlier, [REPORT_FILE, SUMMARY_FILE, *(name for name in figures.values() if name)])
    return report


def _check_options(smoothing: int, final_k: int, n_sample_queries: int) -> None:
    if isinstance(smoothing, bool) or not isinstance(smoothing, int) or smoothing < 1:
        raise ValueError(f"smoothing must be an integer >= 1 (1 = no smoothing), got {smoothing!r}")
    if isinstance(final_k, bool) or not isinstance(final_k, int) or final_k < 1:
        raise ValueError(f"final_k must be an integer >= 1, got {final_k!r}")
    if isinstance(n_sample_queries, bool) or not isinstance(n_sample_queries, int) or n_sample_queries < 0:
        raise ValueError(f"n_sample_queries must be an integer >= 0, got {n_sample_queries!r}")


def _draw_figures(runs: Sequence[Run], all_curves: list[Any], out_dir: Path, smoothing: int) -> dict[str, str | None]:
    """Every figure of the report, into ``out_dir``: figure key -> file name (None where there was nothing to draw)."""
    colors = curve_colors(len(all_curves))
    figures: dict[str, str | None] = {}
    for metric, title in CURVE_METRICS:
        name = f"{metric}.png"
        drawn = save_figure(metric_figure(all_curves, colors, metric, title, smoothing), out_dir / name)
        figures[metric] = name if drawn else None
    by_role = save_figure(role_figure(runs, "task_reward", "Task reward by role", smoothing), out_dir / BY_ROLE_FILE)
    figures["task_reward_by_role"] = BY_ROLE_FILE if by_role else None
    figures["reward_vs_kl"] = SCATTER_FILE if plot_reward_vs_kl(all_curves, colors, out_dir / SCATTER_FILE) else None
    figures["collapse"] = COLLAPSE_FILE if plot_collapse(all_curves, colors, out_dir / COLLAPSE_FILE) else None
    return figures


def _final_rows(all_curves: list[Any], final_k: int) -> list[dict[str, Any]]:
    """Per curve (run and learner): the means of the final metrics over its last ``final_k`` iterations."""
    return [
        {
            "label": curve.label,
            "run": curve.run.display,
            "learner": curve.learner,
            "k": len(final_window(curve.run, final_k)),
            "window": [int(i) for i in final_window(curve.run, final_k)[[0, -1]]],
            **final_means(curve.run, curve.learner, [m for m, _ in FINAL_METRICS], final_k),
        }
        for curve in all_curves
    ]


def _run_summary(run: Run) -> dict[str, Any]:
    return {
        "label": run.display,
        "name": run.name,
        "dir": str(run.path),
        "learners": list(run.learners),
        "iterations": len(run.metrics),
        "planned_iterations": run.planned_iterations,
        "status": run.status,
        "finished": run.finished,
        "kl_metric": run.kl_metric,
        "exploitability_of": run.exploitability_of,
    }


def read_pass_at_k(run_dir: Path) -> list[dict[str, Any]]:
    """The run's ``pass_at_k.json`` (written for 0/1-reward tasks), or an empty list."""
    path = Path(run_dir) / PASS_AT_K_FILE
    if not path.is_file():
        return []
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from error
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "model" in r for r in rows):
        raise ValueError(f"{path}: expected a list of objects with a 'model' key")
    return rows


def _pass_at_k_section(results: dict[str, list[dict[str, Any]]]) -> str:
    ks = sorted(
        {int(key.split("@")[1]) for rows in results.values() for row in rows for key in row if key.startswith("pass@")}
    )
    header = ["run", "model", *(f"pass@{k}" for k in ks), "mean reward", "problems × samples"]
    rows = [
        [
            run,
            row["model"],
            *(fmt(row.get(f"pass@{k}")) for k in ks),
            fmt(row.get("mean_reward")),
            f"{row.get('num_problems')} × {row.get('samples_per_problem')}",
        ]
        for run, run_rows in results.items()
        for row in run_rows
    ]
    intro = (
        "Each model deployed alone (answering from the question only) on the task's evaluation split; pass@k is "
        "the unbiased estimator from n samples per problem. `base` is the model before training."
    )
    return "\n".join(["## pass@k", "", intro, "", markdown_table(header, rows)])


def _runs_section(runs: Sequence[Run]) -> str:
    rows = [
        [run.display, run.name, str(run.path), ", ".join(run.learners), _iterations_cell(run), run.status]
        for run in runs
    ]
    header = ["run", "name", "directory", "learners", "iterations", "status"]
    lines = ["## Runs", "", *_unfinished_warning(runs), markdown_table(header, rows)]
    kl_metrics = {run.kl_metric for run in runs if run.kl_metric}
    if kl_metrics:
        lines += ["", "KL as logged: " + "; ".join(sorted(kl_metrics)) + "."]
    measures = {run.exploitability_of for run in runs if run.exploitability_of}
    if measures:
        lines += ["", "Exploitability of " + "; ".join(sorted(measures)) + "."]
    return "\n".join(lines)


def _iterations_cell(run: Run) -> str:
    done = str(len(run.metrics))
    return f"{done} of {run.planned_iterations}" if run.planned_iterations is not None else done


def _unfinished_warning(runs: Sequence[Run]) -> list[str]:
    """A paragraph naming the runs that did not finish (none when all did)."""
    unfinished = [run for run in runs if not run.finished]
    if not unfinished:
        return []
    names = "; ".join(f"{run.label} in {run.path} ({run.state.describe()})" for run in unfinished)
    return [
        f"**Unfinished runs**: {names}. Their curves stop where they stopped and their final numbers, samples and "
        "pass@k are not those of a finished run; continue one with `marllm train CONFIG --resume RUN_DIR`.",
        "",
    ]


def _figures_section(runs: Sequence[Run], figures: dict[str, str | None], smoothing: int) -> str:
    lines = ["## Curves", ""]
    smoothed = [run.display for run in runs if smooths(len(run.metrics), smoothing)]
    short = [run.display for run in runs if smoothing > 1 and not smooths(len(run.metrics), smoothing)]
    if smoothed:
        lines += [f"Bold lines: moving average over {smoothing} iterations; faint lines: raw values.", ""]
    if short:
        who = "every run" if not smoothed else ", ".join(short)
        lines += [
            f"Raw values, bold, for {who}: shorter than {SMOOTHING_SPAN * smoothing} iterations ({SMOOTHING_SPAN} "
            f"windows of {smoothing}), too short for a moving average.",
            "",
        ]
    for metric, title in CURVE_METRICS:
        lines += [_figure(figures[metric], title, f"no run logged `<learner>/{metric}`"), ""]
    if figures.get("task_reward_by_role"):
        lines += [
            "### Task reward by role",
            "",
            "The learners change roles (`agents.role_period`): each line follows one role, whichever learner played "
            "it at that iteration.",
            "",
            _figure(figures["task_reward_by_role"], "Task reward by role", ""),
            "",
        ]
    lines += [
        "## Reward vs KL",
        "",
        "Each point is an iteration, the star the final one; up and left is better.",
        "",
    ]
    lines.append(_figure(figures["reward_vs_kl"], "Task reward vs KL", "no iteration logs both task reward and KL"))
    lines += ["", "## Collapse during training", ""]
    without = [run.display for run in runs if not run.samples]
    if without:
        lines += [f"No {SAMPLES_FILE} (or an empty one) in: {', '.join(without)}.", ""]
    lines.append(_figure(figures["collapse"], "Collapse indicators", "no run has training samples"))
    return "\n".join(lines)


def _figure(name: str | None, title: str, why_missing: str) -> str:
    return f"![{title}]({name})" if name else f"*{title}: no figure, {why_missing}.*"


def _final_section(finals: Sequence[dict[str, Any]], final_k: int, games: Sequence[dict[str, Any]]) -> str:
    """The final numbers' table, then the games' (:mod:`marllm.games.report`) for a game run."""
    header = ["model", "iterations averaged", *(title for _, title in FINAL_METRICS)]
    rows = [
        [
            f["label"],
            f"{f['window'][0]}–{f['window'][1]} (k={f['k']})",
            *(fmt(f[m]) for m, _ in FINAL_METRICS),
        ]
        for f in finals
    ]
    intro = (
        f"Mean over the last k = {final_k} iterations of each run (fewer when a run is shorter). "
        "Task reward is the model's own r(q, a); combined reward is task reward − η·KL (the paper's "
        "objective); the trained-on reward is the shared reward under CORY."
    )
    section = "\n".join(["## Final numbers", "", intro, "", markdown_table(header, rows)])
    return "\n\n".join([section, games_section(games, final_k)]) if games else section


def _time_section(times: dict[str, dict[str, float]]) -> str:
    phases = list(dict.fromkeys(phase for run_times in times.values() for phase in run_times))
    if not phases:
        return "## Wall time\n\n*No run logged `time/*` keys.*"
    header = ["run", *(p.removesuffix("_s") + " (s)" for p in phases)]
    rows = [[label, *(fmt(run_times.get(p)) for p in phases)] for label, run_times in times.items()]
    return "\n".join(["## Wall time", "", "Seconds summed over all iterations.", "", markdown_table(header, rows)])


def _training_queries(runs: Sequence[Run]) -> list[str]:
    """The runs whose end-of-run samples answer training queries (a task without evaluation rows)."""
    return [run.display for run in runs if run.eval_samples and run.eval_queries != HELD_OUT]


def _samples_section(runs: Sequence[Run], models: Sequence[EvalModel], queries: Sequence[str]) -> str:
    on_training = _training_queries(runs)
    lines = ["## Held-out samples" if not on_training else "## Evaluation samples", ""]
    without = [run.display for run in runs if not run.eval_samples]
    if without:
        lines += [f"No {EVAL_FILE} (or an empty one) in: {', '.join(without)}.", ""]
    if not models:
        return "\n".join(lines).rstrip()
    if queries:
        if not on_training:
            what = f"The first {len(queries)} held-out queries"
        elif len(on_training) == len([run for run in runs if run.eval_samples]):
            what = (
                f"The first {len(queries)} training queries (the task has no evaluation split, `eval_split: null`: "
                "these queries are not held out)"
            )
        else:
            what = (
                f"The first {len(queries)} queries (training queries, not held out, for {', '.join(on_training)}: "
                "its task has no evaluation split)"
            )
        lines += [
            f"{what}; each model answers from the query alone (r = task reward).",
            "",
            sample_table(models, queries),
        ]
    return "\n".join(lines)


def _collapse_section(collapse: Sequence[dict[str, Any]], held_out: bool = True) -> str:
    if not collapse:
        return "## Collapse indicators\n\n*No held-out samples to measure.*"
    header = ["model", "answers", "task reward", "distinct-1", "distinct-2", "repeated tokens", "mean words"]
    rows = [
        [
            c["label"],
            str(c["n_responses"]),
            fmt(c["task_reward"]),
            fmt(c["distinct_1"], 3),
            fmt(c["distinct_2"], 3),
            fmt(c["repeated_fraction"], 3),
            fmt(c["mean_length"], 3),
        ]
        for c in collapse
    ]
    intro = (
        f"Over all {'held-out' if held_out else 'end-of-run (evaluation)'} answers of each model (lower-cased "
        "whitespace tokens). Distinct-n: unique n-grams "
        "/ all n-grams; repeated tokens: fraction of tokens already seen in the same answer. Low distinct-n "
        "and many repeats point to mode collapse."
    )
    return "\n".join(["## Collapse indicators", "", intro, "", markdown_table(header, rows)])


def _json_safe(value: Any) -> Any:
    """NaN and infinities become null: ``summary.json`` stays standard JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
