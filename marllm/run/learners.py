"""Learners from base models: one per learner id, with the frozen references they are penalised against.

A run's config is turned once into two specs: a :class:`~marllm.models.placement.ModelPlacement` (where and how the
models are loaded: :func:`model_placement`) and an :class:`~marllm.algorithms.catalog.AlgorithmOptions` (each
learner's algorithm and what some algorithms read: :func:`algorithm_options`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from marllm.algorithms.action_registry import DEFAULT_MODE
from marllm.algorithms.catalog import AlgorithmOptions, build_learner
from marllm.algorithms.learner import Learner
from marllm.algorithms.ppo_config import GenerationConfig, PPOConfig
from marllm.assets import resolve_model
from marllm.config import TrainConfig
from marllm.models.placement import ModelPlacement
from marllm.models.policy import ReferencePool, load_tokenizer
from marllm.parallel.placement import Placement

__all__ = ["ModelPlacement", "algorithm_options", "learners_from_config", "make_learners", "model_placement"]


def learners_from_config(
    config: TrainConfig, tokenizer: Any, processes: Placement | None = None
) -> tuple[dict[str, Learner], Any]:
    """The learners of ``config`` and their reference (see :func:`make_learners`), from its ``model``, ``agents``,
    ``ppo``, ``critic_free``, ``generation``, ``env.group_size`` and ``game`` settings.

    ``tokenizer`` is the tokenizer of ``model.name_or_path``; it is used when every learner starts from that model,
    and each base loads its own when ``agents.models`` names the learners' bases. ``processes``: the run's placement
    across processes (None: whole models on one process), handed to every learner.
    """
    options, placement = algorithm_options(config), model_placement(config, processes)
    tokenizer = None if config.agents.models else tokenizer  # several bases: each loads its own
    return make_learners(
        config.learner_models(), config.learner_ids, config.ppo, config.generation, config.seed, options, placement,
        tokenizer,
    )  # fmt: skip


def model_placement(config: TrainConfig, processes: Placement | None = None) -> ModelPlacement:
    """The placement a config's ``model`` and ``agents`` settings give, under the run's placement across
    ``processes`` (None: whole models on one process)."""
    model = config.model
    return ModelPlacement(
        dtype=model.dtype,
        reference_dtype=model.reference_dtype,
        device=model.device,
        devices=config.learner_devices(),
        reference_device=config.agents.reference_device,
        lora=model.lora,
        load_in_4bit=model.load_in_4bit,
        trust_remote_code=model.trust_remote_code,
        processes=processes if processes is not None else Placement(),
    )


def algorithm_options(config: TrainConfig) -> AlgorithmOptions:
    """The algorithm options a config gives: ``agents.algorithm``, ``critic_free``, ``env.group_size`` and the game's
    ``actions`` and ``action_normalization``."""
    game = config.game
    return AlgorithmOptions(
        algorithm=config.learner_algorithms(),
        critic_free=config.critic_free,
        group_size=config.env.group_size,
        actions=game.actions.mode if game is not None else DEFAULT_MODE,
        action_normalization=game.actions.normalization if game is not None else None,  # score's own setting
    )


def make_learners(
    model: str | Mapping[str, str],
    learner_ids: Sequence[str],
    ppo: PPOConfig | None = None,
    generation: GenerationConfig | None = None,
    seed: int = 0,
    algorithm: str | Mapping[str, str] | AlgorithmOptions = "ppo",
    placement: ModelPlacement | None = None,
    tokenizer: Any = None,
) -> tuple[dict[str, Learner], Any]:
    """One learner per id, each starting from its base model: ``model`` for all (a hub id, a local directory or a
    ``marllm:`` causal LM), or a mapping learner id -> model (heterogeneous agents; each base brings its tokenizer).

    Full models: each learner owns a copy and the learners of one base share one frozen reference (N policies + 1
    reference per base). LoRA (``placement.lora``): one base carries one adapter per learner that starts from it, and
    the reference is that base with adapters disabled. Returns the learners (keyed by id) and the separate reference
    model: one model when every learner shares one base, None for LoRA, and a dict base -> reference for several
    bases.

    ``seed`` seeds each learner's initial value head, its response lengths and mini-batch order, and leaves torch's
    global generator (which samples the responses) in a state that depends on ``seed`` alone.
    ``algorithm``: an algorithm name for all, a mapping learner id -> name (``ppo`` where not named), or
    :class:`~marllm.algorithms.catalog.AlgorithmOptions` with the options only some algorithms read (the
    critic-free settings, the env's group size, a game's actions); each learner's class comes from
    :data:`marllm.algorithms.catalog.ALGORITHM_REGISTRY` or a reference
    (:func:`~marllm.algorithms.catalog.build_learner`).
    ``placement``: where and how the models are loaded (:class:`ModelPlacement`; None: its defaults).
    ``tokenizer`` (optional) is the tokenizer of a single ``model``; with several bases each loads its own.
    """
    placement = placement if placement is not None else ModelPlacement()
    options = algorithm if isinstance(algorithm, AlgorithmOptions) else AlgorithmOptions(algorithm=algorithm)
    models = _models_by_learner(model, learner_ids)
    bases = list(dict.fromkeys(models[learner_id] for learner_id in learner_ids))
    if tokenizer is not None and len(bases) > 1:
        raise ValueError("make_learners: a tokenizer can be given for a single model only; each base loads its own")
    seeds = {learner_id: seed + i for i, learner_id in enumerate(learner_ids)}
    builder = _Builder(ppo, generation, seeds, options, placement)
    references = ReferencePool()
    learners: dict[str, Learner] = {}
    base_references: dict[str, Any] = {}
    for base in bases:
        group = [learner_id for learner_id in learner_ids if models[learner_id] == base]
        path = resolve_model(base)
        base_tokenizer = tokenizer or load_tokenizer(path, trust_remote_code=placement.trust_remote_code)
        if placement.lora is not None:
            learners.update(builder.lora_learners(path, group, base_tokenizer))
            continue
        base_references[base] = placement.load_reference(path, references)
        learners.update(builder.full_learners(path, group, base_tokenizer, base_references[base]))
    ordered = {learner_id: learners[learner_id] for learner_id in learner_ids}
    if placement.lora is not None:
        return ordered, None
    return ordered, base_references[bases[0]] if len(bases) == 1 else base_references


@dataclass(frozen=True)
class _Builder:
    """What every learner of one :func:`make_learners` call is built with."""

    ppo: PPOConfig | None
    generation: GenerationConfig | None
    seeds: dict[str, int]
    options: AlgorithmOptions
    placement: ModelPlacement

    def learner(self, learner_id: str, **kwargs: Any) -> Learner:
        """The learner of ``learner_id`` on ``kwargs``' model, tokenizer, reference (and adapter)."""
        kwargs.update(config=self.ppo, generation=self.generation, seed=self.seeds[learner_id])
        kwargs.update(placement=self.placement.processes)
        algorithm = self.options.algorithm_of(learner_id)
        return build_learner(algorithm, learner_id, self.options, **kwargs)

    def lora_learners(self, path: str, group: list[str], tokenizer: Any) -> dict[str, Learner]:
        """The learners of ``group``: adapters on one base loaded from ``path``, seeded by the group's first."""
        torch.manual_seed(self.seeds[group[0]])
        shared = self.placement.load_lora_base(path, group)
        return {
            learner_id: self.learner(learner_id, model=shared, tokenizer=tokenizer, reference=None, adapter=learner_id)
            for learner_id in group
        }

    def full_learners(self, path: str, group: list[str], tokenizer: Any, reference: Any) -> dict[str, Learner]:
        """The learners of ``group``: each a full copy of the base at ``path``, loaded after seeding with its seed."""
        learners = {}
        for learner_id in group:
            torch.manual_seed(self.seeds[learner_id])
            policy = self.placement.load_policy(path, learner_id)
            learners[learner_id] = self.learner(learner_id, model=policy, tokenizer=tokenizer, reference=reference)
        return learners


def _models_by_learner(model: str | Mapping[str, str], learner_ids: Sequence[str]) -> dict[str, str]:
    """Learner id -> base model, from one model for all or a mapping (which must name every learner)."""
    models = {learner_id: model for learner_id in learner_ids} if isinstance(model, str) else dict(model)
    missing = [learner_id for learner_id in learner_ids if learner_id not in models]
    if missing:
        raise ValueError(f"make_learners: no model for learner(s) {missing}; the mapping names {sorted(models)}")
    return models
