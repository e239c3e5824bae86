"""Prompts as token ids: a seat's sequence of a game (its observations as they arrived, its answers as sampled) fed
to the samplers without being rendered to text and tokenized again.

:class:`TokenPrompts` is a tuple of texts (each row's ids decoded, for messages and for the tokenization of legal
moves after it) that carries the ids themselves: :func:`~marllm.models.generation.encode_prompts` left-pads the ids
instead of encoding the texts. :func:`observation_ids` tokenizes what is new for a seat, as the first user turn of a
chat template or as a later one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_ASSISTANT_MARK = "marllm-assistant-turn-7f3a"
"""Stands for an answer in a chat template's rendering, to find where what follows an answer begins."""


class TokenPrompts(tuple):
    """Prompts given as token ids; the tuple's items are their texts (the ids decoded).

    Attributes:
        ids: each prompt's token ids, in row order.
        continuation: ``(ids, mask, cache)`` laid out to go on from each row's kept cache
            (:func:`~marllm.models.cache_continuation.continued_layout`), or None: the ids read from their start.
        kept: after a generation, ``(cache, mask)``: its key/value cache and the mask over the cache's positions (the
            prompts as laid out, then the response), for :func:`~marllm.models.cache_continuation.row_caches`.
    """

    ids: tuple[tuple[int, ...], ...]
    continuation: tuple[torch.Tensor, torch.Tensor, Any] | None
    kept: tuple[Any, torch.Tensor] | None

    def __new__(cls, tokenizer: PreTrainedTokenizerBase, ids: Sequence[Sequence[int]]) -> TokenPrompts:
        rows = tuple(tuple(int(t) for t in row) for row in ids)
        prompts = super().__new__(cls, tokenizer.batch_decode([list(r) for r in rows], skip_special_tokens=False))
        prompts.ids = rows
        prompts.continuation = prompts.kept = None
        return prompts

    def padded(self, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask), (B, P) and left-padded, as a tokenizer's ``padding_side="left"`` gives them;
        with a :attr:`continuation`, its layout."""
        if self.continuation is not None:
            return self.continuation[0], self.continuation[1]
        return left_padded([torch.tensor(row, dtype=torch.long) for row in self.ids], pad_token_id)


def left_padded(
    rows: Sequence[torch.Tensor],
    fill: int | torch.Tensor,
    masks: Sequence[torch.Tensor] | None = None,
    mask_dtype: torch.dtype = torch.long,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` (1-D token tensors of one dtype and device) left-padded with ``fill`` into one (B, longest) batch, and
    its mask: ``masks`` row by row where given, else 1 over each row's tokens (of ``mask_dtype``)."""
    width = max((len(row) for row in rows), default=0)
    like = rows[0] if rows else torch.empty(0, dtype=torch.long)
    ids = like.new_full((len(rows), width), int(fill))
    if masks:
        mask_dtype = masks[0].dtype
    mask = like.new_zeros((len(rows), width), dtype=mask_dtype)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = row
        mask[i, width - len(row) :] = masks[i] if masks else 1
    return ids, mask


def observation_ids(
    tokenizer: PreTrainedTokenizerBase, text: str, first: bool, chat_template: bool, after_eos: bool = False
) -> list[int]:
    """The tokens of an observation a seat reads: its first (the whole prompt, as a prompt is encoded) or a later one
    (only what is new, after the seat's last answer).

    With ``chat_template`` the first is a user turn ending in the generation prompt, as
    :func:`~marllm.models.generation.encode_prompts` renders a prompt, and a later one closes the answer's turn, opens
    a user turn with ``text`` and ends in the generation prompt: the template's own rendering of what follows an
    answer, less the end-of-turn token the answer already ended with (``after_eos``) where the template writes it.
    Without, the first is the text as the tokenizer encodes a prompt and a later one the text alone.
    """
    if not chat_template:
        return list(tokenizer(text, add_special_tokens=first)["input_ids"])
    if first:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
    else:
        turns = [
            {"role": "user", "content": "-"},
            {"role": "assistant", "content": _ASSISTANT_MARK},
            {"role": "user", "content": text},
        ]
        whole = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        rendered = whole[whole.index(_ASSISTANT_MARK) + len(_ASSISTANT_MARK) :]
        eos = tokenizer.eos_token
        if after_eos and eos and rendered.startswith(eos):
            rendered = rendered[len(eos) :]
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
