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
    with ``ppo.compute.gradient_checkpointing`` the layers' inputs plus the activations of the layer the backward
    recomputes, measured without checkpointing), and the pass's logits (with the float32 copies the log-probs make of
    them when ``generation.temperature`` is not 1 or ``generation.logprobs_from`` is ``sampling``).

Lengths are the longest the config allows. A text env's prompts: as the templates render them with the longest query
and responses, plus ``generation.max_new_tokens``, over ``env.batch_size`` rows. A game's (a config with a ``game``
section): its own prompts, measured: a batch of ``game.batch_size`` games is played to its end with random legal
moves, every prompt rendered as the learners would read it and tokenized by the model's tokenizer; the rollout's rows
are the game's batch, an update's the learner's moves of the iteration; a game has no task and so no reward model,
and each ``snapshot_pool`` seat keeps its ``size`` copies of its learner's model. Each figure is an
estimate; ``benchmarks/bench_plan.py`` and ``benchmarks/bench_plan_levers.py`` set it beside the measured peak.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from marllm.config import TrainConfig
from marllm.config.loading import ConfigError
from marllm.models.lora_settings import LoraSettings
from marllm.models.memory import (
    ActivationBytes,
    ModelShape,
    activation_bytes,
    adapter_size,
    bytes_per_element,
    model_shape,
)
from marllm.run.plan_workload import (
    GameLengths,
    Workload,
    game_lengths,
    keeps_generate_logits,
    logit_bytes,
    plan_workload,
    prompt_tokens,
    reward_model_parameters,
    settled_compute,
)

__all__ = [
    "CPU_HEAP_SLACK",
    "CPU_RUNTIME_BYTES",
    "GameLengths",
    "MemoryPlan",
    "PlanLine",
    "Workload",
    "game_lengths",
    "plan_memory",
    "prompt_tokens",
]

