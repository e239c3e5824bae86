"""Batched sampling of responses with left padding and the KV cache.

The logits processors responses are sampled through, and the log-probs' logits that apply them again, are
:mod:`marllm.models.logits_processing`'s (importable from here too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import (
    BatchEncoding,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from marllm.models.generation_config import GenerationConfig
from marllm.models.logits_processing import (  # noqa: F401 - the log-probs' processing, re-exported
    logprob_logits,
    process_logits,
    reference_logprob_logits,
    reference_processors,
    sampling_processors,
)
from marllm.models.policy import head_inputs
from marllm.models.prefix_forward import shared_prefix_prompts
from marllm.models.token_prompts import TokenPrompts

# The settings of a model's own generation_config that may differ from transformers' defaults: token ids, lengths,
# caching and output options, and the four sampling settings generate_responses passes explicitly. Any other
# setting (min_new_tokens, num_beams, no_repeat_ngram_size, guidance_scale, ...) could make generate add a
# processor of its own that the log-probs would not see, so a model that sets one is refused.
_HARMLESS_MODEL_SETTINGS = frozenset(
    {
        "_from_model_config",
        "transformers_version",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "decoder_start_token_id",
        "max_length",
        "max_new_tokens",
        "do_sample",
        "use_cache",
        "cache_implementation",
        "cache_config",
        "output_attentions",
        "output_hidden_states",
        "output_scores",
        "output_logits",
        "return_dict_in_generate",
        "temperature",
        "top_k",
        "top_p",
        "repetition_penalty",
    }
)


class PromptTooLongError(ValueError):
    """A prompt plus the response budget does not fit in the model's context."""


@dataclass
class GeneratedBatch:
    """Responses to a batch of prompts, as text and as the token ids that produced them.

    ``prompt_ids``/``prompt_mask`` are (B, P), left-padded; ``response``/``mask`` are (B, L), with ``mask`` 1 up to
    and including the first EOS. ``logits`` (B, L, V) and ``hidden`` (B, L, H) are there only when asked for
    (:func:`generate_responses` with ``capture``): the raw logits each response token was sampled from (before any
    processor) and the last hidden states they were projected from, as ``generate``'s own KV-cached forwards computed
    them.
    """

    texts: tuple[str, ...]
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response: torch.Tensor
    mask: torch.Tensor
    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    cache: Any = None
    """``generate``'s key/value cache at the end, when kept (:func:`sample_after`'s ``keep_cache``)."""


def check_chat_template(tokenizer: PreTrainedTokenizerBase, chat_template: bool, owner: str = "generation") -> None:
    """With ``generation.chat_template`` on, the tokenizer must have a chat template."""
    if chat_template and not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            f"{owner}: generation.chat_template is true but the tokenizer of {name!r} has no chat template; set "
            "generation.chat_template: false to feed prompts as plain text, or use an instruct model's tokenizer"
        )


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], chat_template: bool, owner: str = "generation"
) -> BatchEncoding:
    """Left-padded ``input_ids`` and ``attention_mask`` of ``prompts``, each as plain text or, with
    ``chat_template``, as a user turn of the tokenizer's chat template ending in its generation prompt; prompts given
    as token ids (:class:`~marllm.models.token_prompts.TokenPrompts`) are only padded."""
    if isinstance(prompts, TokenPrompts):  # a seat's sequence: read as it stands, never tokenized again
        input_ids, attention_mask = prompts.padded(tokenizer.pad_token_id)
        return BatchEncoding({"input_ids": input_ids, "attention_mask": attention_mask})
    if not chat_template:
        return tokenizer(list(prompts), return_tensors="pt", padding=True)
    check_chat_template(tokenizer, chat_template, owner)
    rendered = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]
    # The template writes its own special tokens (BOS, turn markers): the tokenizer must not add them again.
    return tokenizer(rendered, return_tensors="pt", padding=True, add_special_tokens=False)


FREE_TEXT_BUDGET = "lower generation.max_new_tokens"
"""What shortens the answer of a free-text response (the remedy :func:`check_prompt_lengths` names by default)."""


