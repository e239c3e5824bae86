"""A learner's constructor arguments: the ones every token-level learner takes (:class:`LearnerArguments`), the
checks made on them before anything is built, and the parts built from them (value head, optimiser)."""

# Annotations evaluated (no ``from __future__ import annotations``), so that LearnerArguments' optional keys are
# known at runtime (``__optional_keys__``), not only to a type checker.
from typing import Any, NotRequired, TypedDict

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from marllm.algorithms.action_registry import action_mode
from marllm.algorithms.kl_controller import KLController
from marllm.algorithms.ppo_config import GenerationConfig, PPOConfig
from marllm.algorithms.stochastic_rounding import StochasticRoundingAdam
from marllm.models.activations import fuse_tanh_gelus, recompute_activations_in_backward
from marllm.models.checkpointing import enable_gradient_checkpointing
from marllm.models.generation import check_chat_template
from marllm.models.legal_moves import check_constrained
from marllm.models.lora import adapter_parameters
from marllm.models.policy import ValueHead
from marllm.parallel.placement import Placement


class LearnerArguments(TypedDict):
    """The keyword arguments of :class:`~marllm.algorithms.ppo.PPOLearner` that its subclasses take as they are and
    pass on (``**learner_kwargs``); :class:`~marllm.algorithms.ppo.PPOLearner` documents each.

    Attributes:
        model: the trainable causal LM, or the peft model that carries ``adapter``.
        tokenizer: its tokenizer (left padding is set).
        reference: the frozen π_0; None when ``adapter`` is set.
        config: the PPO settings (None: :class:`~marllm.algorithms.ppo_config.PPOConfig`'s defaults).
        generation: the sampling settings (None: their defaults).
        seed: seeds the response-length sampler and the mini-batch shuffling.
        adapter: the LoRA adapter of ``model`` that the learner trains; None: all of ``model``'s trainable parameters.
        kl_controller: the KL coefficient controller; None builds it from ``config``.
        placement: where the models live across processes; None: whole models on one process.
    """

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    reference: PreTrainedModel | None
    config: NotRequired[PPOConfig | None]
    generation: NotRequired[GenerationConfig | None]
    seed: NotRequired[int]
    adapter: NotRequired[str | None]
    kl_controller: NotRequired[KLController | None]
    placement: NotRequired[Placement | None]


def check_learner_arguments(
    name: str,
    *,
    reference: Any,
    adapter: str | None,
    kl_controller: Any,
    placement: Placement,
) -> None:
    """Refuse a learner without a reference (nor an adapter whose base serves as one), a KL controller without
    ``value`` and ``update``, and an adapter under a placement that does not hold whole models.

    Raises:
        ValueError / TypeError: naming the learner and what is wrong.
    """
    if reference is None and adapter is None:
        raise ValueError(f"learner {name!r} needs a reference model (or a LoRA adapter on a shared base)")
    if kl_controller is not None and not isinstance(kl_controller, KLController):
        raise TypeError(
            f"learner {name!r}: kl_controller must have a value and an update(kl, n_steps) method, got "
            f"{type(kl_controller).__name__}"
        )
    if not placement.whole_models and adapter is not None:
        raise ValueError(f"learner {name!r}: an FSDP model (model.fsdp) trains as a full model: give no adapter")


def check_learner_settings(
    name: str,
    config: PPOConfig,
    generation: GenerationConfig,
    tokenizer: Any,
    actions: str,
    placement: Placement,
) -> None:
    """Refuse, in this order, settings that need whole models under a placement that does not hold them, a chat
    template the tokenizer cannot apply, and ``actions`` that cannot be played with these settings
    (:func:`check_actions`).

    Raises:
        ValueError: naming the learner and what is wrong.
    """
    whole_model_only = [] if placement.whole_models else config.compute.whole_model_settings()
    if whole_model_only:
        raise ValueError(
            f"learner {name!r}: {'; '.join(whole_model_only)}: leave these at their defaults with model.fsdp"
        )
    check_chat_template(tokenizer, generation.chat_template, f"learner {name!r}")
    check_actions(config, name, actions, tokenizer, generation)


def check_actions(config: PPOConfig, name: str, actions: str, tokenizer: Any, generation: Any) -> None:
    """Refuse a mode whose answers end with EOS (constrained, thought-then-move) without an EOS to end them, and
    ``ppo.compute.rollout_from_generate: true`` with a mode it does not fit (a thought and its move are two generate
    calls), as the mode's facts say (:func:`~marllm.algorithms.action_registry.action_mode`; an unknown mode is
    refused)."""
    mode = action_mode(actions, f"learner {name!r}")
    if mode.ends_with_eos:
        check_constrained(tokenizer, generation, f"learner {name!r}")
    if mode.rollout_from_generate is not None and config.compute.rollout_from_generate is True:
        raise ValueError(
            f"learner {name!r}: game.actions: {actions} {mode.rollout_from_generate}; set "
            "ppo.compute.rollout_from_generate to auto or false"
        )