CPU_RUNTIME_BYTES = 600 * 1024**2
"""A training process's own resident memory on a CPU before any model: Python, torch, transformers, datasets and
marllm imported (590 MiB measured on Linux x86-64 with the locked versions)."""
CPU_HEAP_SLACK = 0.5
"""On a CPU, the resident memory a phase costs beyond its tensors, as a share of them: glibc's malloc serves tensors
under its mmap threshold (which grows to 32 MiB) from its heap, keeps what they free there and reuses it only in part
for tensors of other sizes. Measured on whole runs (``benchmarks/bench_plan_levers.py``): a LoRA run of SmolLM2-135M's
shape held 2,505 MiB where its tensors and the process came to about 2,030 (the same learner held its tensors' worth,
2,076 MiB, under ``MALLOC_MMAP_THRESHOLD_=65536``, with which malloc gives every larger block back); a GPT-2 of
8 × 512 under gradient checkpointing held 1,953 MiB, about 2.7 times its update's tensors above what it keeps. Half
of each phase puts the plan within 15% of both."""
_CHUNK_TEMPORARIES = 3 * (1 << 20) * 4  # the chunked log-softmax's float32 chunks (marllm.algorithms.core)


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
    transformers can read. ``prompt_length``: the longest prompt in tokens (``marllm plan --prompt-tokens``; None:
    :func:`prompt_tokens` of a text env's templates, or a game's prompts measured by :func:`game_lengths`).
    ``with_levers``: when the peak exceeds ``capacity``, also plan the variants that would lower it.

    Raises:
        ConfigError: ``prompt_length`` is not a whole number >= 1, or a prompt and ``generation.max_new_tokens``
            do not fit in the model's context; ``model.name_or_path`` (or ``task.reward_model``) is a missing
            directory, one without config.json, or a hub id missing from the cache while the hub is offline.
    """
    if config.agents.models:
        raise ValueError("marllm plan covers learners that share model.name_or_path; agents.models is not planned")
    if prompt_length is not None and (
        isinstance(prompt_length, bool) or not isinstance(prompt_length, int) or prompt_length < 1
    ):
        raise ConfigError(f"--prompt-tokens must be a whole number of tokens >= 1, got {prompt_length!r}")
    from marllm.assets import CAUSAL_LMS
    from marllm.assets.references import check_model_reference

    model = config.model
    check_model_reference(model.name_or_path, "model.name_or_path", asset=CAUSAL_LMS)
    reward = reward_model_parameters(config, resolve)
    path = resolve(model.name_or_path)
    shape = model_shape(path, model.lora, model.trust_remote_code)
    workload = plan_workload(config, shape, path, prompt_length)
    plan = _plan(config, shape, workload, capacity, device, reward)
    if with_levers and plan.fits is False:
        plan.levers = _levers(config, shape, workload, capacity, device, plan, reward)
    return plan


def _plan(
    config: TrainConfig,
    shape: ModelShape,
    workload: Workload,
    capacity: float | None,
    device: str,
    reward: tuple[int, str],
) -> MemoryPlan:
    model, ppo = config.model, config.ppo
    reference_dtype = _reference_dtype(config)
    passes = settled_compute(config).micro_batch_size
    mini = min(ppo.batching.mini_batch_size, workload.learner_rows)
    rows = mini if passes is None else min(passes, mini)
    summary = {
        "model": model.name_or_path, "parameters": shape.parameters, "learners": len(config.learner_ids),
        "trainable_per_learner": shape.lora_parameters if model.lora is not None else shape.parameters,
        "dtype": model.dtype, "reference_dtype": reference_dtype, "lora": model.lora is not None,
        "batch": workload.batch, "prompt_tokens": workload.prompt, "prompt_source": workload.prompt_source,
        "new_tokens": workload.new_tokens, "update_rows": rows,
        "gradient_checkpointing": ppo.compute.gradient_checkpointing, "autocast_dtype": ppo.compute.autocast_dtype,
        "device": device,
    }  # fmt: skip
    kept = _kept(config, shape, workload, reward, device)
    rollout, update = _rollout(config, shape, workload, device), _update(config, shape, workload, rows, device)
    if device == "cpu":
        for phase in (rollout, update):
            slack = CPU_HEAP_SLACK * sum(line.bytes for line in phase)
            phase.append(PlanLine("heap slack", slack, f"{CPU_HEAP_SLACK:.0%} more on a CPU: blocks malloc keeps"))
    return MemoryPlan(kept, rollout, update, summary, capacity)


def _reference_dtype(config: TrainConfig) -> str:
    return config.model.reference_dtype or config.model.dtype


def _trainable(config: TrainConfig, shape: ModelShape) -> tuple[int, int]:
    """Trainable parameters per learner and their bytes each (peft keeps LoRA adapters in float32)."""
    if config.model.lora is not None:
        return shape.lora_parameters, 4
    return shape.parameters, bytes_per_element(config.model.dtype)


def _kept(
    config: TrainConfig, shape: ModelShape, workload: Workload, reward: tuple[int, str], device: str
) -> list[PlanLine]:
    """What lives through the whole run."""
    model, learners, parameters = config.model, len(config.learner_ids), shape.parameters
    weight = bytes_per_element(model.dtype)
    reference_dtype = _reference_dtype(config)
    trainable, trainable_bytes = _trainable(config, shape)
    lora = model.lora is not None
    copies = "" if lora else f" × {learners} learners"
    # A snapshot deep-copies its learner's model: the whole of it, with every adapter a LoRA base carries.
    snapshot = parameters * weight + (learners * trainable * 4 if lora else 0)
    lines = [
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
    if workload.snapshots:
        note = f"{workload.snapshots} copies of the model (each snapshot_pool seat's size)"
        lines.insert(5, PlanLine("snapshots", workload.snapshots * snapshot, note))
    return lines


def _compute_bytes(config: TrainConfig) -> int:
    dtype = config.ppo.compute.autocast_dtype or config.model.dtype
    return bytes_per_element(dtype)


def _rollout(config: TrainConfig, shape: ModelShape, workload: Workload, device: str) -> list[PlanLine]:
    """One learner's rollout: generate's cache and kept logits, then the reference's forward by chunks."""
    ppo, batch, vocabulary = config.ppo, workload.batch, shape.vocab_size
    new_tokens, tokens = workload.new_tokens, workload.prompt + workload.new_tokens
    rows = min(batch, ppo.compute.forward_batch_size or batch)
    compute = _compute_bytes(config)
    if keeps_generate_logits(config):
        policy = 4  # generate's float32 logits, processed in place
        logits = PlanLine("rollout logits", 2 * batch * new_tokens * vocabulary * 4,
                          "generate's float32 logits, listed then stacked")  # fmt: skip
    else:
        # Processed in place once widened: the widened copy is what stays.
        policy, peak = logit_bytes(config, device, inplace=True)
        copy = ", with their float32 copy" if peak > compute else ""
        logits = PlanLine("rollout logits", rows * new_tokens * vocabulary * max(policy, peak),
                          f"the policy's, one forward chunk{copy}")  # fmt: skip
    # The reference's logits are widened to the wider of theirs and the policy's before the log-softmax: while the
    # widened copy is made, both are alive.
    own, head = logit_bytes(config, device, _reference_dtype(config), processed=False)
    widened = max(own, policy, bytes_per_element(config.model.dtype))
    reference = max(widened + (own if own < widened else 0), head)
    return [
        PlanLine("kv cache", batch * tokens * shape.kv_elements_per_token * compute if workload.generates else 0,
                 f"{batch} rows × {tokens} tokens" if workload.generates else "nothing generated (scored moves)"),
        logits,
        PlanLine("reference logits", rows * new_tokens * vocabulary * reference + _CHUNK_TEMPORARIES,
                 f"{rows} rows, with the KL's float32 chunks"),
    ]  # fmt: skip


