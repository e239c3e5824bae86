"""Learners from base models: one per learner id, with the frozen references they are penalised against."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from marllm.algorithms.critic_free_config import CriticFreeConfig
from marllm.algorithms.learner import Learner
from marllm.algorithms.ppo_config import GenerationConfig, PPOConfig
from marllm.algorithms.registry import AlgorithmOptions, build_learner
from marllm.assets import resolve_model
from marllm.config import TrainConfig, per_learner
from marllm.models.lora import LoraSettings, attach_adapters
from marllm.models.policy import ReferencePool, load_causal_lm, load_tokenizer, resolve_dtype
from marllm.parallel.distributed import DataParallel
from marllm.parallel.sharding import is_sharded, shard_module


def learners_from_config(
    config: TrainConfig, tokenizer: Any, data_parallel: DataParallel | None = None
) -> tuple[dict[str, Learner], Any]:
    """The learners of ``config`` and their reference (see :func:`make_learners`), from its ``model``, ``agents``,
    ``ppo``, ``critic_free``, ``generation`` and ``env.group_size`` settings.

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
        config.model.dtype,
        config.model.device,
        None if heterogeneous else tokenizer,
        lora=config.model.lora,
        load_in_4bit=config.model.load_in_4bit,
        trust_remote_code=config.model.trust_remote_code,
        algorithm=config.learner_algorithms(),
        critic_free=config.critic_free,
        group_size=config.env.group_size,
        actions=config.game.actions if config.game is not None else "generate",
        action_normalization=config.game.action_normalization if config.game is not None else "token",
        data_parallel=data_parallel,
        devices=config.learner_devices(),
        reference_device=config.agents.reference_device,
        fsdp=config.model.fsdp,
        fsdp_compute_dtype=config.model.fsdp_compute_dtype,
        fsdp_gather_for_generation=config.model.fsdp_gather_for_generation,
    )


