"""What a causal LM costs in memory, read from its shape: parameters, the bytes of its saved activations at a given
batch and length, and its key/value cache — without loading its weights.

The parameters are counted on the ``meta`` device (no storage). The activations a backward needs are measured, not
modelled: a copy of the model cut to one and to two layers at its full width (and a vocabulary of a few tokens) runs
a real forward of two rows, with a saved-tensors hook that sums the bytes autograd keeps; one layer's bytes are the
difference, and everything scales linearly in rows and layers. This holds for any architecture transformers builds,
whatever its attention kernel saves, and costs a forward of two layers.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from marllm.models.checkpointing import enable_gradient_checkpointing
from marllm.models.devices import resolve_dtype
from marllm.models.float32_products import needs_float32_products, use_float32_products

__all__ = [
    "ActivationBytes",
    "ModelShape",
    "activation_bytes",
    "adapter_size",
    "bytes_per_element",
    "model_shape",
    "saved_tensor_bytes",
]

_MEASURED_ROWS = 2
_TINY_VOCABULARY = 64


def bytes_per_element(dtype: str) -> int:
    """Bytes of one element of a dtype name (``float32``: 4, ``bfloat16`` and ``float16``: 2)."""
    return resolve_dtype(dtype).itemsize


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a causal LM that its memory depends on.

    Attributes:
        config: the model's transformers config.
        parameters: distinct parameters (tied embeddings counted once).
        lora_parameters: trainable parameters of one LoRA adapter on it (0 when not asked for).
        layers, hidden_size, vocab_size: from the config.
        kv_elements_per_token: key and value elements per token over all layers (times the dtype's bytes: the
            key/value cache's bytes per token).
    """

    config: PretrainedConfig
    parameters: int
    lora_parameters: int
    layers: int
    hidden_size: int
    vocab_size: int
    kv_elements_per_token: int


def _layer_count_key(config: PretrainedConfig) -> str:
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if isinstance(getattr(config, key, None), int):
            return key
    raise ValueError(f"cannot tell the layer count of a {type(config).__name__} (no num_hidden_layers or n_layer)")


def _meta_model(config: PretrainedConfig) -> PreTrainedModel:
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def model_shape(name_or_path: str, lora: Any = None, trust_remote_code: bool = False) -> ModelShape:
    """The shape of the model at ``name_or_path`` (its config only is read) and, with ``lora``
    (:class:`~marllm.models.lora_settings.LoraSettings`), the size of one adapter on it."""
    config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    model = _meta_model(config)
    parameters = sum(p.numel() for p in model.parameters())  # .parameters() yields a tied weight once
    adapter = 0 if lora is None else adapter_size(config, lora)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = getattr(text, _layer_count_key(text))
    hidden = getattr(text, "hidden_size", None) or text.n_embd
    heads = getattr(text, "num_attention_heads", None) or text.n_head
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    return ModelShape(
        config=config,
        parameters=parameters,
        lora_parameters=adapter,
        layers=layers,
        hidden_size=hidden,
        vocab_size=text.vocab_size,
        kv_elements_per_token=2 * layers * kv_heads * head_dim,
    )


def adapter_size(config: PretrainedConfig, lora: Any) -> int:
    """Trainable parameters of one LoRA adapter of ``lora`` (:class:`~marllm.models.lora_settings.LoraSettings`) on a
    model of ``config``, counted on the meta device."""
    from marllm.models.lora import attach_adapters  # peft: only for LoRA plans

    with torch.device("meta"):
        adapted = attach_adapters(_meta_model(config), ["plan"], lora)
    return sum(p.numel() for p in adapted.parameters() if p.requires_grad)


@contextlib.contextmanager
def saved_tensor_bytes(exclude: list[torch.Tensor] | None = None) -> Iterator[list[int]]:
    """While open, the bytes of the distinct storages autograd saves for a backward are summed into the one-element
    list it yields (storages of ``exclude``, e.g. the parameters, not counted)."""
    excluded = {t.untyped_storage()._cdata for t in exclude or []}
    seen: dict[int, int] = {}
    total = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key not in excluded and key not in seen:
            seen[key] = storage.nbytes()
            total[0] += storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield total


