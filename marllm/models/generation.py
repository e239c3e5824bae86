"""Batched sampling of responses with left padding and the KV cache."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from marllm.algorithms.ppo_config import GenerationConfig


class PromptTooLongError(ValueError):
    """A prompt plus the response budget does not fit in the model's context."""


@dataclass
class GeneratedBatch:
    """Responses to a batch of prompts, as text and as the token ids that produced them.

    ``prompt_ids``/``prompt_mask`` are (B, P), left-padded; ``response``/``mask`` are (B, L), with ``mask`` 1 up to
    and including the first EOS.
    """

    texts: tuple[str, ...]
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response: torch.Tensor
    mask: torch.Tensor


def check_prompt_lengths(
    prompts: Sequence[str], prompt_mask: torch.Tensor, budget: int, context: int | None, owner: str
) -> None:
    """Every prompt must have a token, and prompt + ``budget`` new tokens must fit in ``context``."""
    lengths = prompt_mask.sum(1)
    empty = torch.nonzero(lengths == 0).flatten().tolist()
    if empty:
        raise ValueError(f"{owner}: prompt(s) {empty[:10]} tokenize to nothing; every prompt needs at least one token")
    if context is not None:
        too_long = torch.nonzero(lengths + budget > context).flatten().tolist()
        if too_long:
            i = too_long[0]
            raise PromptTooLongError(
                f"{owner}: prompt {i} has {int(lengths[i])} tokens; with up to {budget} new tokens it exceeds the "
                f"model context of {context} ({len(too_long)} prompt(s) too long; prompt {i} starts "
                f"{prompts[i][:80]!r}). Shorten the prompt template or the query, or lower max_new_tokens."
            )


@torch.no_grad()
def generate_responses(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    budget: int,
    generation: GenerationConfig,
    context: int | None = None,
    owner: str = "generation",
) -> GeneratedBatch:
    """Sample one response of at most ``budget`` tokens per prompt, all prompts in one ``generate`` call."""
    device = next(model.parameters()).device
    encoded = tokenizer(list(prompts), return_tensors="pt", padding=True)
    prompt_ids = encoded["input_ids"].to(device)  # (B, P), left-padded
    prompt_mask = encoded["attention_mask"].to(device)
    check_prompt_lengths(prompts, prompt_mask, budget, context, owner)
    eos = tokenizer.eos_token_id
    output = model.generate(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        do_sample=True,
        max_new_tokens=budget,
        # Without stop_at_eos every response runs to the budget: EOS is suppressed until then.
        min_new_tokens=None if generation.stop_at_eos else budget,
        top_k=generation.top_k,
        top_p=generation.top_p,
        temperature=generation.temperature,
        repetition_penalty=generation.repetition_penalty,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=eos,
    )
    response = output[:, prompt_ids.shape[1] :]  # (B, L), L <= budget
    if generation.stop_at_eos and eos is not None:
        is_eos = (response == eos).long()
        # Keep tokens up to and including the first EOS; what generate appends after it is padding.
        mask = ((is_eos.cumsum(1) - is_eos) == 0).long()
    else:
        mask = torch.ones_like(response)
    lengths = mask.sum(1).tolist()
    texts = tokenizer.batch_decode(
        [row[:n].tolist() for row, n in zip(response, lengths, strict=True)], skip_special_tokens=True
    )
    return GeneratedBatch(tuple(texts), prompt_ids, prompt_mask, response, mask)