def check_prompt_lengths(
    prompts: Sequence[str],
    prompt_mask: torch.Tensor,
    budget: int | torch.Tensor,
    context: int | None,
    owner: str,
    budget_remedy: str = FREE_TEXT_BUDGET,
) -> None:
    """Every prompt must have a token, and prompt + ``budget`` new tokens (one for all, or (B,) per prompt) must fit
    in ``context``; ``budget_remedy`` says what would shorten the answer, in the error."""
    lengths = prompt_mask.sum(1).tolist()  # one device→host copy; the checks run on the host
    empty = [i for i, length in enumerate(lengths) if length == 0]
    if empty:
        raise ValueError(f"{owner}: prompt(s) {empty[:10]} tokenize to nothing; every prompt needs at least one token")
    if context is not None:
        budgets = budget.expand(len(lengths)).tolist() if isinstance(budget, torch.Tensor) else [budget] * len(lengths)
        too_long = [i for i, (length, new) in enumerate(zip(lengths, budgets, strict=True)) if length + new > context]
        if too_long:
            i = too_long[0]
            new = budgets[i]
            raise PromptTooLongError(
                f"{owner}: prompt {i} has {lengths[i]} tokens; with up to {new} new tokens it exceeds the "
                f"model context of {context} ({len(too_long)} prompt(s) too long; prompt {i} starts "
                f"{prompts[i][:80]!r}). Shorten the prompt (env.templates or game.templates, or what it shows: a "
                f"task's query, a game's state), {budget_remedy}, or use a model of longer context"
            )


def check_model_sampling_defaults(model: PreTrainedModel, owner: str = "generation") -> None:
    """Refuse a model whose own ``generation_config`` would make ``generate`` filter logits beyond ours.

    ``generate`` fills every setting it is not given from the model's ``generation_config``. Any setting that
    differs from transformers' default, other than token ids, lengths, caching, outputs and the sampling settings
    passed explicitly, is refused: it could add a processor that :func:`sampling_processors` does not know of, so the
    log-probs would not be those of the sampler.
    """
    config = getattr(model, "generation_config", None)
    settings = config.to_diff_dict() if config is not None else {}
    active = {name: value for name, value in settings.items() if name not in _HARMLESS_MODEL_SETTINGS}
    if active:
        raise ValueError(
            f"{owner}: the model's generation_config sets {active}, which generate would apply on top of marllm's "
            "sampling settings (and which the log-probs would not see); unset them (model.generation_config.<name> = "
            "None) before training"
        )


def check_static_cache(model: PreTrainedModel, owner: str = "generation") -> None:
    """``generation.cache: static`` needs a model whose ``generate`` builds the KV cache (a transformer's); refuse one
    that keeps a state of its own, for which generate would ignore the setting."""
    supports = getattr(model, "_supports_default_dynamic_cache", None)
    if supports is None or not supports():
        raise ValueError(
            f"{owner}: generation.cache is 'static' but {type(model).__name__} does not use a KV cache that generate "
            "can preallocate; set generation.cache: dynamic for this model"
        )


