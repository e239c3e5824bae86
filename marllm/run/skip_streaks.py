"""Runs of skipped updates: each learner's consecutive updates abandoned for a non-finite loss or gradient
(``ppo.guards.on_nonfinite: skip``), counted as a run goes and recovered from a resumed run's metrics."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from marllm.algorithms.ppo import NonFiniteLossError


def count_skips(
    streaks: dict[str, int],
    learners: Mapping[str, Any],
    metrics: Mapping[str, Any],
    limit: int,
    checkpointed: int | None,
) -> None:
    """Update ``streaks`` (learner id -> consecutive skipped updates) from one iteration's ``metrics``; say each
    skip on stderr.

    Raises:
        NonFiniteLossError: a learner skipped more than ``limit`` updates in a row; the message names the latest
            checkpoint (``checkpointed``, the iteration it holds), which is from before the first of them.
    """
    iteration = metrics["iteration"]
    for learner_id, learner in learners.items():
        if metrics.get(f"{learner_id}/nonfinite_skipped"):
            streaks[learner_id] = streaks.get(learner_id, 0) + 1
            print(
                f"marllm: iteration {iteration}: learner {learner_id!r} skipped its update "
                f"({streaks[learner_id]} in a row): {getattr(learner, 'last_nonfinite', None)}",
                file=sys.stderr,
                flush=True,
            )
        else:
            streaks[learner_id] = 0
    over = {learner_id: n for learner_id, n in streaks.items() if n > limit}
    if over:
        kept = f"iteration {checkpointed}" if checkpointed is not None else "none"
        raise NonFiniteLossError(
            f"learner(s) {sorted(over)} skipped more than ppo.guards.max_consecutive_skips = {limit} updates in a row "
            f"(non-finite loss or gradient; the last at iteration {iteration}); the run stops, and its latest "
            f"checkpoint ({kept}) is from before the first of these skips"
        )


def skip_streaks(history: Sequence[Mapping[str, Any]], learner_ids: Sequence[str]) -> dict[str, int]:
    """Each learner's consecutive skipped updates at the end of ``history`` (a resumed run's kept metrics)."""
    streaks = {}
    for learner_id in learner_ids:
        count = 0
        for metrics in reversed(history):
            if not metrics.get(f"{learner_id}/nonfinite_skipped"):
                break
            count += 1
        streaks[learner_id] = count
    return streaks
