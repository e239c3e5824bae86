"""What a built run is made of (:class:`Setup`), and the wrapping every run's env gets for its agents
(:func:`wrap_for_agents`); :mod:`marllm.run.setup` builds a text run, :mod:`marllm.games.training` a game run."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pettingzoo import AECEnv

from marllm.algorithms.learner import Learner
from marllm.config import TrainConfig
from marllm.parallel.placement import Placement
from marllm.tasks.base import TaskParts
from marllm.wrappers import RolePermutation, SharedReward


@dataclass
class Setup:
    """Everything a run needs, built from a config."""

    config: TrainConfig
    env: AECEnv
    learners: dict[str, Learner]
    """Every player with a state, by id: the learners, then (a game's) the fixed opponents; what a checkpoint
    saves."""
    task: TaskParts | None
    """The text task; None for a game."""
    reference: Any
    tokenizer: Any
    concurrent_updates: bool = False
    """Whether the learners update at the same time: full-model learners, each on its own device."""
    seat_players: dict[str, Any] | None = None
    """A game's players by the env's agent ids (:mod:`marllm.games.seats`), what the loop drives; None: ``learners``,
    whose ids are the text env's agents."""
    metrics_hook: Callable[[dict[str, Any], Mapping[str, Mapping[str, Any]]], dict[str, Any]] | None = None
    """Adds what the env measured to an iteration's metrics, from the agents' final infos (a game's per-seat
    results); None: nothing."""
    metric_names: dict[str, str] | None = None
    """The loop's agent id -> the learner id its metrics go under (a game's seats); None: the agent ids."""
    placement: Placement = field(default_factory=Placement)
    """Where the models live across processes (:func:`marllm.run.setup.run_placement`): whether this process
    writes, which collectives every rank joins (gathering a state to save, the end-of-run evaluation's forwards)."""

    @property
    def trained_learners(self) -> dict[str, Learner]:
        """The learners that train (``config.learner_ids``), what the run exports to ``checkpoints/``."""
        return {learner_id: self.learners[learner_id] for learner_id in self.config.learner_ids}

    @property
    def players(self) -> dict[str, Any]:
        """The loop's agent id -> player mapping (:func:`~marllm.loop.run_iteration`)."""
        return self.learners if self.seat_players is None else self.seat_players

    def iteration_metrics(
        self, metrics: dict[str, Any], final_infos: Mapping[str, Mapping[str, Any]]
    ) -> dict[str, Any]:
        """An iteration's metrics, with what the env measured added from the agents' final infos (unchanged for the
        text env)."""
        return metrics if self.metrics_hook is None else self.metrics_hook(metrics, final_infos)

    @property
    def hooks(self) -> list[Any]:
        """The run's hooks (the metrics hook, if any): a checkpoint saves the state of those that have one (a game's
        running average policies; :func:`~marllm.run.checkpoint.save_checkpoint`'s ``parts``)."""
        return [] if self.metrics_hook is None else [self.metrics_hook]


def wrap_for_agents(env: AECEnv, config: TrainConfig, agent_ids: list[str]) -> AECEnv:
    """``env`` wrapped by SharedReward (when ``agents.reward_coefficients`` shares rewards) and by RolePermutation,
    whose agents are ``agent_ids`` rotating over the roles every ``agents.role_period`` episodes."""
    coefficients = config.coefficient_matrix()
    if coefficients is not None:
        env = SharedReward(env, coefficients)
    return RolePermutation(env, config.agents.role_period, agent_ids)
