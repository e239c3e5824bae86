"""What a run will cost in memory, said before it starts: ``marllm plan CONFIG``.

The plan reads a config and the shapes of its models (their configs only: no weights are loaded) and sums, for the
device every model lives on, what a training iteration holds at its peak:

- **kept for the whole run**: each policy's weights, its Adam moments (two per trainable parameter, in the
  parameter's dtype), the frozen reference (once per base; nothing with LoRA, whose reference is the base with its
  adapters off), the value heads, the reward model, and on a CPU the process itself (Python, torch, transformers);
- **the larger of two phases**, which never overlap:
  - *rollout* (one learner at a time): the key/value cache of ``generate`` over the batch, the logits kept for the
    rollout (generate's own, float32, when ``ppo.compute.rollout_from_generate``), and the reference's logits of one
    ``ppo.compute.forward_batch_size`` chunk;
  - *update* (one learner at a time): its gradients, the activations a backward needs at
    ``ppo.compute.micro_batch_size`` rows (measured on a two-layer copy, :func:`~marllm.models.memory.activation_bytes`;
    with ``ppo.compute.gradient_checkpointing`` the layers' inputs plus one layer recomputed), and the pass's logits.

Lengths are the longest the config allows: prompts as the templates render them with the longest query and
responses, plus ``generation.max_new_tokens``. Each figure is an estimate; ``benchmarks/bench_plan.py`` sets it beside
the measured peak.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from marllm.config import TrainConfig
from marllm.models.lora_settings import LoraSettings
from marllm.models.memory import (
    ActivationBytes,
    ModelShape,
    activation_bytes,
    adapter_size,
    bytes_per_element,
    model_shape,
)

__all__ = ["CPU_RUNTIME_BYTES", "MemoryPlan", "PlanLine", "plan_memory", "prompt_tokens"]

CPU_RUNTIME_BYTES = 600 * 1024**2
"""A training process's own resident memory on a CPU before any model: Python, torch, transformers, datasets and
marllm imported (590 MiB measured on Linux x86-64 with the locked versions)."""
_CHUNK_TEMPORARIES = 3 * (1 << 20) * 4  # the chunked log-softmax's float32 chunks (marllm.algorithms.core)
_EMPTY_PROMPT_FIELD = 64  # tokens assumed for a template field the plan cannot size (a task's own column)


@dataclass(frozen=True)
class PlanLine:
    """One part of the plan: its name, bytes, and how they were counted."""

    name: str
    bytes: float
    note: str = ""


@dataclass
class MemoryPlan:
    """The estimated peak of one training process, its parts, and the levers that would lower it."""

    kept: list[PlanLine]
    rollout: list[PlanLine]
    update: list[PlanLine]
    summary: dict[str, Any]
    capacity: float | None = None
    levers: list[tuple[str, float]] = field(default_factory=list)

    @property
    def rollout_bytes(self) -> float:
        return sum(line.bytes for line in self.rollout)

    @property
    def update_bytes(self) -> float:
        return sum(line.bytes for line in self.update)

    @property
    def peak_phase(self) -> str:
        """``"rollout"`` or ``"update"``: the phase at which the peak is reached."""
        return "update" if self.update_bytes >= self.rollout_bytes else "rollout"

    @property
    def peak(self) -> float:
        """The estimated peak in bytes: everything kept plus the larger phase."""
        return sum(line.bytes for line in self.kept) + max(self.rollout_bytes, self.update_bytes)

    @property
    def fits(self) -> bool | None:
        """Whether the peak fits ``capacity`` (None: no capacity given)."""
        return None if self.capacity is None else self.peak <= self.capacity


def prompt_tokens(config: TrainConfig, characters_per_token: float = 3.0) -> int:
    """The longest prompt the config's text env renders, in tokens: each template's own text (at
    ``characters_per_token``), ``query_max_tokens`` for each ``{query}`` (64 if the task does not bound it) and
    ``generation.max_new_tokens`` for each earlier response it quotes."""
    if config.game is not None:
        raise ValueError("a game's prompts are the game's own: give the prompt length (marllm plan --prompt-tokens N)")
    query = getattr(config.task, "query_max_tokens", None) or _EMPTY_PROMPT_FIELD
    speakers = set(config.speaking_order) | set(config.env.roles)
    longest = 0
    for template in config.role_templates().values():
        tokens, literal = 0, template
        for name in re.findall(r"{(\w+)[^}]*}", template):
            tokens += config.generation.max_new_tokens if _is_response(name, speakers) else query
        literal = re.sub(r"{[^}]*}", "", literal)
        longest = max(longest, tokens + math.ceil(len(literal) / characters_per_token))
    return longest


def _is_response(field_name: str, speakers: set[str]) -> bool:
    return field_name in speakers or re.sub(r"_\d+$", "", field_name) in speakers


def plan_memory(
    config: TrainConfig,
    resolve: Callable[[str], str],
    capacity: float | None = None,
    device: str = "cpu",
    prompt_length: int | None = None,
    with_levers: bool = True,
) -> MemoryPlan:
    """The memory plan of ``config`` on ``device`` (``cpu`` or ``cuda``), with ``capacity`` bytes available.

    ``resolve`` turns a model reference (a ``marllm:`` name, hub id or path) into a directory or hub id whose config
    transformers can read. ``prompt_length``: the longest prompt in tokens (None: :func:`prompt_tokens`).
    ``with_levers``: when the peak exceeds ``capacity``, also plan the variants that would lower it.
    """
    if config.agents.models:
        raise ValueError("marllm plan covers learners that share model.name_or_path; agents.models is not planned")
    model = config.model
    shape = model_shape(resolve(model.name_or_path), model.lora, model.trust_remote_code)
    prompt = prompt_tokens(config) if prompt_length is None else prompt_length
    reward = _reward_model_parameters(config, resolve)
    plan = _plan(config, shape, prompt, capacity, device, reward)
    if with_levers and plan.fits is False:
        plan.levers = _levers(config, shape, prompt, capacity, device, plan, reward)
    return plan


def _reward_model_parameters(config: TrainConfig, resolve: Callable[[str], str]) -> tuple[int, str]:
    """The parameters of the task's reward model, if it is a transformers classifier, and how they were counted."""
    reward_model = getattr(config.task, "reward_model", None)
    if not reward_model:
        return 0, "the task has none"
    if reward_model.startswith("marllm:"):
        return 0, f"{reward_model}: an n-gram classifier, a few MiB, not counted"
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    with torch.device("meta"):
        classifier = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(resolve(reward_model)))
    return sum(p.numel() for p in classifier.parameters()), f"{reward_model}, float32"


