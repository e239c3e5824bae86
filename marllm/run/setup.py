"""What a run is built from a config: the tokenizer, the task, the wrapped env, the learners and their reference."""

from __future__ import annotations

import torch
from pettingzoo import AECEnv

from marllm.assets import resolve_model
from marllm.config import TrainConfig
from marllm.envs.text_env import env as text_env
from marllm.games.training import build_game_setup
from marllm.models.policy import load_tokenizer, resolve_dtype
from marllm.parallel.distributed import join_ranks, launched_world_size
from marllm.parallel.placement import DataParallel, Placement, Sharded
from marllm.run.learners import learners_from_config
from marllm.run.parts import Setup, wrap_for_agents
from marllm.tasks.base import TaskParts


def run_placement(config: TrainConfig) -> Placement:
    """The placement this process trains under, chosen once from the launcher's ranks and ``model.fsdp`` (the
    config checked against the number of ranks first): whole models on one process, data-parallel whole models, or
    FSDP models split over the ranks. Joins the ranks' process group (:meth:`Placement.close` leaves it).

    Raises:
        ConfigError: the config does not fit the number of ranks.
    """
    config.check_placement(launched_world_size())
    model = config.model
    if not join_ranks(model.device):
        return Placement()
    if not model.fsdp:
        return DataParallel.of_default_group()
    compute_dtype = resolve_dtype(model.fsdp_compute_dtype) if model.fsdp_compute_dtype is not None else None
    return Sharded.of_default_group(compute_dtype=compute_dtype, gather_for_generation=model.fsdp_gather_for_generation)


def build_env(config: TrainConfig, task: TaskParts, placement: Placement | None = None) -> AECEnv:
    """The text env of ``config``, wrapped by SharedReward (if rewards are shared) and RolePermutation: the env of
    this process's slice of each batch under ``placement`` (None: the whole batch)."""
    env = text_env(
        dataset=task.dataset,
        roles=config.env.roles,
        templates=config.role_templates(task.templates),
        reward_fn=task.reward_fn,
        batch_size=config.env.batch_size,
        group_size=config.env.group_size,
        turns=config.env.turns,
        turn_rewards=config.env.turn_rewards,
        shard=(placement or Placement()).env_shard(),
    )
    return wrap_for_agents(env, config, config.learner_ids)


def build(config: TrainConfig, placement: Placement | None = None) -> Setup:
    """Load the base model once per learner plus one shared reference per base, the task, and the wrapped env.

    The model, reward model and dataset references are checked first, before anything loads. ``placement``: where
    the models live across processes (:func:`run_placement`; None: whole models on one process); a data-parallel
    rank plays its slice of each batch. A config with a ``game`` section plays the game instead of the text env,
    with no task, on one process (:func:`marllm.games.training.build_game_setup`).
    """
    config.check_references()
    torch.manual_seed(config.seed)
    model_path = resolve_model(config.model.name_or_path)
    tokenizer = load_tokenizer(model_path, trust_remote_code=config.model.trust_remote_code)
    if config.game is not None:
        return build_game_setup(config, tokenizer)
    task = config.task.build(tokenizer, config.seed, config.model.device)
    placement = placement if placement is not None else Placement()
    env = build_env(config, task, placement)
    learners, reference = learners_from_config(config, tokenizer, placement)
    placement.reseed_sampling(config.seed)
    devices = {str(next(learner.model.parameters()).device) for learner in learners.values()}
    concurrent = config.model.lora is None and len(devices) == len(learners) > 1
    return Setup(config, env, learners, task, reference, tokenizer, concurrent, placement=placement)
