"""The cells of a study: a variant at one set of axis values, with its finished runs (the seeds) and their series.

:class:`Cell` names the series a cell reports (each learner, ``as ROLE`` for each role its learners exchange, and
``mean`` over its learners) and gives each seed's ``(iterations, values)`` of a metric for any of them.
:mod:`marllm.studies.report` groups a study's runs into cells and summarises them; :mod:`marllm.studies.figures`
draws them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marllm.reporting.runs import Run
from marllm.studies.aggregate import mean_over_learners

METRICS = {"task_reward": "task reward", "kl": "KL", "combined_reward": "combined reward"}
MEAN = "mean"
ROLE_PREFIX = "as "


@dataclass
class Cell:
    """A variant at one set of axis values, with its finished runs (the seeds)."""

    variant: str
    axes: dict[str, Any]
    runs: list[Run] = field(default_factory=list)
    seeds: list[Any] = field(default_factory=list)

    @property
    def label(self) -> str:
        settings = ", ".join(f"{key}={show(value)}" for key, value in self.axes.items())
        return f"{self.variant} ({settings})" if settings else self.variant

    @property
    def learners(self) -> list[str]:
        found: dict[str, None] = {}
        for run in self.runs:
            found.update(dict.fromkeys(run.learners))
        return list(found)

    @property
    def exchanged_roles(self) -> list[str]:
        """The roles in order of first appearance when the learners exchange them (some learner played more than
        one role in some run), else ``[]``: without an exchange each role is one learner's series already."""
        roles: dict[str, None] = {}
        exchanged = False
        for run in self.runs:
            for learner in run.learners:
                held = run.roles_held(learner)
                exchanged |= len(held) > 1
                roles.update(dict.fromkeys(held))
        return list(roles) if exchanged else []

    @property
    def series_names(self) -> list[str]:
        """The learners, ``as ROLE`` for each exchanged role, then ``mean`` (equal to the learner for a
        single-learner cell)."""
        return [*self.learners, *(ROLE_PREFIX + role for role in self.exchanged_roles), MEAN]

    def seed_series(self, metric: str, learner: str) -> list[tuple[np.ndarray, np.ndarray]]:
        """One ``(iterations, values)`` per seed; ``mean`` averages the run's learners, ``as ROLE`` follows the
        learner that played ROLE at each iteration."""
        out = []
        for run in self.runs:
            if learner == MEAN:
                series = mean_over_learners([run.series(f"{name}/{metric}") for name in run.learners])
            elif learner.startswith(ROLE_PREFIX):
                series = run.role_series(metric, learner.removeprefix(ROLE_PREFIX))
            else:
                series = run.series(f"{learner}/{metric}")
            if len(series[1]):
                out.append(series)
        return out


def show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value
