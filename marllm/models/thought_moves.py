"""Reason, then act: free text first, then a legal move restricted token by token (``game.actions: think``).

A row's answer is one response credited as one sample: the thought (up to the batch's budget of free-text tokens,
sampled as ``generate`` samples; it may end early with EOS), then :data:`THOUGHT_END`'s tokens, forced, then a legal
move's tokens and EOS, sampled as ``constrained`` samples them (:mod:`marllm.models.move_tries`). The restriction
of every response position is kept as ``constrained`` keeps it (B, L, K): none on the thought, the one token that
comes next on :data:`THOUGHT_END` (probability 1 under the restriction: no ratio, KL or entropy of its own), the
legal moves' prefix tree on the move. A token-level learner's forward over ``[prompt | response]`` with that
restriction re-applied gives the log-probs of the distribution each token was drawn from.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from marllm.models.generation import (
    GeneratedBatch,
    check_prompt_lengths,
    encode_prompts,
    generate_responses,
    sample_after,
)
from marllm.models.generation_config import GenerationConfig
from marllm.models.legal_moves import MoveSample, check_constrained, move_budget
from marllm.models.move_tries import LegalMovesProcessor, allowed_tokens, move_continuations, move_tries
from marllm.models.token_prompts import left_padded

__all__ = ["THOUGHT_END", "generate_thought_and_move"]

THOUGHT_END = "\nMove:"
"""The text between a thought and its move: forced after every thought, so the move is read where it is asked for."""


@torch.no_grad()
def generate_thought_and_move(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    legal_moves: Sequence[Sequence[str]],
    generation: GenerationConfig,
    budget: int,
    context: int | None = None,
    owner: str = "generation",
) -> MoveSample:
    """Sample per prompt a thought of at most ``budget`` tokens, then a legal move after :data:`THOUGHT_END`.

    The returned batch's ``response`` is ``[thought | THOUGHT_END | move | EOS]`` per row (right-padded, ``mask`` 1
    over all of it), its prompts those the thought was sampled after, its ``texts`` the moves' names; ``allowed`` is
    every response position's restriction and ``moves`` the move of each row.
    """
    check_constrained(tokenizer, generation, owner)
    eos = tokenizer.eos_token_id
    end = tokenizer(THOUGHT_END, add_special_tokens=False)["input_ids"]
    tries = move_tries(move_continuations(tokenizer, [THOUGHT_END] * len(prompts), legal_moves))
    budget_of_move = move_budget(tries)
    encoded = encode_prompts(tokenizer, prompts, generation.chat_template, owner)
    check_prompt_lengths(prompts, encoded["attention_mask"], budget + len(end) + budget_of_move, context, owner)
    thought = generate_responses(model, tokenizer, prompts, budget, generation, context, owner)
    # Each row's prompt as the thought was sampled after it (padding where it was), its thought and THOUGHT_END,
    # left-padded: the same tokens before every move position as the learner's forward over [prompt | response].
    end_ids = thought.response.new_tensor(end)
    heads = [
        torch.cat([ids, response[: int(n)], end_ids])
        for ids, response, n in zip(thought.prompt_ids, thought.response, thought.mask.sum(1), strict=True)
    ]
    masks = [
        torch.cat([mask, mask.new_ones(len(head) - len(mask))])
        for mask, head in zip(thought.prompt_mask, heads, strict=True)
    ]
    head_ids, head_mask = left_padded(heads, tokenizer.pad_token_id, masks)
    move = sample_after(
        model,
        tokenizer,
        head_ids,
        head_mask,
        budget_of_move,
        generation,
        owner,
        restriction=lambda width: LegalMovesProcessor(tries, width, eos),
        share_prefix=False,
    )
    move_allowed, moves = allowed_tokens(move.response, tries, eos)
    tails = [len(head) - thought.prompt_ids.shape[1] for head in heads]  # thought + THOUGHT_END, per row
    response, mask, allowed = _joined(thought, move.response, move.mask, move_allowed, tails, end, tokenizer)
    texts = tuple(names[m] for names, m in zip(legal_moves, moves, strict=True))
    batch = GeneratedBatch(texts, thought.prompt_ids, thought.prompt_mask, response, mask)
    return MoveSample(batch, allowed, moves)


def _joined(
    thought: GeneratedBatch,
    move: torch.Tensor,
    move_mask: torch.Tensor,
    move_allowed: torch.Tensor,
    tails: list[int],
    end: list[int],
    tokenizer: PreTrainedTokenizerBase,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's ``[thought | THOUGHT_END | move]`` (B, L) right-padded, its mask, and its restriction (B, L, K):
    −1 (none) on the thought, THOUGHT_END's next token alone on it, the move's own after."""
    rows = len(tails)
    moves = move_mask.sum(1).tolist()
    length = max(tail + n for tail, n in zip(tails, moves, strict=True))
    width = max(1, move_allowed.shape[2])
    response = move.new_full((rows, length), tokenizer.pad_token_id)
    mask = move_mask.new_zeros((rows, length))
    allowed = torch.full((rows, length, width), -1, dtype=torch.long, device=move.device)
    for b, (tail, n) in enumerate(zip(tails, moves, strict=True)):
        thought_length = tail - len(end)
        response[b, :thought_length] = thought.response[b, :thought_length]
        response[b, thought_length:tail] = move.new_tensor(end)
        allowed[b, thought_length:tail, 0] = move.new_tensor(end)
        response[b, tail : tail + n] = move[b, :n]
        allowed[b, tail : tail + n, : move_allowed.shape[2]] = move_allowed[b, :n]
        mask[b, : tail + n] = 1
    return response, mask, allowed
