"""Gradient checkpointing of a policy's transformer layers (``ppo.compute.gradient_checkpointing``).

transformers' own checkpointing (``activation_checkpointing_enable``, formerly ``gradient_checkpointing_enable``)
makes each decoder layer keep only its input under autograd and recompute its activations in the backward, with
torch's non-reentrant checkpoint: the same ops on the same inputs, so the same gradients, for about one more forward
per update pass and a layer's activations alive instead of every layer's.

transformers checkpoints a layer only while it is in training mode, and then drops any key/value cache it is handed.
A learner keeps its policy in eval mode (dropout off, so that the first PPO ratio is exactly 1), samples with a cache
and runs passes that share a prompt prefix on a cache (:mod:`marllm.models.prefix_forward`). So here each layer is
put in training mode just for its own call, where gradients are being recorded and no cache is read or written, and
set back after: the layer's submodules (its dropouts) stay in eval mode, generation and the rollout's forwards (no
gradients) run exactly as before, and a pass on a shared prefix's cache keeps its activations.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Cache, PreTrainedModel

__all__ = ["checkpointed_layers", "enable_gradient_checkpointing"]

_FLAG = "_marllm_checkpointing_hooks"


def enable_gradient_checkpointing(model: Any) -> int:
    """Checkpoint every transformer layer of ``model`` (a transformers causal LM, or a peft model on one: its base's
    layers) in the backward passes of training, in place; return how many layers are checkpointed. Calling it twice
    changes nothing more.

    Raises:
        ValueError: the model's class does not support gradient checkpointing (naming it and
            ``ppo.compute.gradient_checkpointing``).
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ValueError(
            f"ppo.compute.gradient_checkpointing: {type(base).__name__} does not support gradient checkpointing "
            "(transformers' supports_gradient_checkpointing is false for it); set "
            "ppo.compute.gradient_checkpointing: false"
        )
    if getattr(base, _FLAG, None) is None:
        enable = getattr(base, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:  # transformers before activation_checkpointing_enable
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # Non-reentrant checkpointing needs no input that requires grad (the reentrant one did, for LoRA's frozen
        # embeddings): the hook that forces it is dropped.
        if hasattr(base, "disable_input_require_grads"):
            base.disable_input_require_grads()
        hooks = []
        for layer in checkpointed_layers(base):
            hooks.append(layer.register_forward_pre_hook(_train_mode_if_recorded, with_kwargs=True))
            hooks.append(layer.register_forward_hook(_mode_back))
        setattr(base, _FLAG, hooks)
    return len(checkpointed_layers(base))


def checkpointed_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of ``model`` that transformers checkpoints (its decoder layers), outer models aside."""
    return [
        module
        for module in model.modules()
        if getattr(module, "gradient_checkpointing", False) is True and not isinstance(module, PreTrainedModel)
    ]


def _uses_cache(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return bool(kwargs.get("use_cache")) or any(isinstance(value, Cache) for value in (*args, *kwargs.values()))


def _train_mode_if_recorded(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    # The layer alone (not its submodules): its own training flag is what makes transformers checkpoint it.
    module._marllm_was_training = module.training  # type: ignore[assignment]
    module.training = torch.is_grad_enabled() and not _uses_cache(args, kwargs)


def _mode_back(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
    module.training = module._marllm_was_training  # type: ignore[assignment]
