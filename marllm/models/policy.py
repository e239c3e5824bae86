"""Loading causal LMs, the scalar value head, and the shared frozen reference."""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    """``"auto"`` is CUDA when available, else CPU; anything else is passed to ``torch.device``."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str) -> torch.dtype:
    if dtype not in _DTYPES:
        raise ValueError(f"model dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """The model's tokenizer, set up for batched generation (see :func:`ready_for_generation`)."""
    return ready_for_generation(AutoTokenizer.from_pretrained(name_or_path), name_or_path)


def ready_for_generation(tokenizer: PreTrainedTokenizerBase, owner: str = "the model") -> PreTrainedTokenizerBase:
    """Left padding for batched generation; pad falls back to EOS (GPT-2 has none). Changes ``tokenizer`` in place."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer of {owner!r} has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(
    name_or_path: str, dtype: str = "float32", device: str = "auto", load_in_4bit: bool = False
) -> PreTrainedModel:
    """Any ``AutoModelForCausalLM`` hub id or local directory (optionally 4-bit, on CUDA with bitsandbytes)."""
    if load_in_4bit:
        from transformers import BitsAndBytesConfig

        from marllm.models.lora import check_4bit_available

        check_4bit_available()
        quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=resolve_dtype(dtype))
        return AutoModelForCausalLM.from_pretrained(
            name_or_path, dtype=resolve_dtype(dtype), quantization_config=quantization, device_map={"": 0}
        )
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=resolve_dtype(dtype))
    return model.to(resolve_device(device))


def context_length(model: PreTrainedModel) -> int | None:
    """The longest sequence the model's position embeddings allow (None if unbounded or unknown)."""
    config = model.config
    for key in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


class ValueHead(nn.Module):
    """V(s_t): a linear map of the policy's last hidden state to a scalar, one per position."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.summary = nn.Linear(hidden_size, 1)
        # A small initial output keeps the first value losses (and with vf_coef the first updates) tame.
        nn.init.normal_(self.summary.weight, std=1.0 / (hidden_size + 1))
        nn.init.zeros_(self.summary.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.summary(hidden.to(self.summary.weight.dtype)).squeeze(-1)


def position_ids_for(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that start at 0 on the first real token of a left-padded row."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def response_forward(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    value_head: ValueHead | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits (and values) at the positions that predict the response tokens.

    ``input_ids`` is ``[left-padded prompt (P) | response (L)]``; the logits at positions P−1 … P+L−2 predict the L
    response tokens. Returns logits (B, L, V) and values (B, L) or None.
    """
    response_length = input_ids.shape[1] - prompt_length
    extra = {}
    if _accepts_logits_to_keep(model):
        # Project only the positions that predict response tokens onto the vocabulary: for long prompts (the
        # observer's) most of the (B, T, V) logits would be thrown away.
        extra["logits_to_keep"] = response_length + 1
    outputs = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_for(attention_mask),
        output_hidden_states=value_head is not None,
        use_cache=False,
        **extra,
    )
    logits = outputs.logits[:, -(response_length + 1) : -1]  # (B, L, V)
    values = None
    if value_head is not None:
        values = value_head(outputs.hidden_states[-1][:, prompt_length - 1 : -1])  # (B, L)
    return logits, values


def _accepts_logits_to_keep(model: PreTrainedModel) -> bool:
    forward = getattr(model, "get_base_model", lambda: model)().forward
    return "logits_to_keep" in inspect.signature(forward).parameters


@dataclass(frozen=True)
class _ReferenceKey:
    name_or_path: str
    dtype: str
    device: str


class ReferencePool:
    """One frozen copy π_0 per (base model, dtype, device), shared by every learner that starts from it.

    N learners from one base cost N policies + 1 reference, not 2N models.
    """

    def __init__(self) -> None:
        self._models: dict[_ReferenceKey, PreTrainedModel] = {}
        self._lock = threading.Lock()

    def get(self, name_or_path: str, dtype: str = "float32", device: str = "auto") -> PreTrainedModel:
        key = _ReferenceKey(name_or_path, dtype, str(resolve_device(device)))
        with self._lock:
            if key not in self._models:
                model = load_causal_lm(name_or_path, dtype, device)
                model.eval()
                model.requires_grad_(False)
                self._models[key] = model
            return self._models[key]

    def __len__(self) -> int:
        return len(self._models)
