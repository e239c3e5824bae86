"""Loading causal LMs, the scalar value head, and the shared frozen reference."""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from marllm.models.devices import resolve_device, resolve_dtype
from marllm.models.float32_products import needs_float32_products, use_float32_products
from marllm.utils.references import model_load_error

if TYPE_CHECKING:
    from marllm.models.memory import ModelShape


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The model's tokenizer, set up for batched generation (see :func:`ready_for_generation`).

    ``trust_remote_code`` lets transformers run Python code shipped with the model; leave it off unless you trust it.

    Raises:
        MissingReferenceError: ``name_or_path`` is a missing path, or a hub id not in the cache while offline.
        OSError: the tokenizer cannot be loaded otherwise, or the model has no tokenizer files; the message names
            the model.
    """
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except OSError as error:
        raise model_load_error(name_or_path, "tokenizer", error, key="model.name_or_path") from error
    if len(tokenizer) < 2:  # transformers builds an empty tokenizer for a model directory without tokenizer files
        raise OSError(
            f"model {name_or_path!r} has no tokenizer files (tokenizer.json, or vocab.json and merges.txt, …); "
            "save the tokenizer next to the model with tokenizer.save_pretrained(DIRECTORY)"
        )
    return ready_for_generation(tokenizer, name_or_path)


def ready_for_generation(tokenizer: PreTrainedTokenizerBase, owner: str = "the model") -> PreTrainedTokenizerBase:
    """Left padding for batched generation; pad falls back to EOS (GPT-2 has none). Changes ``tokenizer`` in place."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer of {owner!r} has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(
    name_or_path: str,
    dtype: str = "float32",
    device: str = "auto",
    load_in_4bit: bool = False,
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """Any ``AutoModelForCausalLM`` hub id or local directory (optionally 4-bit, on CUDA with bitsandbytes).

    A bfloat16 model on a CPU without bfloat16 matrix instructions computes its linear layers' products in float32
    (:mod:`marllm.models.float32_products`: the same results up to summation order, at float32's speed).

    ``trust_remote_code`` lets transformers run Python code shipped with the model; leave it off unless you trust it.

    Raises:
        MissingReferenceError: ``name_or_path`` is a missing path, or a hub id not in the cache while offline.
        OSError: the model cannot be loaded otherwise (a damaged weights file, …); the message names it.
    """
    options = {}
    if load_in_4bit:
        from transformers import BitsAndBytesConfig  # 4-bit loading only; about 1 s to import

        from marllm.models.lora import check_4bit_available  # peft: loaded only by runs that ask for it

        check_4bit_available()
        quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=resolve_dtype(dtype))
        options = {"quantization_config": quantization, "device_map": {"": 0}}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            name_or_path, dtype=resolve_dtype(dtype), trust_remote_code=trust_remote_code, **options
        )
    except (OSError, SafetensorError) as error:
        raise model_load_error(name_or_path, "weights", error, key="model.name_or_path") from error
    if load_in_4bit:
        return model
    model = model.to(resolve_device(device))
    if needs_float32_products(model.dtype, model.device):  # bfloat16 on a CPU without bfloat16 instructions
        use_float32_products(model)
    return model


