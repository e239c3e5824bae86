"""The game results of a study's cells: win, draw, loss, illegal moves, payoff, cooperation and exploitability per
learner and seat (the keys of :mod:`marllm.games.report`), and every other measure the game logged per learner (a
view's own: an agreement rate, a mutual information), each seed's final value aggregated over the cell's seeds."""

from __future__ import annotations

from typing import Any

from marllm.games.report import ALL_SEATS, GAME_METRICS, GAME_PREFIX, MEASURED_NOW_AND_THEN, game_key, game_seats
from marllm.reporting.tables import escape_cell, markdown_table
from marllm.studies.aggregate import final_value, interval_text, mean_std_text, seed_summary
from marllm.studies.cells import Cell


def cell_games(cell: Cell, last_k: int) -> list[dict[str, Any]]:
    """One row per learner and seat of a cell that logged game metrics (:data:`ALL_SEATS` first):
    ``learner``, ``seat`` and ``metrics``, metric -> the estimate over seeds of each seed's mean of its last
    ``last_k`` logged values (the exploitabilities: their last measurement), with ``per_seed``."""
    rows = []
    for learner in cell.learners:
        for seat in game_seats(cell.runs, learner):
            metrics = {}
            for metric in GAME_METRICS:
                seeds = cell.seed_series(game_key(seat, metric), learner)
                if seeds:
                    k = 1 if metric in MEASURED_NOW_AND_THEN else last_k
                    per_seed = [final_value(values, k) for _, values in seeds]
                    metrics[metric] = seed_summary(per_seed)
            rows.append({"learner": learner, "seat": seat, "metrics": metrics})
    return rows


def cell_measures(cell: Cell, last_k: int) -> list[dict[str, Any]]:
    """One row per learner of a cell and game measure it logged over every seat (``<learner>/game/<name>``) that is
    not among :data:`~marllm.games.report.GAME_METRICS`: ``learner``, ``measure`` and the estimate over seeds of
    each seed's mean of its last ``last_k`` values, with ``per_seed``."""
    rows = []
    for learner in cell.learners:
        prefix = f"{learner}/{GAME_PREFIX}"
        names = dict.fromkeys(
            key[len(prefix) :]
            for run in cell.runs
            for line in run.metrics
            for key in line
            if key.startswith(prefix) and "/" not in key[len(prefix) :]
        )
        for name in (name for name in names if name not in GAME_METRICS):
            seeds = cell.seed_series(game_key(ALL_SEATS, name), learner)
            per_seed = [final_value(values, last_k) for _, values in seeds]
            if per_seed:
                rows.append({"learner": learner, "measure": name, **seed_summary(per_seed)})
    return rows


def measures_lines(cells: list[dict[str, Any]], window: str) -> list[str]:
    """The study report's "The game's other measures" section (empty when no cell logged one): a row per cell,
    learner and measure, its mean ± std and 95% interval over seeds."""
    rows = [(cell["label"], row) for cell in cells for row in cell.get("game_measures", [])]
    if not rows:
        return []
    table = [
        [escape_cell(label), escape_cell(row["learner"]), escape_cell(row["measure"]), mean_std_text(row),
         interval_text(row), str(row["n"])]
        for label, row in rows
    ]  # fmt: skip
    return [
        f"## The game's other measures (mean ± std over seeds of each seed's mean over its {window})",
        "",
        "Every other measure the game logged per learner over the seats it played: the env's (moves and length of a "
        "game, forfeits, capped games) and the view's own.",
        "",
        markdown_table(["cell", "learner", "measure", "mean ± std", "95% interval", "n"], table, escape=False),
        "",
    ]


def games_lines(cells: list[dict[str, Any]], window: str) -> list[str]:
    """The study report's "Games" section (empty when no cell played a game): a row per cell, learner and seat;
    ``window`` says what each seed's final value averaged (``last 5 iterations``,
    :func:`~marllm.studies.aggregate.last_iterations_label`)."""
    rows = [(cell["label"], row) for cell in cells for row in cell.get("games", [])]
    if not rows:
        return []
    shown = [m for m in GAME_METRICS if any(m in row["metrics"] for _, row in rows)]

    table = [
        [escape_cell(label), escape_cell(row["learner"]), escape_cell(row["seat"]),
         *(mean_std_text(row["metrics"][m]) if m in row["metrics"] else "–" for m in shown),
         str(max(e["n"] for e in row["metrics"].values()))]
        for label, row in rows if row["metrics"]
    ]  # fmt: skip
    header = ["cell", "learner", "seat", *(GAME_METRICS[m] for m in shown), "n"]
    return [
        f"## Games (mean ± std over seeds of each seed's mean over its {window})",
        "",
        f"Per learner over every seat it played ({ALL_SEATS}) and per seat: the rates of games won, drawn and lost, "
        "the fraction of answers naming no legal move and the payoff per game"
        + ("; cooperation: the legal answers that cooperate" if "cooperation_rate" in shown else "")
        + ("; exploitability: each seed's last measurement" if "exploitability" in shown else "")
        + ("; of the average policy: of the policies measured so far" if "exploitability_average" in shown else "")
        + ".",
        "",
        markdown_table(header, table, escape=False),
        "",
    ]
