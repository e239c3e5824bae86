"""What a run is built from a config: the tokenizer, the task, the wrapped env, the learners and their reference."""

from __future__ import annotations

import torch
from pettingzoo import AECEnv

from marllm.assets import resolve_model
from marllm.config import TrainConfig
from marllm.envs.text_env import env as text_env
from marllm.games.training import build_game_setup
from marllm.models.policy import load_tokenizer
from marllm.parallel.distributed import DataParallel, reseed_sampling
from marllm.run.learners import learners_from_config
from marllm.run.parts import Setup, wrap_for_agents
from marllm.tasks.base import TaskParts


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


def build(config: TrainConfig, data_parallel: DataParallel | None = None) -> Setup:
    """Load the base model once per learner plus one shared reference per base, the task, and the wrapped env.

    The model, reward model and dataset references are checked first, before anything loads. ``data_parallel``:
    this process's rank of a data-parallel run (:mod:`marllm.parallel.distributed`), which plays its slice of each
    batch. A config with a ``game`` section plays the game instead of the text env, with no task
    (:func:`marllm.games.training.build_game_setup`).
    """
    config.check_references()
    torch.manual_seed(config.seed)
    model_path = resolve_model(config.model.name_or_path)
    tokenizer = load_tokenizer(model_path, trust_remote_code=config.model.trust_remote_code)
    if config.game is not None:
        return build_game_setup(config, tokenizer)
    task = config.task.build(tokenizer, config.seed, config.model.device)
    env = build_env(config, task, data_parallel)
    learners, reference = learners_from_config(config, tokenizer, data_parallel)
    reseed_sampling(config.seed, data_parallel)
    devices = {str(next(learner.model.parameters()).device) for learner in learners.values()}
    concurrent = config.model.lora is None and len(devices) == len(learners) > 1
    return Setup(config, env, learners, task, reference, tokenizer, concurrent)