def context_length(model: PreTrainedModel | ModelShape) -> int | None:
    """The longest sequence the model's position embeddings allow, in tokens (None if unbounded or unknown); of a
    model, or of the :class:`~marllm.models.memory.ModelShape` a memory plan reads from its config alone."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(text, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


class ValueHead(nn.Module):
    """V(s_t): a linear map of the hidden state the LM head reads (the last layer's, for most models) to a scalar,
    one per position."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.summary = nn.Linear(hidden_size, 1)
        # A small initial output keeps the first value losses (and with vf_coef the first updates) tame.
        nn.init.normal_(self.summary.weight, std=1.0 / (hidden_size + 1))
        nn.init.zeros_(self.summary.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # In the head's own dtype even under mixed precision (ppo.compute.autocast_dtype): values enter GAE and the
        # value loss, which bfloat16's ~3 significant digits would round.
        with torch.autocast(hidden.device.type, enabled=False):
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
    response tokens. Returns logits (B, L, V) and values (B, L) or None. Where the model takes ``logits_to_keep``
    only those L positions are projected onto the vocabulary, into a contiguous (B, L, V) tensor.

    The value head reads the LM head's input at those positions, the hidden state the logits are computed from (and
    what a rollout captured from ``generate``'s forwards reads): the last layer's output for most models, but not for
    a model that scales it before its head (MiniCPM3's ``logits_scaling``).
    """
    response_length = input_ids.shape[1] - prompt_length
    keep = logits_to_keep_kind(model)
    extra: dict[str, int | torch.Tensor] = {}
    # Project only the positions that predict response tokens onto the vocabulary: for long prompts (the observer's)
    # most of the (B, T, V) logits would be thrown away. Positions as a tensor give exactly the L rows needed, so
    # no (B, L+1, V) buffer is kept alive by a slice of it, nor rebuilt by the slice's backward.
    if keep == "positions":
        extra["logits_to_keep"] = torch.arange(prompt_length - 1, input_ids.shape[1] - 1, device=input_ids.device)
    elif keep == "count":
        extra["logits_to_keep"] = response_length + 1
    with head_inputs(model, value_head is not None) as captured:
        outputs = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_for(attention_mask),
            use_cache=False,
            **extra,
        )
    logits = outputs.logits if keep == "positions" else outputs.logits[:, -(response_length + 1) : -1]  # (B, L, V)
    values = None
    if value_head is not None:
        [hidden] = captured  # (B, L, H) with positions kept, else (B, L + 1, H) or (B, T, H)
        values = value_head(hidden if keep == "positions" else hidden[:, -(response_length + 1) : -1])  # (B, L)
    return logits, values


@contextlib.contextmanager
def head_inputs(
    model: PreTrainedModel,
    wanted: bool,
    take: Callable[[torch.Tensor], torch.Tensor] | None = None,
    owner: str = "a value head",
) -> Iterator[list[torch.Tensor]]:
    """While open (and ``wanted``), each forward of ``model`` appends the input of its LM head (its output
    embeddings), with its autograd history, or what ``take`` makes of it; ``owner`` names what needs it in the error
    raised for a model without an LM head."""
    inputs: list[torch.Tensor] = []
    if not wanted:
        yield inputs
        return
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{owner}: the model has no output embeddings (LM head) to take the hidden states from")
    handle = head.register_forward_pre_hook(lambda module, args: inputs.append(take(args[0]) if take else args[0]))
    try:
        yield inputs
    finally:
        handle.remove()


def logits_to_keep_kind(model: PreTrainedModel) -> str | None:
    """``"positions"`` if ``logits_to_keep`` takes a tensor of positions, ``"count"`` if only an int, else None."""
    return _logits_to_keep_kind_of(type(getattr(model, "get_base_model", lambda: model)()))


@functools.cache
def _logits_to_keep_kind_of(model_class: type) -> str | None:
    # Per class: the forward's signature is the same for every instance, and this runs at every forward pass.
    parameter = inspect.signature(model_class.forward).parameters.get("logits_to_keep")
    if parameter is None:
        return None
    return "positions" if "Tensor" in str(parameter.annotation) else "count"


@dataclass(frozen=True)
class _ReferenceKey:
    name_or_path: str
    dtype: str
    device: str
    trust_remote_code: bool


class ReferencePool:
    """One frozen copy π_0 per (base model, dtype, device), shared by every learner that starts from it.

    N learners from one base cost N policies + 1 reference, not 2N models.
    """

    def __init__(self) -> None:
        self._models: dict[_ReferenceKey, PreTrainedModel] = {}
        self._lock = threading.Lock()

    def get(
        self, name_or_path: str, dtype: str = "float32", device: str = "auto", trust_remote_code: bool = False
    ) -> PreTrainedModel:
        key = _ReferenceKey(name_or_path, dtype, str(resolve_device(device)), trust_remote_code)
        with self._lock:
            if key not in self._models:
                model = load_causal_lm(name_or_path, dtype, device, trust_remote_code=trust_remote_code)
                model.eval()
                model.requires_grad_(False)
                self._models[key] = model
            return self._models[key]

    def __len__(self) -> int:
        return len(self._models)
