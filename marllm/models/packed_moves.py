"""A game's legal moves laid out for one forward: every legal move of every prompt as one row of a packed batch
(:class:`PackedMoves`, :func:`pack_moves`), or as per-row tensors (:func:`move_tensors`, which
:func:`packed_from_tensors` packs); the move tokens ``score`` accepts (:func:`scored_move_tokens`); and the packed
results read back per prompt. :mod:`marllm.models.legal_moves` computes the policies over them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from marllm.models.generation import check_prompt_lengths, encode_prompts
from marllm.models.move_tries import MoveTrie, move_continuations, move_tries

MOVE_BUDGET = (
    "shorten the legal moves' names (a constrained or scored answer is its move's tokens, and EOS under constrained; "
    "generation.max_new_tokens does not bound it)"
)
"""What shortens a move answer, in the error of a prompt too long for the model's context."""


@dataclass
class PackedMoves:
    """Every legal move of every row as one row ``[left-padded prompt (P) | move tokens (C), right-padded]``.

    ``input_ids``/``attention_mask`` are (N, P+C), ``response``/``mask`` (N, C) (with ``with_eos``, each move's
    tokens are followed by EOS); ``rows`` (N,) is each packed row's prompt, ``counts`` the moves per prompt,
    ``words`` (N,) each move's words, ``tries`` each prompt's prefix tree.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_length: int
    response: torch.Tensor
    mask: torch.Tensor
    rows: torch.Tensor
    counts: list[int]
    words: torch.Tensor
    tries: list[MoveTrie]

    def per_row(self, values: torch.Tensor, fill: float = -torch.inf) -> torch.Tensor:
        """(N,) per packed row -> (B, M) per prompt and move, ``fill`` beyond a prompt's moves."""
        out = values.new_full((len(self.counts), max(self.counts)), fill)
        columns = torch.cat([torch.arange(n, device=values.device) for n in self.counts])
        return out.index_put((self.rows, columns), values)

    def prompts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each prompt's left-padded ids and attention mask (B, P), read off its first packed move's row."""
        indices = torch.arange(len(self.counts), device=self.rows.device)
        first = torch.searchsorted(self.rows, indices).clamp_max(len(self.rows) - 1)
        return self.input_ids[first, : self.prompt_length], self.attention_mask[first, : self.prompt_length]

    def tries_per_packed_row(self) -> list[MoveTrie]:
        """The prefix tree of each packed row's prompt."""
        return [self.tries[b] for b in self.rows.tolist()]


def scored_move_tokens(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    legal_moves: Sequence[Sequence[str]],
    chat_template: bool,
) -> list[list[list[int]]]:
    """:func:`~marllm.models.move_tries.move_continuations` for ``score``, which refuses a move whose tokens begin
    another's: a move is scored by the likelihood of its tokens with nothing to end them, so the shorter one ("1")
    would collect the longer one's ("10") probability as well, and under normalization ``none`` always score at least
    as high (constrained answers end each move with EOS and have no such limit).

    Raises:
        ValueError: naming the row and the two moves.
    """
    continuations = move_continuations(tokenizer, prompts, legal_moves, chat_template)
    for row, (ids, names) in enumerate(zip(continuations, legal_moves, strict=True)):
        ordered = sorted(range(len(ids)), key=lambda m: ids[m])
        # In sorted order a move that begins another comes right before one that it begins.
        for shorter, longer in zip(ordered, ordered[1:], strict=False):
            if ids[longer][: len(ids[shorter])] == ids[shorter]:
                raise ValueError(
                    f"row {row}: under game.actions: score the move {names[shorter]!r} is the beginning of "
                    f"{names[longer]!r} (tokens {ids[shorter]} of {ids[longer]}): a scored move has no end, so it "
                    f"would collect the longer move's probability too; rename the moves so that none begins "
                    f"another, or use game.actions: constrained (each move ends with EOS)"
                )
    return continuations


