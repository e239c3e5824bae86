"""Statistics over the seeds of a study: curves, final values, comparisons and Pareto frontiers.

Pure functions on numbers and numpy arrays (and the report's text of an estimate); nothing here reads files. A
*cell* is a variant plus its axis values, and its seeds are the replicates. Means and differences carry the 95%
Student-t intervals of :mod:`marllm.utils.statistics` (Welch for a difference of two cells: seeds are not paired
across variants).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from marllm.reporting.tables import fmt
from marllm.utils.statistics import (
    CONFIDENCE,
    Difference,
    Estimate,
    estimate,
    t_cdf,
    t_pdf,
    t_quantile,
    welch_difference,
)

__all__ = [
    "CONFIDENCE",
    "Difference",
    "Estimate",
    "estimate",
    "final_value",
    "interval_text",
    "last_iterations_label",
    "mean_curve",
    "mean_over_learners",
    "mean_std_text",
    "pareto_front",
    "seed_summary",
    "t_cdf",
    "t_pdf",
    "t_quantile",
    "welch_difference",
]


def final_value(values: Sequence[float] | np.ndarray, last_k: int = 5) -> float:
    """The mean of the last ``last_k`` values of one seed's curve (all of them when the curve is shorter)."""
    if last_k < 1:
        raise ValueError(f"last_k must be at least 1, got {last_k}")
    x = np.asarray(values, dtype=np.float64)
    if len(x) == 0:
        raise ValueError("final_value needs at least one value")
    return float(x[-last_k:].mean())


def seed_summary(per_seed: list[float]) -> dict[str, Any]:
    """The estimate over seeds of ``per_seed`` (mean, std, ``ci_low``, ``ci_high``, n) and ``per_seed`` itself."""
    return {**estimate(per_seed).as_dict(), "per_seed": per_seed}


def mean_std_text(entry: Mapping[str, Any]) -> str:
    """``mean ± std`` of a :func:`seed_summary` (a dash for a std one seed leaves undefined)."""
    return f"{fmt(entry['mean'])} ± {'–' if entry['std'] is None else fmt(entry['std'])}"


def interval_text(entry: Mapping[str, Any]) -> str:
    """``[ci_low, ci_high]`` of a :func:`seed_summary` or a Welch difference, a dash where there is none."""
    return "–" if entry["ci_low"] is None else f"[{fmt(entry['ci_low'])}, {fmt(entry['ci_high'])}]"


def last_iterations_label(last_k: int, averaged: Sequence[int]) -> str:
    """What final values averaged, for a report: ``last 5 iterations`` when every curve had ``last_k`` values, else
    the counts actually taken (``averaged``: one per curve, each ``min(last_k, its length)``):
    ``last 3 iterations (of 3: the runs are shorter than the 5 asked)`` or
    ``last 2–5 iterations (all of a run shorter than the 5 asked)``."""
    if last_k < 1:
        raise ValueError(f"last_k must be at least 1, got {last_k}")
    if not averaged:
        return f"last {last_k} iteration{'' if last_k == 1 else 's'}"
    low, high = min(averaged), max(averaged)
    if low == high == last_k:
        return f"last {last_k} iteration{'' if last_k == 1 else 's'}"
    if low == high:
        return f"last {low} iteration{'' if low == 1 else 's'} (of {low}: the runs are shorter than the {last_k} asked)"
    return f"last {low}–{high} iterations (all of a run shorter than the {last_k} asked)"


def mean_curve(
    series: Sequence[tuple[np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Across seeds, at each iteration: ``(iterations, mean, std, n)``.

    ``series`` holds one ``(iterations, values)`` pair per seed. An iteration is included when at least one seed
    logs it; ``n`` counts the seeds there and ``std`` (ddof=1) is NaN where ``n < 2``.
    """
    by_iteration: dict[int, list[float]] = {}
    for iterations, values in series:
        for it, value in zip(np.asarray(iterations).tolist(), np.asarray(values).tolist(), strict=True):
            by_iteration.setdefault(int(it), []).append(float(value))
    its = np.array(sorted(by_iteration), dtype=np.int64)
    groups = [np.array(by_iteration[i]) for i in its.tolist()]
    mean = np.array([g.mean() for g in groups], dtype=np.float64)
    std = np.array([g.std(ddof=1) if len(g) > 1 else np.nan for g in groups], dtype=np.float64)
    n = np.array([len(g) for g in groups], dtype=np.int64)
    return its, mean, std, n


def mean_over_learners(series: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """One seed's ``(iterations, values)`` averaged over its learners, at the iterations every learner logs."""
    if not series:
        return np.array([], dtype=np.int64), np.array([], dtype=np.float64)
    common = series[0][0]
    for iterations, _ in series[1:]:
        common = np.intersect1d(common, iterations)
    rows = []
    for iterations, values in series:
        lookup = dict(zip(np.asarray(iterations).tolist(), np.asarray(values).tolist(), strict=True))
        rows.append([lookup[i] for i in common.tolist()])
    return np.asarray(common, dtype=np.int64), np.asarray(rows, dtype=np.float64).mean(axis=0)


def pareto_front(points: Mapping[str, tuple[float, float]]) -> list[str]:
    """The keys of the non-dominated ``(reward, kl)`` points: higher reward and lower KL are better.

    A point is dominated when another is at least as good in both and strictly better in one; points tied in
    both coordinates do not dominate each other, so all of them stay. The result is sorted by KL, then reward.
    """
    keep = []
    for key, (reward, kl) in points.items():
        dominated = any(
            r >= reward and k <= kl and (r > reward or k < kl) for other, (r, k) in points.items() if other != key
        )
        if not dominated:
            keep.append(key)
    return sorted(keep, key=lambda key: (points[key][1], points[key][0]))
