"""Learners from base models: one per learner id, with the frozen references they are penalised against.

A run's config is turned once into two specs: a :class:`ModelPlacement` (where and how the models are loaded) and an
:class:`~marllm.algorithms.catalog.AlgorithmOptions` (each learner's algorithm and what some algorithms read).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from marllm.algorithms.catalog import AlgorithmOptions, build_learner
from marllm.algorithms.learner import Learner
from marllm.algorithms.ppo_config import GenerationConfig, PPOConfig
from marllm.assets import resolve_model
from marllm.config import TrainConfig
from marllm.models.lora import LoraSettings, attach_adapters
from marllm.models.policy import ReferencePool, load_causal_lm, load_tokenizer, resolve_dtype
from marllm.parallel.distributed import DataParallel
from marllm.parallel.sharding import is_sharded, shard_module


@dataclass(frozen=True)
class ModelPlacement:
    """Where and how the learners' models are loaded; checked when made.

    Attributes:
        dtype: the dtype the models are loaded in (``float32``, ``bfloat16`` or ``float16``).
        device: where models go (``auto``: CUDA if available) unless ``devices`` or ``reference_device`` say otherwise.
        devices: learner id -> device, for the learners placed elsewhere than ``device`` (the learners of one LoRA
            base go on the first one's device).
        reference_device: where the shared frozen references go (None: ``device``).
        lora: make the learners of each base LoRA adapters on that one base (the reference is the base with adapters
            disabled); None gives each learner a full copy of its base and the learners of one base one shared
            reference.
        load_in_4bit: load a LoRA base in 4 bits (needs CUDA and bitsandbytes).
        trust_remote_code: let transformers run the Python code a hub model ships with (only for code you trust).
        fsdp: shard each policy and reference over the ranks of ``data_parallel`` (:mod:`marllm.parallel.sharding`):
            each is loaded on the CPU and its shards go to the rank's device. Full models only.
        fsdp_compute_dtype: the dtype the sharded models compute in (e.g. ``bfloat16``; None: ``dtype``).
        fsdp_gather_for_generation: whether sharded models are gathered whole for each ``generate`` call (else layer
            by layer at every token).
        data_parallel: this process's rank of a data-parallel run, handed to every learner (and what ``fsdp``
            shards over).
    """

    dtype: str = "float32"
    device: str = "auto"
    devices: Mapping[str, str] = field(default_factory=dict)
    reference_device: str | None = None
    lora: LoraSettings | None = None
    load_in_4bit: bool = False
    trust_remote_code: bool = False
    fsdp: bool = False
    fsdp_compute_dtype: str | None = None
    fsdp_gather_for_generation: bool = True
    data_parallel: DataParallel | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", dict(self.devices or {}))
        if self.fsdp_compute_dtype is not None:
            resolve_dtype(self.fsdp_compute_dtype)  # a known dtype name
            if not self.fsdp:
                raise ValueError("ModelPlacement: fsdp_compute_dtype is the compute dtype of sharded models: fsdp=True")
        spread = any(device != self.device for device in self.devices.values())
        if self.fsdp and (self.data_parallel is None or self.lora is not None or spread):
            raise ValueError(
                "ModelPlacement: fsdp shards full models (no lora) over the ranks of data_parallel, each on its rank's "
                "device (no devices per learner)"
            )

    @classmethod
    def from_config(cls, config: TrainConfig, data_parallel: DataParallel | None = None) -> ModelPlacement:
        """The placement a config's ``model`` and ``agents`` settings give, on this process's ``data_parallel``."""
        model = config.model
        return cls(
            dtype=model.dtype,
            device=model.device,
            devices=config.learner_devices(),
            reference_device=config.agents.reference_device,
            lora=model.lora,
            load_in_4bit=model.load_in_4bit,
            trust_remote_code=model.trust_remote_code,
            fsdp=model.fsdp,
            fsdp_compute_dtype=model.fsdp_compute_dtype,
            fsdp_gather_for_generation=model.fsdp_gather_for_generation,
            data_parallel=data_parallel,
        )

    def device_of(self, learner_id: str) -> str:
        """The device of ``learner_id``'s model: its own in ``devices``, else ``device``."""
        return self.devices.get(learner_id, self.device)

    def load_policy(self, path: str, learner_id: str) -> Any:
        """A full trainable copy of the base at ``path`` for ``learner_id``, on its device (sharded with ``fsdp``)."""
        on = "cpu" if self.fsdp else self.device_of(learner_id)
        policy = load_causal_lm(path, self.dtype, on, trust_remote_code=self.trust_remote_code)
        if self.fsdp:
            self._shard(policy)
        return policy

    def load_reference(self, path: str, references: ReferencePool) -> Any:
        """The frozen reference of the base at ``path``, from ``references`` (sharded with ``fsdp``)."""
        on = "cpu" if self.fsdp else self.reference_device or self.device
        reference = references.get(path, self.dtype, on, trust_remote_code=self.trust_remote_code)
        if self.fsdp and not is_sharded(reference):  # a pool's reference may be sharded already
            self._shard(reference)
        return reference

    def load_lora_base(self, path: str, learner_ids: list[str]) -> Any:
        """The base at ``path`` with one LoRA adapter per learner id, on the first learner's device."""
        on = self.device_of(learner_ids[0])
        shared = load_causal_lm(
            path, self.dtype, on, load_in_4bit=self.load_in_4bit, trust_remote_code=self.trust_remote_code
        )
        return attach_adapters(shared, learner_ids, self.lora)

    def _shard(self, module: torch.nn.Module) -> None:
        compute = resolve_dtype(self.fsdp_compute_dtype) if self.fsdp_compute_dtype is not None else None
        shard_module(module, self.data_parallel, compute, self.fsdp_gather_for_generation)


def learners_from_config(
    config: TrainConfig, tokenizer: Any, data_parallel: DataParallel | None = None
) -> tuple[dict[str, Learner], Any]:
    """The learners of ``config`` and their reference (see :func:`make_learners`), from its ``model``, ``agents``,
    ``ppo``, ``critic_free``, ``generation``, ``env.group_size`` and ``game`` settings.

    ``tokenizer`` is the tokenizer of ``model.name_or_path``; it is used when every learner starts from that model,
    and each base loads its own when ``agents.models`` names the learners' bases. ``data_parallel``: this process's
    rank of a data-parallel run, handed to every learner.
    """
    heterogeneous = bool(config.agents.models)
    return make_learners(
        config.learner_models() if heterogeneous else resolve_model(config.model.name_or_path),
        config.learner_ids,
        config.ppo,
        config.generation,
        config.seed,
        algorithm_options(config),
        ModelPlacement.from_config(config, data_parallel),
        None if heterogeneous else tokenizer,
    )


def algorithm_options(config: TrainConfig) -> AlgorithmOptions:
    """The algorithm options a config gives: ``agents.algorithm``, ``critic_free``, ``env.group_size`` and the game's
    ``actions`` and ``action_normalization``."""
    game = config.game
    return AlgorithmOptions(
        algorithm=config.learner_algorithms(),
        critic_free=config.critic_free,
        group_size=config.env.group_size,
        actions=game.actions.mode if game is not None else "generate",
        # The normalisation is score's; the config refuses another value with another mode.
        action_normalization=game.actions.normalization if game is not None and game.actions.mode == "score" else None,
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
    :data:`marllm.algorithms.catalog.CATALOG` or a reference (:func:`~marllm.algorithms.catalog.build_learner`).
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
        kwargs.update(data_parallel=self.placement.data_parallel)
        return build_learner(self.options.algorithm_of(learner_id), learner_id, self.options, **kwargs)

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