def _plan(
    config: TrainConfig, shape: ModelShape, prompt: int, capacity: float | None, device: str, reward: tuple[int, str]
) -> MemoryPlan:
    model, ppo = config.model, config.ppo
    reference_dtype = _reference_dtype(config)
    tokens = prompt + config.generation.max_new_tokens
    passes = ppo.compute.passes_of(model.fsdp)
    mini = min(ppo.batching.mini_batch_size, config.env.batch_size)
    rows = mini if passes is None else min(passes, mini)
    summary = {
        "model": model.name_or_path, "parameters": shape.parameters, "learners": len(config.learner_ids),
        "trainable_per_learner": shape.lora_parameters if model.lora is not None else shape.parameters,
        "dtype": model.dtype, "reference_dtype": reference_dtype, "lora": model.lora is not None,
        "batch": config.env.batch_size, "prompt_tokens": prompt, "new_tokens": config.generation.max_new_tokens,
        "update_rows": rows, "gradient_checkpointing": ppo.compute.gradient_checkpointing,
        "autocast_dtype": ppo.compute.autocast_dtype, "device": device,
    }  # fmt: skip
    kept = _kept(config, shape, reward, device)
    return MemoryPlan(kept, _rollout(config, shape, tokens), _update(config, shape, tokens, rows), summary, capacity)


def _reference_dtype(config: TrainConfig) -> str:
    return config.model.reference_dtype or config.model.dtype


def _trainable(config: TrainConfig, shape: ModelShape) -> tuple[int, int]:
    """Trainable parameters per learner and their bytes each (peft keeps LoRA adapters in float32)."""
    if config.model.lora is not None:
        return shape.lora_parameters, 4
    return shape.parameters, bytes_per_element(config.model.dtype)