def make_learners(
    model: str | Mapping[str, str],
    learner_ids: Sequence[str],
    ppo: PPOConfig | None = None,
    generation: GenerationConfig | None = None,
    seed: int = 0,
    dtype: str = "float32",
    device: str = "auto",
    tokenizer: Any = None,
    lora: LoraSettings | None = None,
    load_in_4bit: bool = False,
    trust_remote_code: bool = False,
    references: ReferencePool | None = None,
    algorithm: str | Mapping[str, str] = "ppo",
    critic_free: CriticFreeConfig | None = None,
    group_size: int = 1,
    actions: str = "generate",
    action_normalization: str = "token",
    data_parallel: DataParallel | None = None,
    devices: Mapping[str, str] | None = None,
    reference_device: str | None = None,
    fsdp: bool = False,
    fsdp_compute_dtype: str | None = None,
    fsdp_gather_for_generation: bool = True,
) -> tuple[dict[str, Learner], Any]:
    """One PPO learner per id, each starting from its base model: ``model`` for all (a hub id, a local directory or a
    ``marllm:`` causal LM), or a mapping learner id -> model (heterogeneous agents; each base brings its tokenizer).

    Full models: each learner owns a copy and the learners of one base share one frozen reference from
    ``references`` (N policies + 1 reference per base). LoRA: one base carries one adapter per learner that starts
    from it, and the reference is that base with adapters disabled. Returns the learners (keyed by id) and the
    separate reference model: one model when every learner shares one base, None for LoRA, and a dict base ->
    reference for several bases.
    ``tokenizer`` (optional) is the tokenizer of a single ``model``; with several bases each loads its own.
    ``seed`` seeds each learner's initial value head, its response lengths and mini-batch order, and leaves torch's
    global generator (which samples the responses) in a state that depends on ``seed`` alone.
    ``trust_remote_code`` lets transformers run the Python code a hub model ships with (only for code you trust).
    ``algorithm`` (one for all, or per learner id; ``ppo`` where not named) picks the learner class from
    :data:`marllm.algorithms.registry.LEARNERS` (``ppo``: :class:`~marllm.algorithms.ppo.PPOLearner`; ``grpo``,
    ``rloo``, ``reinforce_pp``: :class:`~marllm.algorithms.critic_free_learner.CriticFreeLearner` with
    ``critic_free`` settings and the env's ``group_size``); ``actions`` (``generate``, ``constrained`` or ``score``)
    and ``action_normalization`` say how a game's answers become moves (``score``: the registry's action-level learner
    of the algorithm, :func:`~marllm.algorithms.registry.build_learner`). ``data_parallel`` (this process's rank of a
    data-parallel run) is handed to every learner.
    ``devices`` places learners (learner id -> device; ``device`` where not named; the learners of one LoRA base on
    the first one's device) and ``reference_device`` the shared references (``device`` when None).
    ``fsdp`` shards each policy and reference over the ranks of ``data_parallel`` (:mod:`marllm.parallel.sharding`):
    each is
    loaded on the CPU and its shards go to the rank's device. Full models only. ``fsdp_compute_dtype`` (e.g.
    ``bfloat16``): the dtype the sharded models compute in (None: ``dtype``); ``fsdp_gather_for_generation``: whether
    they are gathered whole for each ``generate`` call (else layer by layer at every token).
    """
    compute = resolve_dtype(fsdp_compute_dtype) if fsdp_compute_dtype is not None else None
    _check_sharding(compute, fsdp, data_parallel, lora, device, devices)
    algorithms = per_learner(algorithm, learner_ids, "ppo")
    options = AlgorithmOptions(critic_free, group_size, actions, action_normalization)
    seeds = {learner_id: seed + i for i, learner_id in enumerate(learner_ids)}

    def learner(learner_id: str, **kwargs: Any) -> Learner:
        """The learner of ``learner_id`` on ``kwargs``' model, tokenizer, reference (and adapter)."""
        kwargs.update(config=ppo, generation=generation, seed=seeds[learner_id], data_parallel=data_parallel)
        return build_learner(algorithms[learner_id], learner_id, options, **kwargs)

    models = _models_by_learner(model, learner_ids)
    bases = list(dict.fromkeys(models[learner_id] for learner_id in learner_ids))
    if tokenizer is not None and len(bases) > 1:
        raise ValueError("make_learners: a tokenizer can be given for a single model only; each base loads its own")
    references = references if references is not None else ReferencePool()
    placement = dict(devices or {})
    learners: dict[str, Learner] = {}
    base_references: dict[str, Any] = {}
    for base in bases:
        group = [learner_id for learner_id in learner_ids if models[learner_id] == base]
        path = resolve_model(base)
        base_tokenizer = tokenizer or load_tokenizer(path, trust_remote_code=trust_remote_code)
        if lora is not None:
            torch.manual_seed(seeds[group[0]])
            on = placement.get(group[0], device)
            shared = load_causal_lm(path, dtype, on, load_in_4bit=load_in_4bit, trust_remote_code=trust_remote_code)
            shared = attach_adapters(shared, group, lora)
            for learner_id in group:
                learners[learner_id] = learner(
                    learner_id, model=shared, tokenizer=base_tokenizer, reference=None, adapter=learner_id
                )
            continue
        on = "cpu" if fsdp else reference_device or device
        reference = references.get(path, dtype, on, trust_remote_code=trust_remote_code)
        if fsdp and not is_sharded(reference):  # a pool's reference may be sharded already
            shard_module(reference, data_parallel, compute, fsdp_gather_for_generation)
        base_references[base] = reference
        for learner_id in group:
            torch.manual_seed(seeds[learner_id])
            on = "cpu" if fsdp else placement.get(learner_id, device)
            policy = load_causal_lm(path, dtype, on, trust_remote_code=trust_remote_code)
            if fsdp:
                shard_module(policy, data_parallel, compute, fsdp_gather_for_generation)
            learners[learner_id] = learner(learner_id, model=policy, tokenizer=base_tokenizer, reference=reference)
    ordered = {learner_id: learners[learner_id] for learner_id in learner_ids}
    if lora is not None:
        return ordered, None
    return ordered, base_references[bases[0]] if len(bases) == 1 else base_references


def _check_sharding(
    compute: torch.dtype | None,
    fsdp: bool,
    data_parallel: DataParallel | None,
    lora: LoraSettings | None,
    device: str,
    devices: Mapping[str, str] | None,
) -> None:
    if compute is not None and not fsdp:
        raise ValueError("make_learners: fsdp_compute_dtype is the compute dtype of sharded models; give fsdp=True")
    if fsdp and (data_parallel is None or lora is not None or any(d != device for d in (devices or {}).values())):
        raise ValueError(
            "make_learners: fsdp shards full models (no lora) over the ranks of data_parallel, each on its rank's "
            "device (no devices per learner)"
        )


def _models_by_learner(model: str | Mapping[str, str], learner_ids: Sequence[str]) -> dict[str, str]:
    """Learner id -> base model, from one model for all or a mapping (which must name every learner)."""
    models = {learner_id: model for learner_id in learner_ids} if isinstance(model, str) else dict(model)
    missing = [learner_id for learner_id in learner_ids if learner_id not in models]
    if missing:
        raise ValueError(f"make_learners: no model for learner(s) {missing}; the mapping names {sorted(models)}")
    return models