def pack_moves(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    legal_moves: Sequence[Sequence[str]],
    chat_template: bool,
    with_eos: bool,
    device: torch.device | str = "cpu",
    context: int | None = None,
    owner: str = "legal moves",
) -> PackedMoves:
    """Pack every legal move of every prompt (:class:`PackedMoves`), tokens as
    :func:`~marllm.models.move_tries.move_continuations` encodes them, through the rollout's own layout
    (:func:`move_tensors`, :func:`packed_from_tensors`); each prompt checked to fit ``context`` with its longest."""
    encode = move_continuations if with_eos else scored_move_tokens
    continuations = encode(tokenizer, prompts, legal_moves, chat_template)
    tails = [[tokens + [tokenizer.eos_token_id] for tokens in row] for row in continuations] if with_eos else None
    columns = move_tensors(tokenizer, prompts, legal_moves, chat_template, device, context, owner, tails)
    packed = packed_from_tensors(*columns.values(), tokenizer.pad_token_id)
    packed.tries = move_tries(continuations)
    return packed


def per_prompt(packed: PackedMoves, logprobs: torch.Tensor) -> list[list[float]]:
    """(N,) log-probs -> each prompt's legal moves' probabilities, in the order of its legal moves."""
    probabilities = logprobs.detach().double().exp().cpu()
    out: list[list[float]] = [[] for _ in packed.counts]
    for row, p in zip(packed.rows.tolist(), probabilities.tolist(), strict=True):
        out[row].append(p)
    return out


def move_tensors(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    legal_moves: Sequence[Sequence[str]],
    chat_template: bool,
    device: torch.device | str = "cpu",
    context: int | None = None,
    owner: str = "legal moves",
    move_tokens: Sequence[Sequence[Sequence[int]]] | None = None,
) -> dict[str, torch.Tensor]:
    """A batch's prompts and legal moves as per-row tensors: ``input_ids``/``attention_mask`` (B, P) left-padded,
    ``moves`` (B, M, C) each legal move's tokens (−1-padded, along M past a row's moves too) and ``move_words``
    (B, M, 1) each move's words (−1 past a row's moves). :func:`packed_from_tensors` packs any rows of it.

    A move's tokens are ``move_tokens``, by default :func:`scored_move_tokens`'; each prompt followed by its longest
    move must fit in ``context`` (:func:`~marllm.models.generation.check_prompt_lengths`, the error naming
    ``owner``)."""
    if move_tokens is None:
        move_tokens = scored_move_tokens(tokenizer, prompts, legal_moves, chat_template)
    encoded = encode_prompts(tokenizer, prompts, chat_template)
    count = max(len(row) for row in move_tokens)
    width = max(len(tokens) for row in move_tokens for tokens in row)
    moves = torch.full((len(prompts), count, width), -1, dtype=torch.long)
    words = torch.full((len(prompts), count, 1), -1.0)
    for b, row in enumerate(move_tokens):
        for m, tokens in enumerate(row):
            moves[b, m, : len(tokens)] = torch.tensor(tokens)
            words[b, m, 0] = max(1, len(legal_moves[b][m].split()))
    longest = (moves >= 0).sum(-1).amax(-1)  # (B,): each prompt's longest move
    check_prompt_lengths(prompts, encoded["attention_mask"], longest, context, owner, MOVE_BUDGET)
    return {
        "input_ids": encoded["input_ids"].to(device),
        "attention_mask": encoded["attention_mask"].to(device),
        "moves": moves.to(device),
        "move_words": words.to(device),
    }


def packed_from_tensors(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    moves: torch.Tensor,
    move_words: torch.Tensor,
    pad_token_id: int,
) -> PackedMoves:
    """The :class:`PackedMoves` (without EOS, for ``score``) of rows of :func:`move_tensors`."""
    legal = (moves >= 0).any(-1)  # (B, M)
    rows, columns = torch.nonzero(legal, as_tuple=True)  # row-major: each row's moves in order
    response = moves[rows, columns]  # (N, C)
    mask = (response >= 0).long()
    used = int(mask.sum(0).nonzero().max()) + 1  # the longest move of these rows
    response, mask = response[:, :used].clamp_min(0).masked_fill(mask[:, :used] == 0, pad_token_id), mask[:, :used]
    return PackedMoves(
        input_ids=torch.cat([input_ids[rows], response], 1),
        attention_mask=torch.cat([attention_mask[rows], mask], 1),
        prompt_length=input_ids.shape[1],
        response=response,
        mask=mask,
        rows=rows,
        counts=legal.sum(1).tolist(),
        words=move_words[rows, columns, 0].float(),
        tries=[],
    )