def _stack_captured(
    step_logits: Sequence[torch.Tensor], hidden_steps: Sequence[torch.Tensor], length: int, owner: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The captured logits and last hidden states of a response of ``length`` tokens, as (B, L, V) and (B, L, H):
    one of each per sampled token, or a RuntimeError."""
    if not (len(step_logits) == len(hidden_steps) == length):
        raise RuntimeError(
            f"{owner}: generate returned {len(step_logits)} logits and ran {len(hidden_steps)} forwards for "
            f"{length} response tokens; they cannot be matched to the tokens "
            "(ppo.compute.rollout_from_generate needs one forward per sampled token)"
        )
    logits = torch.stack(step_logits, 1)  # generate's float32 copies of each step's raw logits
    hidden = torch.stack(hidden_steps, 1)
    return logits, hidden


def _response_mask(response: torch.Tensor, generation: GenerationConfig, eos: int | None) -> torch.Tensor:
    """1 for a response's tokens: up to and including its first EOS with ``stop_at_eos``, else every token."""
    if generation.stop_at_eos and eos is not None:
        is_eos = (response == eos).long()
        # Keep tokens up to and including the first EOS; what generate appends after it is padding.
        return ((is_eos.cumsum(1) - is_eos) == 0).long()
    return torch.ones_like(response)


@torch.no_grad()
def generate_responses(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    budget: int,
    generation: GenerationConfig,
    context: int | None = None,
    owner: str = "generation",
    capture: bool = False,
    restriction: Callable[[int], LogitsProcessor] | None = None,
    budget_remedy: str = FREE_TEXT_BUDGET,
) -> GeneratedBatch:
    """Sample one response of at most ``budget`` tokens per prompt, all prompts in one ``generate`` call (a prompt
    that leaves too little of the model's ``context`` is refused, the error naming ``budget_remedy``).

    Sampling goes through :func:`sampling_processors` and nothing else: ``generate``'s own processors are all left off.
    With ``capture``, the batch also holds the logits and last hidden states of ``generate``'s forwards at every
    response position (``GeneratedBatch.logits``/``hidden``): a full forward over prompt and response computes the same
    numbers up to float rounding (the KV cache splits the sums differently), so they can stand in for it.
    ``restriction(P)`` (P: the padded prompts' width) makes a processor applied before the sampling processors (the
    legal moves' :class:`~marllm.models.move_tries.LegalMovesProcessor`).
    """
    device = next(model.parameters()).device
    encoded = encode_prompts(tokenizer, prompts, generation.chat_template, owner)
    prompt_ids = encoded["input_ids"].to(device)  # (B, P), left-padded
    prompt_mask = encoded["attention_mask"].to(device)
    check_prompt_lengths(prompts, prompt_mask, budget, context, owner, budget_remedy)
    if not isinstance(prompts, TokenPrompts):
        return sample_after(model, tokenizer, prompt_ids, prompt_mask, budget, generation, owner, capture, restriction)
    # A seat's sequence: go on from its rows' kept caches where it has them, and keep the cache for its next turn.
    cache = None if prompts.continuation is None else prompts.continuation[2]
    batch = sample_after(
        model, tokenizer, prompt_ids, prompt_mask, budget, generation, owner, capture, restriction,
        cache=cache, keep_cache=True,
    )  # fmt: skip
    prompts.kept = (batch.cache, torch.cat([batch.prompt_mask, batch.mask], 1))
    return batch


@torch.no_grad()
def sample_after(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    budget: int,
    generation: GenerationConfig,
    owner: str = "generation",
    capture: bool = False,
    restriction: Callable[[int], LogitsProcessor] | None = None,
    share_prefix: bool = True,
    cache: Any = None,
    keep_cache: bool = False,
) -> GeneratedBatch:
    """:func:`generate_responses` after prompts given as token ids (B, P) and their attention mask, on the model's
    device (their lengths checked already). ``share_prefix``: run the prompts' common beginning once
    (:func:`~marllm.models.prefix_forward.shared_prefix_prompts`, which lays the prompts out anew; not with
    ``generation.cache: static``, whose cache generate builds itself); off, the prompts are read exactly as laid out
    (what a later forward over the same ids must see). ``cache``: the key/value cache of the ids' first positions to
    go on from (:func:`~marllm.models.cache_continuation.continued_layout`), instead of a shared prefix's;
    ``keep_cache``: the batch holds ``generate``'s cache at the end."""
    check_model_sampling_defaults(model, owner)
    static = generation.cache == "static"
    if static:
        check_static_cache(model, owner)
    eos = tokenizer.eos_token_id
    # The prompts' common beginning (a game's rules) computed once: generate goes on from its cache (where the
    # model may choose its own forwards: prefix_forward.can_share). Generate keeps every rank of a model FSDP manages
    # stepping until all are done (synced_gpus, on by itself); the caller's placement gathers it for the call.
    prefix_cache = cache
    if cache is None and share_prefix and not static:  # a cache to go on from, or one to build: not both
        prompt_ids, prompt_mask, prefix_cache = shared_prefix_prompts(model, prompt_ids, prompt_mask)
    # Generation projects only the last position (logits_to_keep=1); a model without it projects them all.
    captured = head_inputs(model, capture, lambda hidden: hidden[:, -1].detach().contiguous(), owner)
    with captured as hidden_steps:
        output = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            **({"past_key_values": prefix_cache} if prefix_cache is not None else {}),
            **({"cache_implementation": "static"} if static else {}),
            do_sample=True,
            max_new_tokens=budget,
            logits_processor=LogitsProcessorList(
                ([restriction(prompt_ids.shape[1])] if restriction is not None else [])
                + list(sampling_processors(generation, prompt_mask, eos, budget))
            ),
            # The neutral values, explicitly: left unset, generate would take them from the model's generation_config.
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            repetition_penalty=1.0,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=eos,
            # Only when asked: the plain call returns the sequences alone, as it always did.
            **({"output_logits": True} if capture else {}),
            **({"return_dict_in_generate": True} if capture or keep_cache else {}),
        )
    sequences = output.sequences if capture or keep_cache else output
    kept = output.past_key_values if keep_cache else None
    response = sequences[:, prompt_ids.shape[1] :]  # (B, L), L <= budget
    logits = hidden = None
    if capture:
        logits, hidden = _stack_captured(output.logits, hidden_steps, response.shape[1], owner)
        del output, hidden_steps[:]
    mask = _response_mask(response, generation, eos)
    batch = (prompt_ids, prompt_mask, response, mask, logits, hidden, kept)
    return GeneratedBatch(_texts(tokenizer, response, mask), *batch)


def _texts(tokenizer: PreTrainedTokenizerBase, response: torch.Tensor, mask: torch.Tensor) -> tuple[str, ...]:
    """Each response's text: its tokens up to ``mask``'s end, decoded without special tokens."""
    # Two device→host copies for the batch, not one per response.
    lengths = mask.sum(1).tolist()
    rows = [row[:n] for row, n in zip(response.tolist(), lengths, strict=True)]
    return tuple(tokenizer.batch_decode(rows, skip_special_tokens=True))
