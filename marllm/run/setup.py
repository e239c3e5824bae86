"""What a run is built from a config: the tokenizer, the task, the wrapped env, the learners and their reference."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from pettingzoo import AECEnv

from marllm.algorithms.learner import Learner
from marllm.assets import resolve_model
from marllm.config import TrainConfig
from marllm.envs.text_env import env as text_env
from marllm.models.policy import load_tokenizer
from marllm.parallel.distributed import DataParallel, reseed_sampling
from marllm.run.learners import learners_from_config
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
    """A game's players by the env's agent ids (:mod:`marllm.run.games`), what the loop drives; None: ``learners``,
    whose ids are the text env's agents."""
    metrics_hook: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    """Adds what the env measured to an iteration's metrics (a game's per-seat results); None: nothing."""

    @property
    def trained_learners(self) -> dict[str, Learner]:
        """The learners that train (``config.learner_ids``), what the run exports to ``checkpoints/``."""
        return {learner_id: self.learners[learner_id] for learner_id in self.config.learner_ids}

    @property
    def players(self) -> dict[str, Any]:
        """The loop's agent id -> player mapping (:func:`~marllm.loop.run_iteration`)."""
        return self.learners if self.seat_players is None else self.seat_players

    def iteration_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """An iteration's metrics, with what the env measured added (unchanged for the text env)."""
        return metrics if self.metrics_hook is None else self.metrics_hook(metrics)

    @property
    def sharded(self) -> bool:
        """Whether the models are sharded over the data-parallel ranks (``model.fsdp``): every rank then joins every
        forward, including the end-of-run evaluation's, and every gathering of a state to save."""
        return self.config.model.fsdp


def build_env(config: TrainConfig, task: TaskParts, data_parallel: DataParallel | None = None) -> AECEnv:
    """The text env of ``config``, wrapped by SharedReward (if rewards are shared) and RolePermutation; with
    ``data_parallel``, the env of its rank's slice of each batch."""
    env = text_env(
        dataset=task.dataset,
        roles=config.env.roles,
        templates=config.role_templates(task.templates),
        reward_fn=task.reward_fn,
        batch_size=config.env.batch_size,
        group_size=config.env.group_size,
        turns=config.env.turns,
        turn_rewards=config.env.turn_rewards,
        shard=(0, 1) if data_parallel is None else (data_parallel.rank, data_parallel.world_size),
    )
    return wrap_for_agents(env, config, config.learner_ids)


def wrap_for_agents(env: AECEnv, config: TrainConfig, agent_ids: list[str]) -> AECEnv:
    """``env`` wrapped by SharedReward (when ``agents.reward_coefficients`` shares rewards) and by RolePermutation,
    whose agents are ``agent_ids`` rotating over the roles every ``agents.role_period`` episodes."""
    coefficients = config.coefficient_matrix()
    if coefficients is not None:
        env = SharedReward(env, coefficients)
    return RolePermutation(env, config.agents.role_period, agent_ids)


def build(config: TrainConfig, data_parallel: DataParallel | None = None) -> Setup:
    """Load the base model once per learner plus one shared reference per base, the task, and the wrapped env.

    The model, reward model and dataset references are checked first, before anything loads. ``data_parallel``:
    this process's rank of a data-parallel run (:mod:`marllm.parallel.distributed`), which plays its slice of each
    batch. A config with a ``game`` section plays the game instead of the text env, with no task
    (:func:`marllm.run.games.build_game_setup`).
    """
    config.check_references()
    torch.manual_seed(config.seed)
    model_path = resolve_model(config.model.name_or_path)
    tokenizer = load_tokenizer(model_path, trust_remote_code=config.model.trust_remote_code)
    if config.game is not None:
        from marllm.run.games import build_game_setup

        return build_game_setup(config, tokenizer)
    task = config.task.build(tokenizer, config.seed, config.model.device)
    env = build_env(config, task, data_parallel)
    learners, reference = learners_from_config(config, tokenizer, data_parallel)
    reseed_sampling(config.seed, data_parallel)
    devices = {str(next(learner.model.parameters()).device) for learner in learners.values()}
    concurrent = config.model.lora is None and len(devices) == len(learners) > 1
    return Setup(config, env, learners, task, reference, tokenizer, concurrent)
