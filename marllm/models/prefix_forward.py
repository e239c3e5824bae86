"""Forwards of prompts that share a long beginning, with that beginning computed once.

A game's prompts repeat its rules and differ only at the end (Kuhn poker: 162 tokens of which about 140 are the
chat-templated rules, the same for every information state). :func:`shared_prefix_response_forward` runs the longest
common prefix of the batch's prompts once, repeats its key/value cache over the rows, and runs only each row's own
rest of the prompt and its response on top of it: the same positions, the same attended tokens, the same result up
to float rounding, at a fraction of the tokens (and of the backward's, since the prefix's activations are shared).
Where the prompts share fewer than :data:`MIN_SHARED_TOKENS` tokens it is :func:`~marllm.models.policy.response_forward`
itself. It is the forward of the token-level learners' rollout (policy, value and reference) and update, and of scored
moves of several tokens. :func:`last_position_forward` reads the next-token distribution after each prompt the same
way, and :func:`prompt_then_moves_forward` scores several continuations of each prompt (a game's legal moves) on top
of the prompt's own cache: every prompt computed once, however many moves it has.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel

from marllm.models.policy import ValueHead, head_inputs, logits_to_keep_kind, position_ids_for, response_forward
from marllm.models.token_prompts import left_padded
from marllm.parallel.sharding import is_sharded

__all__ = [
    "MIN_SHARED_TOKENS",
    "can_share",
    "common_prefix_length",
    "last_position_forward",
    "prompt_then_moves_forward",
    "shared_prefix_prompts",
    "shared_prefix_response_forward",
]

MIN_SHARED_TOKENS = 16
"""Below this many shared tokens the prefix is not worth a forward of its own."""


def can_share(model: PreTrainedModel) -> bool:
    """Whether ``model``'s forwards may be split over a shared cache: every layer full attention (a recurrent or
    sliding-window layer's cache is not one to repeat across rows), and not sharded (a sharded model's ranks must run
    the same forwards, whatever their rows share)."""
    layer_types = getattr(model.config, "layer_types", None)
    return not is_sharded(model) and (layer_types is None or set(layer_types) <= {"full_attention"})


def common_prefix_length(rows: list[torch.Tensor]) -> int:
    """The number of leading tokens every row of ``rows`` (1-D token tensors) has in common."""
    shortest = min(len(row) for row in rows)
    stacked = torch.stack([row[:shortest] for row in rows])  # (B, shortest)
    differs = (stacked != stacked[:1]).any(0).nonzero()
    return int(differs[0]) if len(differs) else shortest


def shared_prefix_response_forward(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    value_head: ValueHead | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`~marllm.models.policy.response_forward` (``input_ids`` ``[left-padded prompt (P) | response (L)]``;
    logits (B, L, V) and values (B, L) at the positions that predict the response tokens), with the prompts' longest
    common prefix computed once. Differentiable."""
    prompts, shared = _prompts_and_shared_length(input_ids[:, :prompt_length], attention_mask[:, :prompt_length])
    if shared < MIN_SHARED_TOKENS or not can_share(model):
        return response_forward(model, input_ids, attention_mask, prompt_length, value_head)
    rows, device = len(prompts), input_ids.device
    keep = logits_to_keep_kind(model)
    cache = _repeated_prefix_cache(model, prompts, shared)
    # The rest of each prompt left-padded, so that every row's response starts at the same position.
    suffix_ids, suffix_mask = left_padded([p[shared:] for p in prompts], 0, mask_dtype=attention_mask.dtype)
    rest, response_length = suffix_ids.shape[1], input_ids.shape[1] - prompt_length
    suffix_ids = torch.cat([suffix_ids, input_ids[:, prompt_length:]], 1)
    suffix_mask = torch.cat([suffix_mask, attention_mask[:, prompt_length:]], 1)
    mask = torch.cat([torch.ones(rows, shared, dtype=suffix_mask.dtype, device=device), suffix_mask], 1)
    extra: dict[str, int | torch.Tensor] = {}
    if keep == "positions":
        extra["logits_to_keep"] = torch.arange(rest - 1, rest + response_length - 1, device=device)
    elif keep == "count":
        extra["logits_to_keep"] = response_length + 1
    outputs, captured = _forward_after_prefix(model, suffix_ids, mask, cache, value_head is not None, **extra)
    window = slice(-(response_length + 1), -1)  # the positions before each response token
    logits = outputs.logits if keep == "positions" else outputs.logits[:, window]
    values = None
    if value_head is not None:
        [hidden] = captured
        values = value_head(hidden if keep == "positions" else hidden[:, window])
    return logits, values