def _kept(config: TrainConfig, shape: ModelShape, reward: tuple[int, str], device: str) -> list[PlanLine]:
    """What lives through the whole run."""
    model, learners, parameters = config.model, len(config.learner_ids), shape.parameters
    weight = bytes_per_element(model.dtype)
    reference_dtype = _reference_dtype(config)
    trainable, trainable_bytes = _trainable(config, shape)
    lora = model.lora is not None
    copies = "" if lora else f" × {learners} learners"
    return [
        PlanLine("weights", parameters * weight * (1 if lora else learners),
                 f"{parameters / 1e6:.1f}M × {weight} B{copies}"),
        PlanLine("adapters", learners * trainable * 4 if lora else 0,
                 f"{learners} × {trainable / 1e6:.2f}M × 4 B" if lora else "full fine-tuning: none"),
        PlanLine("optimiser", learners * 2 * trainable * trainable_bytes,
                 f"Adam's 2 moments × {trainable / 1e6:.1f}M × {trainable_bytes} B × {learners}"),
        PlanLine("reference", 0 if lora else parameters * bytes_per_element(reference_dtype),
                 "the base with adapters off" if lora else f"once per base, {reference_dtype}"),
        PlanLine("value heads", learners * 4 * (shape.hidden_size + 1) * 4, "weights, gradients, Adam"),
        PlanLine("reward model", reward[0] * 4, reward[1]),
        PlanLine("runtime", CPU_RUNTIME_BYTES if device == "cpu" else 0,
                 "the process: Python, torch, transformers" if device == "cpu" else "not counted on CUDA"),
    ]  # fmt: skip


def _compute_bytes(config: TrainConfig) -> int:
    dtype = config.ppo.compute.autocast_dtype or config.model.dtype
    return bytes_per_element(dtype)


def _rollout(config: TrainConfig, shape: ModelShape, tokens: int) -> list[PlanLine]:
    """One learner's rollout: generate's cache and kept logits, then the reference's forward by chunks."""
    ppo, batch, vocabulary = config.ppo, config.env.batch_size, shape.vocab_size
    new_tokens = config.generation.max_new_tokens
    rows = min(batch, ppo.compute.forward_batch_size or batch)
    reference_dtype = _reference_dtype(config)
    if ppo.compute.rollout_from_generate_for(config.model.fsdp):
        logits = PlanLine("rollout logits", 2 * batch * new_tokens * vocabulary * 4,
                          "generate's float32 logits, listed then stacked")  # fmt: skip
    else:
        logits = PlanLine("rollout logits", rows * new_tokens * vocabulary * _compute_bytes(config),
                          "the policy's, one forward chunk")  # fmt: skip
    # A reference in another dtype than the policy's is widened to the wider of the two before its log-softmax.
    widest = max(bytes_per_element(reference_dtype), bytes_per_element(config.model.dtype))
    return [
        PlanLine("kv cache", batch * tokens * shape.kv_elements_per_token * _compute_bytes(config),
                 f"{batch} rows × {tokens} tokens"),
        logits,
        PlanLine("reference logits", rows * new_tokens * vocabulary * widest + _CHUNK_TEMPORARIES,
                 f"{rows} rows, with the KL's float32 chunks"),
    ]  # fmt: skip


