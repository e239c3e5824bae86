"""Held-out samples: the models a report shows, the paper-style sample table and collapse statistics."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from marllm.reporting.indicators import collapse_indicators
from marllm.reporting.runs import BASE_MODEL, Run, as_number
from marllm.reporting.tables import MISSING, escape_cell, fmt, markdown_table


@dataclass(frozen=True)
class EvalModel:
    """The held-out answers of one deployed model, e.g. "Base" or "CORY-LLM2"."""

    label: str
    run: Run
    model: str
    rows: tuple[dict[str, Any], ...]

    def first_by_query(self) -> dict[str, dict[str, Any]]:
        """The first answer to each query (a model may have several answers per query, e.g. for pass@k)."""
        first: dict[str, dict[str, Any]] = {}
        for row in self.rows:
            first.setdefault(row["query"], row)
        return first

    def mean_reward(self) -> float | None:
        rewards = [r for r in (as_number(row.get("task_reward")) for row in self.rows) if r is not None]
        return float(np.mean(rewards)) if rewards else None


def eval_models(runs: Sequence[Run]) -> list[EvalModel]:
    """One entry per deployed model: the base model, then each run's models in learner order.

    The base rows are repeated in every run directory; when they are the same everywhere they form one "Base"
    entry, otherwise (different seeds or queries) each run keeps its own "Base (RUN)" entry.
    """
    bases = [(run, _rows_of(run, BASE_MODEL)) for run in runs]
    bases = [(run, rows) for run, rows in bases if rows]
    models: list[EvalModel] = []
    if bases:
        contents = {tuple(sorted((r["query"], r["response"]) for r in rows)) for _, rows in bases}
        if len(contents) == 1:
            models.append(EvalModel("Base", bases[0][0], BASE_MODEL, bases[0][1]))
        else:
            models += [EvalModel(f"Base ({run.display})", run, BASE_MODEL, rows) for run, rows in bases]
    for run in runs:
        seen = {row["model"]: None for row in run.eval_samples if row["model"] != BASE_MODEL}
        ordered = [m for m in run.learners if m in seen] + [m for m in seen if m not in run.learners]
        models += [EvalModel(run.model_label(m), run, m, _rows_of(run, m)) for m in ordered]
    return models


def sample_queries(models: Sequence[EvalModel], n: int) -> list[str]:
    """The first ``n`` distinct held-out queries, in the order they first appear."""
    queries: dict[str, None] = {}
    for model in models:
        for row in model.rows:
            queries.setdefault(row["query"], None)
    return list(queries)[:n]


def sample_table(models: Sequence[EvalModel], queries: Sequence[str]) -> str:
    """Markdown table, one row per query: the query, then each model's answer with its task reward."""
    answers = [model.first_by_query() for model in models]
    rows = []
    for query in queries:
        cells = [escape_cell(query)]
        for answer in answers:
            row = answer.get(query)
            if row is None:
                cells.append(MISSING)
            else:
                cells.append(
                    f"{escape_cell(row['response'])} (r = {fmt(as_number(row.get('task_reward')), 3)})"
                )
        rows.append(cells)
    return markdown_table(["query", *(m.label for m in models)], rows, escape=False)


def eval_collapse(models: Sequence[EvalModel]) -> list[dict[str, Any]]:
    """Per model: number of answers, mean held-out task reward and the collapse indicators of its answers."""
    return [
        {
            "label": model.label,
            "run": model.run.display,
            "model": model.model,
            "n_responses": len(model.rows),
            "task_reward": model.mean_reward(),
            **collapse_indicators([row["response"] for row in model.rows]),
        }
        for model in models
    ]


def collapse_per_iteration(run: Run, learner: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Collapse indicators of one learner's logged training samples, per iteration.

    Returns ``(iterations, {indicator: values})``, each array of shape (n_iterations_with_samples,).
    """
    by_iteration: dict[int, list[str]] = {}
    for row in run.samples:
        if row["learner"] == learner:
            by_iteration.setdefault(row["iteration"], []).append(row["response"])
    iterations = sorted(by_iteration)
    stats = [collapse_indicators(by_iteration[i]) for i in iterations]
    keys = stats[0].keys() if stats else ()
    return np.array(iterations, dtype=np.int64), {k: np.array([s[k] for s in stats]) for k in keys}


def _rows_of(run: Run, model: str) -> tuple[dict[str, Any], ...]:
    return tuple(row for row in run.eval_samples if row["model"] == model)