def check_full_precision(name: str, trainable: list[torch.nn.Parameter], adapter: str | None) -> bool:
    """Whether the trained parameters are a full bfloat16 model's, which :class:`StochasticRoundingAdam` trains; refuse
    other half-precision parameters.

    Adam on half-precision weights rounded to nearest: at PPO's learning rates most updates are below half a unit in
    the last place of the weight and round away, silently. A full bfloat16 model is trained with stochastic rounding
    instead (unbiased: the weights move by the updates' sum in expectation); float16 weights are refused (Adam's second
    moment, the squared gradient, underflows float16's range), and so are half-precision LoRA adapters (peft keeps
    them in float32 unless told otherwise).

    Raises:
        ValueError: naming the dtype and the setting that caused it.
    """
    half = sorted({str(p.dtype).removeprefix("torch.") for p in trainable if p.dtype.itemsize < 4})
    if not half:
        return False
    if adapter is None and half == ["bfloat16"]:
        return True
    if adapter is None:
        raise ValueError(
            f"learner {name!r} would train {'/'.join(half)} parameters directly (model.dtype {half[0]} with "
            "model.lora: null), where Adam's squared gradients underflow float16's range; use model.dtype: bfloat16 "
            "(trained with stochastic rounding) or float32, or model.lora"
        )
    raise ValueError(
        f"learner {name!r} would train {'/'.join(half)} parameters directly (adapter {adapter!r} was made without "
        "peft's autocast_adapter_dtype), where most small optimiser updates round away; use model.dtype: float32, "
        "or model.lora, whose adapters peft keeps in float32 on a half-precision base"
    )


def prepare_networks(model: PreTrainedModel, reference: PreTrainedModel | None, config: PPOConfig | None) -> None:
    """Ready a learner's networks, in place: GELUs fused into one kernel (``ppo.compute.fused_kernels``; not when
    ``config`` is None) in the policy and the reference, the policy's activations recomputed in the backward
    (bit-identical, with a fraction of the activations' memory) and, with ``ppo.compute.gradient_checkpointing``, its
    transformer layers' too (:func:`~marllm.models.checkpointing.enable_gradient_checkpointing`)."""
    if config is not None and config.compute.fused_kernels:
        for network in (model, reference):
            if network is not None:
                fuse_tanh_gelus(network)
    recompute_activations_in_backward(model)
    if config is not None and config.compute.gradient_checkpointing:
        enable_gradient_checkpointing(model)


def new_value_head(model: PreTrainedModel, device: torch.device, placement: Placement) -> ValueHead:
    """A value head for ``model`` on ``device``, prepared by ``placement`` as the policy was (under FSDP split
    like it, so that every trained parameter is a DTensor whose gradient FSDP reduces)."""
    return placement.prepare(ValueHead(model.config.hidden_size).to(device))


def new_optimizer(
    name: str,
    model: PreTrainedModel,
    adapter: str | None,
    value_head: ValueHead | None,
    config: PPOConfig,
    placement: Placement,
    seed: int = 0,
) -> torch.optim.Optimizer:
    """Adam over the trained parameters, in this order: ``adapter``'s (or every trainable one of ``model``), then the
    value head's. torch's Adam for float32 parameters; for a full bfloat16 model, :class:`StochasticRoundingAdam`
    (its rounding seeded by ``seed``); other half-precision parameters are refused (:func:`check_full_precision`)."""
    if adapter is not None:
        trainable = adapter_parameters(model, adapter)
    else:
        trainable = [p for p in model.parameters() if p.requires_grad]
    parameters = trainable + (list(value_head.parameters()) if value_head is not None else [])
    if check_full_precision(name, trainable, adapter):
        if not placement.stochastic_rounding:
            raise ValueError(
                f"learner {name!r}: a model.fsdp bfloat16 model is not trained with stochastic rounding; "
                "use model.dtype: float32 with model.fsdp_compute_dtype: bfloat16"
            )
        return StochasticRoundingAdam(
            parameters, lr=config.optimiser.learning_rate, eps=config.optimiser.adam_eps, seed=seed
        )
    return torch.optim.Adam(
        parameters,
        lr=config.optimiser.learning_rate,
        eps=config.optimiser.adam_eps,
        fused=True if config.compute.fused_kernels and placement.fused_optimizer else None,
    )


def set_learning_rate(optimizer: torch.optim.Optimizer, config: Any, update: int) -> dict[str, float]:
    """Give every parameter group the learning rate of the learner's ``update``-th update (from 0;
    :meth:`~marllm.algorithms.ppo_sections.OptimiserConfig.learning_rate_at`: from the update count, so a restored
    learner goes on where it was), and return it as a metric where it is annealed (``{}`` where it is constant)."""
    learning_rate = config.optimiser.learning_rate_at(update)
    for group in optimizer.param_groups:
        group["lr"] = learning_rate
    return {} if config.optimiser.anneal_updates is None else {"learning_rate": learning_rate}