@dataclass(frozen=True)
class ActivationBytes:
    """Bytes autograd keeps for the backward of a trunk forward (the LM head's logits excluded).

    Attributes:
        fixed: what does not grow with depth (embeddings, final norm), per row.
        per_layer: one layer's, per row.
        layers: the model's layer count.
    """

    fixed: float
    per_layer: float
    layers: int

    def total(self, rows: int) -> float:
        """Bytes kept for ``rows`` rows."""
        return rows * (self.fixed + self.per_layer * self.layers)

    def one_layer(self, rows: int) -> float:
        """One layer's bytes for ``rows`` rows: what a checkpointed layer recomputes in the backward."""
        return rows * self.per_layer


def activation_bytes(
    shape: ModelShape,
    tokens: int,
    dtype: str,
    autocast_dtype: str | None = None,
    checkpointing: bool = False,
    lora: Any = None,
) -> ActivationBytes:
    """The activation bytes of ``shape``'s trunk on rows of ``tokens`` tokens (left-padded, as marllm's forwards
    are), in ``dtype`` (under ``autocast_dtype``'s autocast, if given), with or without gradient checkpointing, and
    with a LoRA adapter of ``lora`` (:class:`~marllm.models.lora_settings.LoraSettings`; peft keeps its own inputs):
    measured on one- and two-layer copies at full width (see the module's docstring)."""
    settings = (tokens, dtype, autocast_dtype, checkpointing, lora)
    measured = [_measured_saved_bytes(shape.config, depth, *settings) for depth in (1, 2)]
    per_layer = max(0, measured[1] - measured[0]) / _MEASURED_ROWS
    fixed = max(0, measured[0] / _MEASURED_ROWS - per_layer)
    return ActivationBytes(fixed=fixed, per_layer=per_layer, layers=shape.layers)


_MEASURED: dict[tuple[Any, ...], int] = {}
"""Saved bytes already measured, by model config and settings: a plan's levers ask for the same ones again."""


def _measured_saved_bytes(config: PretrainedConfig, depth: int, *settings: Any) -> int:
    key = (config.to_json_string(), depth, *settings[:-1], repr(settings[-1]))  # LoRA settings: a mutable dataclass
    if key not in _MEASURED:
        _MEASURED[key] = _trunk_saved_bytes(config, depth, *settings)
    return _MEASURED[key]


def _trunk_saved_bytes(
    config: PretrainedConfig,
    depth: int,
    tokens: int,
    dtype: str,
    autocast_dtype: str | None,
    checkpointing: bool,
    lora: Any,
) -> int:
    cut = copy.deepcopy(config)
    text = cut.get_text_config() if hasattr(cut, "get_text_config") else cut
    setattr(text, _layer_count_key(text), depth)
    if hasattr(text, "layer_types") and isinstance(text.layer_types, list):
        text.layer_types = text.layer_types[:depth]
    text.vocab_size = _TINY_VOCABULARY
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if isinstance(getattr(text, key, None), int):
            setattr(text, key, 0)
    torch_dtype = resolve_dtype(dtype)
    generator_state = torch.random.get_rng_state()  # a plan must not move the caller's random stream
    try:
        model = AutoModelForCausalLM.from_config(cut, dtype=torch_dtype)
    finally:
        torch.random.set_rng_state(generator_state)
    if needs_float32_products(torch_dtype, torch.device("cpu")):  # saves the same tensors, at float32's speed
        use_float32_products(model)
    if lora is not None:
        from marllm.models.lora import attach_adapters  # peft: only for LoRA plans

        model = attach_adapters(model, ["plan"], lora)
    model.eval()  # as a learner's policy: no dropout, whose masks would be saved too
    if checkpointing:
        enable_gradient_checkpointing(model)
    ids = torch.zeros(_MEASURED_ROWS, tokens, dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[0, : max(1, tokens // 4)] = 0  # one left-padded row: the masked attention path real batches take
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    autocast = (
        torch.autocast("cpu", dtype=resolve_dtype(autocast_dtype)) if autocast_dtype else contextlib.nullcontext()
    )
    trunk = (model.get_base_model() if lora is not None else model).get_decoder()
    with autocast, saved_tensor_bytes(exclude=list(model.parameters())) as saved:
        trunk(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
    return saved[0]
