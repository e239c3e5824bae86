"""Policies, value heads and the shared frozen reference."""

from marllm.models.policy import (
    ReferencePool,
    ValueHead,
    context_length,
    load_causal_lm,
    load_tokenizer,
    resolve_device,
    response_forward,
)

__all__ = [
    "ReferencePool",
    "ValueHead",
    "context_length",
    "load_causal_lm",
    "load_tokenizer",
    "resolve_device",
    "response_forward",
]