def last_position_forward(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    value_head: ValueHead | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The logits (B, V) after the last token of each left-padded prompt of ``input_ids`` (B, T), and the value
    head's reading there (B,) or None; differentiable. Positions start at 0 on each row's first real token
    (:func:`~marllm.models.policy.position_ids_for`), as in :func:`~marllm.models.policy.response_forward`."""
    # A one-token response whose logits are never read: a placeholder, never attended by the positions that are.
    placeholder = input_ids[:, -1:]
    ids = torch.cat([input_ids, placeholder], 1)
    mask = torch.cat([attention_mask, torch.ones_like(placeholder)], 1)
    logits, values = shared_prefix_response_forward(model, ids, mask, input_ids.shape[1], value_head)
    return logits[:, 0], None if values is None else values[:, 0]


def prompt_then_moves_forward(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    rows: torch.Tensor,
    moves: torch.Tensor,
    move_mask: torch.Tensor,
    value_head: ValueHead | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The logits (N, C, V) that predict each move's tokens, and the value head's reading after its prompt (N,) or
    None; differentiable. ``prompt_ids``/``prompt_mask`` (B, P): left-padded prompts, each computed once (their
    common beginning once for all, as in :func:`shared_prefix_response_forward`); ``rows`` (N,): each move's prompt;
    ``moves``/``move_mask`` (N, C): its tokens, right-padded. The same as
    :func:`~marllm.models.policy.response_forward` over ``[prompt of the move | move]`` up to float rounding, which is
    what a model that cannot share a cache (:func:`can_share`) runs."""
    if not can_share(model):
        ids, mask = torch.cat([prompt_ids[rows], moves], 1), torch.cat([prompt_mask[rows], move_mask], 1)
        logits, values = response_forward(model, ids, mask, prompt_ids.shape[1], value_head)
        return logits, None if values is None else values[:, 0]
    cache, cache_mask, last_logits, last_values = _prompt_cache(model, prompt_ids, prompt_mask, value_head)
    cache.batch_select_indices(rows)
    mask = torch.cat([cache_mask[rows], move_mask], 1)
    outputs = model(
        input_ids=moves,
        attention_mask=mask,
        position_ids=position_ids_for(mask)[:, -moves.shape[1] :],
        past_key_values=cache,
        use_cache=True,
    )
    # A move's first token is predicted after its prompt; each later one after the move's tokens before it.
    logits = torch.cat([last_logits[rows].unsqueeze(1), outputs.logits[:, :-1]], 1)
    return logits, None if last_values is None else last_values[rows]


def shared_prefix_prompts(
    model: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Left-padded prompts (B, P) laid out for a generation that starts from their common beginning's cache: the
    ``(ids, mask, cache)`` of ``[common prefix | each row's rest, left-padded]`` (the same width P; the mask's zeros in
    the middle, over copies of the prefix's first token, so that the ids hold the same set of tokens as each whole
    prompt and a repetition penalty over them is the one over the whole prompt), and the prefix's key/value cache
    repeated over the rows, to pass to ``generate`` as ``past_key_values``. Positions count a row's real tokens, as
    before. Where the prompts share fewer than :data:`MIN_SHARED_TOKENS` tokens or the model cannot share a cache
    (:func:`can_share`): the prompts as given and None."""
    prompts, shared = _prompts_and_shared_length(prompt_ids, prompt_mask)
    if shared < MIN_SHARED_TOKENS or not can_share(model):
        return prompt_ids, prompt_mask, None
    cache = _repeated_prefix_cache(model, prompts, shared)
    # The gap between the prefix and a shorter row's rest holds a token of the prefix: masked from attention, it must
    # also add no token to the set the repetition penalty counts (generate's processors see these ids, and a filler
    # such as 0 would penalise a token, EOS on many tokenizers, that the whole prompt never held).
    prefix = prompts[0][:shared]
    suffix_ids, suffix_mask = left_padded([p[shared:] for p in prompts], prefix[0], mask_dtype=prompt_mask.dtype)
    ids = torch.cat([prefix.expand(len(prompts), shared), suffix_ids], 1)
    mask = torch.cat([prompt_mask.new_ones(len(prompts), shared), suffix_mask], 1)
    return ids, mask, cache


def _prompt_cache(
    model: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, value_head: ValueHead | None
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The key/value cache of the prompts (B rows), the attention mask over its positions, and the logits (B, V) and
    value (B,) after each prompt's last token."""
    prompts, shared = _prompts_and_shared_length(prompt_ids, prompt_mask)
    last = {"logits_to_keep": 1} if logits_to_keep_kind(model) is not None else {}
    cache = None
    if shared >= MIN_SHARED_TOKENS:
        cache = _repeated_prefix_cache(model, prompts, shared)
        prompt_ids, prompt_mask = left_padded([p[shared:] for p in prompts], 0, mask_dtype=prompt_mask.dtype)
    else:
        shared = 0
    mask = torch.cat([prompt_mask.new_ones(len(prompt_mask), shared), prompt_mask], 1)
    outputs, captured = _forward_after_prefix(model, prompt_ids, mask, cache, value_head is not None, **last)
    values = value_head(captured[-1][:, -1:]).squeeze(1) if value_head is not None else None
    return outputs.past_key_values, mask, outputs.logits[:, -1], values


def _forward_after_prefix(
    model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, cache: Any, with_hidden: bool, **extra: Any
) -> tuple[Any, list[torch.Tensor]]:
    """The forward of ``ids`` (B, T) on top of ``cache`` (None: nothing before them), ``mask`` covering the cached
    positions and ``ids``; positions count each row's real tokens. Returns the outputs (the cache extended) and, with
    ``with_hidden``, the LM head's inputs (:func:`~marllm.models.policy.head_inputs`)."""
    with head_inputs(model, with_hidden) as captured:
        outputs = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=position_ids_for(mask)[:, mask.shape[1] - ids.shape[1] :],
            past_key_values=cache,
            use_cache=True,
            **extra,
        )
    return outputs, captured


def _prompts_and_shared_length(ids: torch.Tensor, mask: torch.Tensor) -> tuple[list[torch.Tensor], int]:
    """Each row's real tokens and the length they share (:func:`_shared_length`); ``([], 0)`` at once where a look at
    every row's first :data:`MIN_SHARED_TOKENS` real tokens, in one batched comparison, shows they share fewer (so
    that prompts with nothing in common, a text task's, cost no per-row work)."""
    lengths = mask.sum(1)
    if len(ids) < 2 or bool((lengths <= MIN_SHARED_TOKENS).any()):  # each row keeps its last token out
        return [], 0
    rank = mask.long().cumsum(1) * mask.long()  # 1, 2, ... on a row's real tokens, 0 on its padding
    first = ids[(rank >= 1) & (rank <= MIN_SHARED_TOKENS)].view(len(ids), MIN_SHARED_TOKENS)
    if not bool((first == first[:1]).all()):
        return [], 0
    prompts = _real_tokens(ids, mask)
    return prompts, _shared_length(prompts)


def _real_tokens(ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Each row's tokens that ``mask`` keeps (a left-padded prompt without its padding)."""
    return [row[keep.bool()] for row, keep in zip(ids, mask, strict=True)]


def _shared_length(prompts: list[torch.Tensor]) -> int:
    """The tokens every prompt starts with, each prompt keeping at least its last token out of them: the next token's
    logits are read there."""
    return min(common_prefix_length(prompts), min(len(p) for p in prompts) - 1) if len(prompts) > 1 else 0


def _repeated_prefix_cache(model: PreTrainedModel, prompts: list[torch.Tensor], shared: int) -> Any:
    """The key/value cache of the prompts' first ``shared`` tokens, computed once and repeated over the prompts."""
    last = {"logits_to_keep": 1} if logits_to_keep_kind(model) is not None else {}
    cache = model(
        input_ids=prompts[0][:shared].unsqueeze(0),
        position_ids=torch.arange(shared, device=prompts[0].device).unsqueeze(0),
        use_cache=True,
        **last,
    ).past_key_values
    cache.batch_repeat_interleave(len(prompts))
    return cache
