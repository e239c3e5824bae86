"""Numbers the report is made of: smoothing, final-window means, phase times and collapse indicators."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np

from marllm.reporting.runs import TIME_PREFIX, Run, as_number


def moving_average(values: Sequence[float], window: int) -> np.ndarray:
    """Trailing moving average, same length as ``values``.

    Point i is the mean of ``values[max(0, i - window + 1) : i + 1]``: the first ``window - 1`` points average
    what exists so far instead of being dropped, so the smoothed line starts where the raw one does.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"smoothing window must be an integer >= 1 (1 = no smoothing), got {window!r}")
    x = np.asarray(values, dtype=np.float64)
    cumsum = np.concatenate([[0.0], np.cumsum(x)])
    end = np.arange(1, len(x) + 1)
    start = np.maximum(end - window, 0)
    return (cumsum[end] - cumsum[start]) / (end - start)


def final_window(run: Run, k: int) -> np.ndarray:
    """The last ``min(k, n_iterations)`` iteration numbers of a run."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"final window must be an integer >= 1, got {k!r}")
    return run.iterations[-k:]


def final_means(run: Run, learner: str, metrics: Sequence[str], k: int) -> dict[str, float | None]:
    """Mean of each ``<learner>/<metric>`` over the run's last ``k`` iterations (fewer if the run is shorter).

    Iterations of the window where a metric was not logged are left out of its mean; a metric logged in none
    of them is None.
    """
    window = set(final_window(run, k).tolist())
    means: dict[str, float | None] = {}
    for metric in metrics:
        iterations, values = run.series(f"{learner}/{metric}")
        in_window = values[np.isin(iterations, list(window))]
        means[metric] = float(in_window.mean()) if len(in_window) else None
    return means


def phase_times(run: Run) -> dict[str, float]:
    """Seconds per phase summed over all iterations, from the ``time/<phase>`` keys (``generation_s``...)."""
    totals: dict[str, float] = {}
    for line in run.metrics:
        for key, value in line.items():
            seconds = as_number(value)
            if key.startswith(TIME_PREFIX) and seconds is not None:
                phase = key[len(TIME_PREFIX) :]
                totals[phase] = totals.get(phase, 0.0) + seconds
    return totals


def collapse_indicators(responses: Sequence[str]) -> dict[str, float]:
    """Diversity statistics of a set of responses; low distinct-n and high repetition signal mode collapse.

    Tokens are the lower-cased, whitespace-separated words of each response; n-grams never cross responses.

    - ``distinct_1`` / ``distinct_2``: unique unigrams / bigrams over all responses divided by their total
      count.
    - ``repeated_fraction``: fraction of tokens equal to a token seen earlier in the same response.
    - ``mean_length``: mean number of tokens per response.

    A ratio with nothing to count (e.g. no bigrams because every response has one word) is NaN.
    """
    if isinstance(responses, str):
        raise ValueError("responses must be a sequence of strings, not a single string")
    if len(responses) == 0:
        raise ValueError("collapse_indicators needs at least one response")
    unigrams: list[str] = []
    bigrams: list[tuple[str, str]] = []
    repeated = 0
    for i, response in enumerate(responses):
        if not isinstance(response, str):
            raise ValueError(f"responses[{i}] must be a string, got {type(response).__name__}")
        tokens = response.lower().split()
        unigrams.extend(tokens)
        bigrams.extend(pairwise(tokens))
        repeated += len(tokens) - len(set(tokens))
    return {
        "distinct_1": _ratio(len(set(unigrams)), len(unigrams)),
        "distinct_2": _ratio(len(set(bigrams)), len(bigrams)),
        "repeated_fraction": _ratio(repeated, len(unigrams)),
        "mean_length": len(unigrams) / len(responses),
    }


def _ratio(numerator: int, denominator: int) -> float:
    return numerator / denominator if denominator else float("nan")