def _update(config: TrainConfig, shape: ModelShape, workload: Workload, rows: int, device: str) -> list[PlanLine]:
    """One learner's update: its gradients, one pass's activations and logits."""
    ppo, vocabulary = config.ppo, shape.vocab_size
    new_tokens, tokens = workload.new_tokens, workload.prompt + workload.new_tokens
    trainable, trainable_bytes = _trainable(config, shape)
    checkpointing = ppo.compute.gradient_checkpointing
    settings = (tokens, config.model.dtype, ppo.compute.autocast_dtype)
    activations = activation_bytes(shape, *settings, checkpointing, config.model.lora)
    # The layer a checkpointed backward recomputes holds what an unchecked layer keeps, while it is backpropagated.
    recomputed = activation_bytes(shape, *settings, False, config.model.lora) if checkpointing else None
    logit_rows = rows if ppo.compute.logits_chunk_rows is None else min(rows, ppo.compute.logits_chunk_rows)
    logits = logit_rows * new_tokens * vocabulary
    steady, peak = logit_bytes(config, device)
    # The chunked log-softmax's float32 chunks exist beside the logits it reads, after the copies made before it.
    held = max(logits * peak, logits * steady + _CHUNK_TEMPORARIES)
    logits_note = f"{logit_rows} rows × {new_tokens} × {vocabulary:,} × {peak} B"
    if peak > _compute_bytes(config):
        logits_note += " at their peak (float32 copies)"
    if ppo.compute.logits_chunk_rows:
        logits_note += " (ppo.compute.logits_chunk_rows)"
    recomputed_note = ", checkpointed, with one layer recomputed" if checkpointing else ""
    return [
        PlanLine("gradients", trainable * trainable_bytes, "one learner's, while it updates"),
        PlanLine("activations", _update_activations(activations, rows, recomputed),
                 f"{rows} rows × {tokens} tokens" + recomputed_note),
        PlanLine("update logits", held, logits_note),
        PlanLine("autocast weights", shape.parameters * 2 if ppo.compute.autocast_dtype else 0,
                 "bfloat16 copies of the weights" if ppo.compute.autocast_dtype else "no autocast"),
    ]  # fmt: skip


def _update_activations(activations: ActivationBytes, rows: int, recomputed: ActivationBytes | None) -> float:
    """What a backward holds of the activations: everything saved plus about one layer's working set (its
    gradients); under checkpointing, what is saved is each layer's input, and the layer being backpropagated holds
    its activations again (``recomputed``: measured without checkpointing)."""
    one_layer = activations.one_layer(rows)
    if recomputed is None:
        return activations.total(rows) + one_layer
    return activations.total(rows) + recomputed.one_layer(rows) + one_layer


def _levers(
    config: TrainConfig,
    shape: ModelShape,
    workload: Workload,
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
    if config.ppo.compute.forward_batch_size is None and workload.batch > 8:
        variants.append(("ppo.compute.forward_batch_size: 8", _computing(config, forward_batch_size=8)))
    levers = []
    for name, variant in variants:
        if variant.model.lora is not None and model.lora is None:
            variant_shape = replace(shape, lora_parameters=adapter_size(shape.config, variant.model.lora))
        else:
            variant_shape = shape
        levers.append((name, _plan(variant, variant_shape, workload, capacity, device, reward).peak))
    shardable = sum(line.bytes for line in plan.kept if line.name in ("weights", "optimiser", "reference"))
    for ranks in (2, 4, 8):
        levers.append((f"model.fsdp over {ranks} ranks (marllm train --nproc {ranks})",
                       plan.peak - shardable * (1 - 1 / ranks) - plan.update[0].bytes * (1 - 1 / ranks)))  # fmt: skip
    return sorted(levers, key=lambda lever: lever[1])


def _computing(config: TrainConfig, **settings: Any) -> TrainConfig:
    """``config`` with ``ppo.compute``'s ``settings`` changed."""
    return replace(config, ppo=replace(config.ppo, compute=replace(config.ppo.compute, **settings)))
