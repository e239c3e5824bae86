"""Generation that goes on from where each row's sequence stood: a seat's key/value cache kept between its turns, so
that a turn reads only what is new (the other seats' moves since, and the last answer token no forward read).

After a generation, :func:`row_caches` keeps each row's cache of its real tokens only (not the padding before or
between them, nor what ``generate`` appended after a row's EOS). Before the next, :func:`continued_layout` lays the
rows out as ``[padding | cached tokens | padding | new tokens]``: the caches left-padded to one length and stacked
into one cache, the new tokens right-aligned after them, the attention mask 0 over both paddings. Positions count a
row's real tokens (:func:`~marllm.models.policy.position_ids_for`), so every cached key was computed at the position
it has in the sequence, and the result is that of one forward over the whole sequence up to float rounding. The
paddings hold the row's first token, masked, so that a repetition penalty over the ids counts only the sequence's
own tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from marllm.models.prefix_forward import can_share


@dataclass
class RowCache:
    """One row's key/value cache of the first ``length`` tokens of its sequence: per layer (keys, values), each
    (heads, length, head dim)."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    length: int


def can_continue(model: PreTrainedModel, generation: Any) -> bool:
    """Whether ``model``'s generation may go on from kept caches: a cache every layer of which holds every token
    (:func:`~marllm.models.prefix_forward.can_share`), built by ``generate`` as it goes (not ``cache: static``)."""
    return can_share(model) and getattr(generation, "cache", "dynamic") != "static"


def row_caches(cache: Any, mask: torch.Tensor) -> list[RowCache]:
    """Each row's cache of its real tokens: the positions of ``cache`` (B rows, T positions) where ``mask`` (B, ≥ T)
    is 1, in order."""
    length = cache.get_seq_length()
    kept = []
    for row in range(mask.shape[0]):
        real = mask[row, :length].nonzero().squeeze(1)
        layers = [(layer.keys[row, :, real].clone(), layer.values[row, :, real].clone()) for layer in cache.layers]
        kept.append(RowCache(layers, int(real.numel())))
    return kept


def continued_layout(
    model: PreTrainedModel, sequences: Sequence[Sequence[int]], caches: Sequence[RowCache | None]
) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """``(ids, mask, cache)`` of ``sequences`` (each row's whole token sequence) for a generation that goes on from
    ``caches`` (each row's cache of a prefix of its sequence; None: none), laid out as the module docstring says.

    Raises:
        ValueError: a cache longer than its sequence (it cannot be of a prefix of it).
    """
    device = next(model.parameters()).device
    cached = [0 if c is None else c.length for c in caches]
    if any(n > len(ids) - 1 for n, ids in zip(cached, sequences, strict=True)):
        raise ValueError("a row's cache covers its whole sequence: a generation needs at least one new token to read")
    width_cached, width_new = max(cached), max(len(ids) - n for ids, n in zip(sequences, cached, strict=True))
    rows = len(sequences)
    ids = torch.empty((rows, width_cached + width_new), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, (tokens, n) in enumerate(zip(sequences, cached, strict=True)):
        ids[row] = tokens[0]
        ids[row, width_cached - n : width_cached] = torch.tensor(tokens[:n], dtype=torch.long)
        ids[row, ids.shape[1] - (len(tokens) - n) :] = torch.tensor(tokens[n:], dtype=torch.long)
        mask[row, width_cached - n : width_cached] = 1
        mask[row, ids.shape[1] - (len(tokens) - n) :] = 1
    template = next(c for c in caches if c is not None)
    layers = []
    for index, (keys, values) in enumerate(template.layers):
        shape = (rows, keys.shape[0], width_cached, keys.shape[2])
        stacked_keys, stacked_values = keys.new_zeros(shape), values.new_zeros(shape)
        for row, cache in enumerate(caches):
            if cache is not None and cache.length:
                stacked_keys[row, :, width_cached - cache.length :] = cache.layers[index][0]
                stacked_values[row, :, width_cached - cache.length :] = cache.layers[index][1]
        layers.append((stacked_keys.to(device), stacked_values.to(device)))
    return ids.to(device), mask.to(device), DynamicCache(ddp_cache_data=layers, config=model.config)
