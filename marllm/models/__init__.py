"""Policies, value heads and the shared frozen reference; device, dtype and LoRA settings.

The names below are loaded on first use, so that the config's checks of device, dtype and LoRA names (in
:mod:`marllm.models.devices` and :mod:`marllm.models.lora_settings`) do not load torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from marllm.utils.lazy_exports import lazy_exports

_EXPORTS = {
    "ReferencePool": "marllm.models.policy",
    "ValueHead": "marllm.models.policy",
    "context_length": "marllm.models.policy",
    "load_causal_lm": "marllm.models.policy",
    "load_tokenizer": "marllm.models.policy",
    "resolve_device": "marllm.models.devices",
    "response_forward": "marllm.models.policy",
}

__all__ = [
    "ReferencePool",
    "ValueHead",
    "context_length",
    "load_causal_lm",
    "load_tokenizer",
    "resolve_device",
    "response_forward",
]

if TYPE_CHECKING:
    from marllm.models.devices import resolve_device
    from marllm.models.policy import (
        ReferencePool,
        ValueHead,
        context_length,
        load_causal_lm,
        load_tokenizer,
        response_forward,
    )

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
