"""The game results of a study's cells: win, draw, loss, illegal moves, payoff, cooperation and exploitability per
learner and seat, each seed's final value aggregated over the cell's seeds (the keys of
:mod:`marllm.games.report`)."""

from __future__ import annotations

from typing import Any

from marllm.games.report import ALL_SEATS, GAME_METRICS, MEASURED_NOW_AND_THEN, game_key, game_seats
from marllm.reporting.tables import escape_cell, fmt, markdown_table
from marllm.studies.aggregate import estimate, final_value
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
                    metrics[metric] = {**estimate(per_seed).as_dict(), "per_seed": per_seed}
            rows.append({"learner": learner, "seat": seat, "metrics": metrics})
    return rows


def games_lines(cells: list[dict[str, Any]], window: str) -> list[str]:
    """The study report's "Games" section (empty when no cell played a game): a row per cell, learner and seat;
    ``window`` says what each seed's final value averaged (``last 5 iterations``,
    :func:`~marllm.studies.aggregate.last_iterations_label`)."""
    rows = [(cell["label"], row) for cell in cells for row in cell.get("games", [])]
    if not rows:
        return []
    shown = [m for m in GAME_METRICS if any(m in row["metrics"] for _, row in rows)]

    def cell_text(entry: dict[str, Any] | None) -> str:
        if entry is None:
            return "–"
        return f"{fmt(entry['mean'])} ± {'–' if entry['std'] is None else fmt(entry['std'])}"

    table = [
        [escape_cell(label), escape_cell(row["learner"]), escape_cell(row["seat"]),
         *(cell_text(row["metrics"].get(m)) for m in shown), str(max(e["n"] for e in row["metrics"].values()))]
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
