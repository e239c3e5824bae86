"""The game results of a run: win, draw and loss rates, illegal moves, payoff, cooperation and exploitability.

A game run logs them per learner as ``<learner>/game/<metric>`` (over the seats it played) and per seat as
``<learner>/game/<seat>/<metric>`` (:func:`marllm.games.training.game_metrics`); exploitability, where measured
(``game.exploitability``), as ``<learner>/game/exploitability``. :func:`game_rows` gives one row per
run, learner and seat (``all seats`` first) with each metric's mean over the run's last ``k`` iterations, and
:func:`games_section` the report's markdown; :mod:`marllm.studies.report` aggregates the same keys over seeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from marllm.reporting.indicators import final_means
from marllm.reporting.runs import Run
from marllm.reporting.tables import fmt, markdown_table

GAME_PREFIX = "game/"
"""What follows ``<learner>/`` in a game metric's key."""

GAME_METRICS = {
    "win_rate": "win",
    "draw_rate": "draw",
    "loss_rate": "loss",
    "illegal_move_rate": "illegal moves",
    "payoff": "payoff",
    "cooperation_rate": "cooperation",
    "exploitability": "exploitability",
    "exploitability_average": "exploitability of the average policy",
}
"""The game metrics a report shows, as (metric, column header); a column no row has is left out."""

MEASURED_NOW_AND_THEN = ("exploitability", "exploitability_average")
"""The metrics measured every ``game.exploitability.every`` iterations only: a report shows their last
measurement."""

ALL_SEATS = "all seats"
"""The seat column of a learner's metrics over every seat it played."""


def game_key(seat: str, metric: str) -> str:
    """The key of a game metric after ``<learner>/``: ``game/<metric>`` for :data:`ALL_SEATS`, else
    ``game/<seat>/<metric>``."""
    return f"{GAME_PREFIX}{metric}" if seat == ALL_SEATS else f"{GAME_PREFIX}{seat}/{metric}"


def game_seats(runs: Sequence[Run], learner: str) -> list[str]:
    """:data:`ALL_SEATS`, then each seat ``learner`` played in any of ``runs`` (order of first appearance); ``[]``
    when no run logs a game metric of that learner."""
    seats: dict[str, None] = {}
    found = False
    for run in runs:
        prefix = f"{learner}/{GAME_PREFIX}"
        for line in run.metrics:
            for key in line:
                if not key.startswith(prefix):
                    continue
                found = True
                rest = key[len(prefix) :]
                if "/" in rest and rest.rsplit("/", 1)[1] in GAME_METRICS:
                    seats.setdefault(rest.rsplit("/", 1)[0])
    return [ALL_SEATS, *seats] if found else []


def game_rows(runs: Sequence[Run], final_k: int) -> list[dict[str, Any]]:
    """One row per run, learner and seat that logged game metrics: ``run``, ``learner``, ``seat`` and each of
    :data:`GAME_METRICS`, the mean over the run's last ``final_k`` iterations (None where it was not logged there;
    the exploitabilities, measured every ``game.exploitability.every`` iterations only, are their last
    measurement)."""
    rows = []
    for run in runs:
        for learner in run.learners:
            for seat in game_seats([run], learner):
                keys = {metric: game_key(seat, metric) for metric in GAME_METRICS}
                means = final_means(run, learner, list(keys.values()), final_k)
                row: dict[str, Any] = {"run": run.display, "learner": learner, "seat": seat}
                row |= {metric: means[key] for metric, key in keys.items()}
                for metric in MEASURED_NOW_AND_THEN:
                    _, measured = run.series(f"{learner}/{keys[metric]}")
                    row[metric] = float(measured[-1]) if len(measured) else None
                rows.append(row)
    return rows


def shown_metrics(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The metrics of :data:`GAME_METRICS` some row holds (cooperation only in social dilemmas, exploitability only
    where measured)."""
    return [metric for metric in GAME_METRICS if any(row.get(metric) is not None for row in rows)]


def games_section(rows: Sequence[dict[str, Any]], final_k: int) -> str:
    """The report's "Games" section: the table of :func:`game_rows`."""
    metrics = shown_metrics(rows)
    header = ["run", "learner", "seat", *(GAME_METRICS[m] for m in metrics)]
    table = [[row["run"], row["learner"], row["seat"], *(fmt(row[m]) for m in metrics)] for row in rows]
    intro = (
        f"Mean over the last k = {final_k} iterations of each run: the rates of games won, drawn and lost, the "
        "fraction of answers naming no legal move, and the game's payoff per game, per learner over every seat it "
        f"played ({ALL_SEATS}) and per seat"
        + ("; cooperation: the legal answers that cooperate" if "cooperation_rate" in metrics else "")
        + ("; exploitability: its last measurement (0 at a Nash equilibrium)" if "exploitability" in metrics else "")
        + (
            "; of the average policy: of the reach-weighted average of the policies measured so far (what self-play "
            "converges to where its last iterate cycles)"
            if "exploitability_average" in metrics
            else ""
        )
        + "."
    )
    return "\n".join(["## Games", "", intro, "", markdown_table(header, table)])
