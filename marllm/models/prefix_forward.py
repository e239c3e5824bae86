"""Next-token logits after prompts that share a long beginning, with that beginning computed once.

A game's prompts repeat its rules and differ only at the end (Kuhn poker: 162 tokens of which about 140 are the
chat-templated rules, the same for every information state). :func:`last_position_forward` runs the longest common
prefix of the batch's prompts once, repeats its key/value cache over the rows, and runs only each row's own suffix
on top of it: the same positions, the same attended tokens, the same result up to float rounding, at a fraction of
the tokens (and of the backward's, since the prefix's activations are shared). Where the prompts share fewer than
:data:`MIN_SHARED_TOKENS` tokens it is one forward of the whole batch.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from marllm.models.policy import ValueHead, head_inputs, logits_to_keep_kind, position_ids_for, response_forward

__all__ = ["MIN_SHARED_TOKENS", "common_prefix_length", "last_position_forward"]

MIN_SHARED_TOKENS = 16
"""Below this many shared tokens the prefix is not worth a forward of its own."""


def common_prefix_length(rows: list[torch.Tensor]) -> int:
    """The number of leading tokens every row of ``rows`` (1-D token tensors) has in common."""
    shortest = min(len(row) for row in rows)
    stacked = torch.stack([row[:shortest] for row in rows])  # (B, shortest)
    differs = (stacked != stacked[:1]).any(0).nonzero()
    return int(differs[0]) if len(differs) else shortest


def last_position_forward(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    value_head: ValueHead | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The logits (B, V) after the last token of each left-padded prompt of ``input_ids`` (B, T), and the value
    head's reading there (B,) or None; differentiable. Positions start at 0 on each row's first real token
    (:func:`~marllm.models.policy.position_ids_for`), as in :func:`~marllm.models.policy.response_forward`."""
    rows = [ids[mask.bool()] for ids, mask in zip(input_ids, attention_mask, strict=True)]
    # Every row keeps at least its last token out of the prefix: that is where its logits are read.
    shared = min(common_prefix_length(rows), min(len(row) for row in rows) - 1) if len(rows) > 1 else 0
    if shared < MIN_SHARED_TOKENS:
        return _whole_forward(model, input_ids, attention_mask, value_head)
    device = input_ids.device
    last_only = {"logits_to_keep": 1} if logits_to_keep_kind(model) is not None else {}
    prefix = rows[0][:shared].unsqueeze(0)
    cache = model(
        input_ids=prefix,
        attention_mask=torch.ones_like(prefix),
        position_ids=torch.arange(shared, device=device).unsqueeze(0),
        use_cache=True,
        **last_only,
    ).past_key_values
    cache.batch_repeat_interleave(len(rows))
    suffixes = [row[shared:] for row in rows]
    width = max(len(suffix) for suffix in suffixes)
    suffix_ids = torch.zeros(len(rows), width, dtype=input_ids.dtype, device=device)
    suffix_mask = torch.zeros(len(rows), width, dtype=attention_mask.dtype, device=device)
    for i, suffix in enumerate(suffixes):  # left-padded, so that every row's last token is the last position
        suffix_ids[i, width - len(suffix) :] = suffix
        suffix_mask[i, width - len(suffix) :] = 1
    mask = torch.cat([torch.ones(len(rows), shared, dtype=suffix_mask.dtype, device=device), suffix_mask], 1)
    with head_inputs(model, value_head is not None) as hidden:
        outputs = model(
            input_ids=suffix_ids,
            attention_mask=mask,
            position_ids=position_ids_for(mask)[:, shared:],
            past_key_values=cache,
            use_cache=True,
            **last_only,
        )
    logits = outputs.logits[:, -1]
    values = value_head(hidden[-1][:, -1:]).squeeze(1) if value_head is not None else None
    return logits, values


def _whole_forward(
    model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, value_head: ValueHead | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    # response_forward reads the positions before a response: a placeholder token after each prompt, never attended.
    placeholder = input_ids[:, -1:]
    ids = torch.cat([input_ids, placeholder], 1)
    mask = torch.cat([attention_mask, torch.ones_like(placeholder)], 1)
    logits, values = response_forward(model, ids, mask, input_ids.shape[1], value_head)
    return logits[:, 0], None if values is None else values[:, 0]