def _update(config: TrainConfig, shape: ModelShape, tokens: int, rows: int) -> list[PlanLine]:
    """One learner's update: its gradients, one pass's activations and logits."""
    ppo, new_tokens, vocabulary = config.ppo, config.generation.max_new_tokens, shape.vocab_size
    trainable, trainable_bytes = _trainable(config, shape)
    checkpointing = ppo.compute.gradient_checkpointing
    activations = activation_bytes(
        shape, tokens, config.model.dtype, ppo.compute.autocast_dtype, checkpointing, config.model.lora
    )
    logit_rows = rows if ppo.compute.logits_chunk_rows is None else min(rows, ppo.compute.logits_chunk_rows)
    logits_note = f"{logit_rows} rows × {new_tokens} × {vocabulary:,} × {_compute_bytes(config)} B"
    return [
        PlanLine("gradients", trainable * trainable_bytes, "one learner's, while it updates"),
        PlanLine("activations", _update_activations(activations, rows, checkpointing),
                 f"{rows} rows × {tokens} tokens" + (", checkpointed" if checkpointing else "")),
        PlanLine("update logits", logit_rows * new_tokens * vocabulary * _compute_bytes(config) + _CHUNK_TEMPORARIES,
                 logits_note + (" (ppo.compute.logits_chunk_rows)" if ppo.compute.logits_chunk_rows else "")),
        PlanLine("autocast weights", shape.parameters * 2 if ppo.compute.autocast_dtype else 0,
                 "bfloat16 copies of the weights" if ppo.compute.autocast_dtype else "no autocast"),
    ]  # fmt: skip


def _update_activations(activations: ActivationBytes, rows: int, checkpointing: bool) -> float:
    # The backward's working set adds about one layer's activations to what is saved (their gradients); with
    # checkpointing, the layer being recomputed as well.
    one_layer = activations.one_layer(rows)
    return activations.total(rows) + one_layer * (2 if checkpointing else 1)


def _levers(
    config: TrainConfig,
    shape: ModelShape,
    prompt: int,
    capacity: float | None,
    device: str,
    plan: MemoryPlan,
    reward: tuple[int, str],
) -> list[tuple[str, float]]:
    """Each lever that changes the config alone, with the peak it would give."""
    variants: list[tuple[str, TrainConfig]] = []
    model, ppo = config.model, config.ppo
    if model.lora is None:
        lora_dtype = "bfloat16" if device == "cuda" or model.dtype != "float32" else model.dtype
        variants.append(
            (f"model.lora: {{r: 16}}, model.dtype: {lora_dtype}",
             replace(config, model=replace(model, lora=LoraSettings(r=16), dtype=lora_dtype)))
        )  # fmt: skip
    if model.dtype == "float32" and model.lora is None and model.reference_dtype is None:
        variants.append(
            ("model.reference_dtype: bfloat16", replace(config, model=replace(model, reference_dtype="bfloat16")))
        )
    if model.dtype == "float32":
        variants.append(("model.dtype: bfloat16", replace(config, model=replace(model, dtype="bfloat16"))))
    if not ppo.compute.gradient_checkpointing:
        variants.append(("ppo.compute.gradient_checkpointing: true",
                         _computing(config, gradient_checkpointing=True)))  # fmt: skip
    rows = plan.summary["update_rows"]
    if rows > 1:
        variants.append((f"ppo.compute.micro_batch_size: {max(1, rows // 4)}",
                         _computing(config, micro_batch_size=max(1, rows // 4))))  # fmt: skip
    if ppo.compute.logits_chunk_rows is None and rows > 1:
        variants.append(("ppo.compute.logits_chunk_rows: 1", _computing(config, logits_chunk_rows=1)))
    if config.ppo.compute.forward_batch_size is None and config.env.batch_size > 8:
        variants.append(("ppo.compute.forward_batch_size: 8", _computing(config, forward_batch_size=8)))
    levers = []
    for name, variant in variants:
        if variant.model.lora is not None and model.lora is None:
            variant_shape = replace(shape, lora_parameters=adapter_size(shape.config, variant.model.lora))
        else:
            variant_shape = shape
        levers.append((name, _plan(variant, variant_shape, prompt, capacity, device, reward).peak))
    sharded = sum(line.bytes for line in plan.kept if line.name in ("weights", "optimiser", "reference"))
    for ranks in (2, 4, 8):
        levers.append((f"model.fsdp over {ranks} ranks (marllm train --nproc {ranks})",
                       plan.peak - sharded * (1 - 1 / ranks) - plan.update[0].bytes * (1 - 1 / ranks)))  # fmt: skip
    return sorted(levers, key=lambda lever: lever[1])


def _computing(config: TrainConfig, **settings: Any) -> TrainConfig:
    """``config`` with ``ppo.compute``'s ``settings`` changed."""
    return replace(config, ppo=replace(config.ppo, compute=replace(config.ppo.compute, **settings)))
