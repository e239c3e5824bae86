"""Policies over a game's legal moves, from a causal LM: constrained sampling of a move's tokens, and the exact
probability of every legal move under it or under move scoring.

``constrained``: the answer is sampled token by token from the model's distribution restricted to continuations of
the legal moves' names (:mod:`marllm.models.move_tries`); a move's probability is the product of its tokens'
restricted probabilities, its final EOS included. ``score`` (TWOSOME, Tan et al., 2024; GLAM, Carta et al., 2023):
π(a | s) = softmax over the legal moves a of the model's log-likelihood of a's text after the prompt, normalised by
``none`` (the sum over its tokens), ``token`` (the mean per token) or ``word`` (the sum divided by its words).
Every legal move of every row is one row of a packed batch (:mod:`marllm.models.packed_moves`), scored in one forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from marllm.models.generation import (
    GeneratedBatch,
    generate_responses,
    logprob_logits,
)
from marllm.models.generation_config import GenerationConfig
from marllm.models.move_tries import (
    LegalMovesProcessor,
    MoveTrie,
    allowed_tokens,
    move_continuations,
    move_tries,
    restrict_logits,
)
from marllm.models.packed_moves import (
    MOVE_BUDGET,
    PackedMoves,
    pack_moves,
    per_prompt,
)
from marllm.models.policy import ValueHead, context_length
from marllm.models.prefix_forward import (
    last_position_forward,
    prompt_then_moves_forward,
    shared_prefix_response_forward,
)

__all__ = [
    "MOVE_BUDGET",
    "NORMALIZATIONS",
    "MoveSample",
    "check_constrained",
    "constrained_logprobs",
    "constrained_move_probabilities",
    "first_token_scores",
    "generate_moves",
    "move_budget",
    "normalized_likelihood",
    "score_logprobs",
    "scored_move_probabilities",
    "token_logprobs",
]


NORMALIZATIONS = ("none", "token", "word")
"""How ``score`` normalises a move's log-likelihood: its sum, its mean per token, or its sum per word."""


def check_constrained(tokenizer: PreTrainedTokenizerBase, generation: GenerationConfig, owner: str) -> None:
    """Constrained answers end with EOS: the tokenizer needs one, and ``generation.stop_at_eos`` must be on."""
    if tokenizer.eos_token_id is None:
        raise ValueError(f"{owner}: constrained answers end a move with EOS, and the tokenizer has no eos_token")
    if not generation.stop_at_eos:
        raise ValueError(
            f"{owner}: constrained answers end with EOS once a move is complete; generation.stop_at_eos: false "
            "would suppress it (set it to true, or use game.actions: generate)"
        )


@dataclass
class MoveSample:
    """Constrained answers: the batch as ``generate`` made it, the restriction of every response token (B, L, K;
    see :func:`~marllm.models.move_tries.allowed_tokens`) and the index of the move each row answered."""

    generated: GeneratedBatch
    allowed: torch.Tensor
    moves: list[int]


@torch.no_grad()
def generate_moves(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    legal_moves: Sequence[Sequence[str]],
    generation: GenerationConfig,
    context: int | None = None,
    owner: str = "generation",
    capture: bool = False,
) -> MoveSample:
    """Sample one legal move per prompt, restricted token by token (one ``generate`` call, KV cache and batching
    kept); the budget is the longest move's tokens plus its EOS. The texts of the returned batch are the moves' names.
    """
    check_constrained(tokenizer, generation, owner)
    eos = tokenizer.eos_token_id
    tries = move_tries(move_continuations(tokenizer, prompts, legal_moves, generation.chat_template))
    budget = move_budget(tries)
    batch = generate_responses(
        model,
        tokenizer,
        prompts,
        budget,
        generation,
        context,
        owner,
        capture,
        restriction=lambda prompt_length: LegalMovesProcessor(tries, prompt_length, eos),
        budget_remedy=MOVE_BUDGET,
    )
    allowed, moves = allowed_tokens(batch.response, tries, eos)
    batch.texts = tuple(names[m] for names, m in zip(legal_moves, moves, strict=True))
    return MoveSample(batch, allowed, moves)


def move_budget(tries: Sequence[MoveTrie]) -> int:
    """The tokens a restricted answer may take: the longest legal move of any row, plus its EOS."""
    return 1 + max(max(_depths(trie)) for trie in tries)


def _depths(trie: MoveTrie) -> list[int]:
    """The depth of every node of ``trie`` (tokens from the root)."""
    depth = [0] * len(trie.children)
    for node, children in enumerate(trie.children):
        for child in children.values():
            depth[child] = depth[node] + 1
    return depth


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] at each position, (N, C, V), (N, C) -> (N, C), in float32."""
    return torch.log_softmax(logits.float(), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def score_logprobs(
    model: PreTrainedModel,
    packed: PackedMoves,
    normalization: str,
    value_head: ValueHead | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(a | s) of every packed move under ``score`` (N,), and V(s) of its prompt (N,; the value head on the
    prompt's last hidden state) when ``value_head`` is given. Differentiable; each prompt computed once, its moves on
    top of it."""
    prompt_ids, prompt_mask = packed.prompts()
    # The prompts' common beginning computed once for all, each prompt once, its moves on top of its cache.
    logits, values = prompt_then_moves_forward(
        model, prompt_ids, prompt_mask, packed.rows, packed.response, packed.mask, value_head
    )
    likelihood = (token_logprobs(logits, packed.response) * packed.mask).sum(1)  # (N,)
    likelihood = normalized_likelihood(likelihood, packed.mask.sum(1), packed.words, normalization)
    logprobs = torch.log_softmax(packed.per_row(likelihood), dim=1)  # (B, M): over each prompt's legal moves
    columns = torch.cat([torch.arange(n, device=logprobs.device) for n in packed.counts])
    return logprobs[packed.rows, columns], values


def normalized_likelihood(
    likelihood: torch.Tensor, tokens: torch.Tensor, words: torch.Tensor, how: str
) -> torch.Tensor:
    """A move's log-likelihood (summed over its ``tokens``) normalised by ``how``: ``none``, ``token`` (per token) or
    ``word`` (per word of its name)."""
    if how == "token":
        return likelihood / tokens
    if how == "word":
        return likelihood / words
    if how != "none":
        raise ValueError(f"action normalization must be one of {list(NORMALIZATIONS)}, got {how!r}")
    return likelihood


def first_token_scores(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    moves: torch.Tensor,
    move_words: torch.Tensor,
    normalization: str,
    value_head: ValueHead | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(· | s) over each row's legal moves (B, M; −inf past them) when every move is one token (``moves`` (B, M,
    1) of :func:`move_tensors`), and V(s) (B, 1) or None: each prompt's last position's distribution scores every
    move at once, the prompts' common beginning computed once
    (:func:`~marllm.models.prefix_forward.last_position_forward`). Differentiable."""
    legal = moves[:, :, 0] >= 0  # (B, M)
    # The prompts' common beginning (a game's rules) computed once: :mod:`marllm.models.prefix_forward`.
    logits, values = last_position_forward(model, input_ids, attention_mask, value_head)
    logprobs = torch.log_softmax(logits.float(), -1)  # (B, V): the next token after each prompt
    likelihood = logprobs.gather(1, moves[:, :, 0].clamp_min(0))  # (B, M)
    scores = normalized_likelihood(likelihood, torch.ones_like(likelihood), move_words[:, :, 0].float(), normalization)
    table = torch.log_softmax(scores.masked_fill(~legal, -torch.inf), dim=1)
    return table, None if values is None else values.float().unsqueeze(1)


def constrained_logprobs(
    model: PreTrainedModel,
    packed: PackedMoves,
    generation: GenerationConfig,
    eos_token_id: int,
) -> torch.Tensor:
    """log π(a | s) of every packed move (packed ``with_eos``) under constrained sampling (N,): the sum of its
    tokens' log-probs, EOS included, as the learner computes them (restricted, then ``generation``'s processing)."""
    allowed, _ = allowed_tokens(packed.response, packed.tries_per_packed_row(), eos_token_id)
    logits, _ = shared_prefix_response_forward(model, packed.input_ids, packed.attention_mask, packed.prompt_length)
    logits = restrict_logits(logits, allowed, inplace=not logits.requires_grad)
    sequences = (packed.input_ids, packed.attention_mask, packed.prompt_length)
    logits = logprob_logits(logits, *sequences, generation, eos_token_id)
    # Past a move's EOS top-k/top-p may have removed the padding token (−inf): masked by selection, not by product.
    return torch.where(packed.mask > 0, token_logprobs(logits, packed.response), 0.0).sum(1)


def constrained_move_probabilities(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    legal_moves: Sequence[Sequence[str]],
    generation: GenerationConfig,
    device: torch.device | str = "cpu",
    owner: str = "move probabilities",
) -> list[list[float]]:
    """Each legal move's exact probability after each prompt (in the order of ``legal_moves``) under constrained
    answers: the probability with which :func:`generate_moves` plays it, the product of the move's restricted token
    probabilities, its EOS included, after every processor the sampler applies (repetition penalty, temperature,
    top-k/top-p), whatever ``generation.logprobs_from`` says the learner's ratio uses. Differentiable where the caller
    allows gradients; no autocast of its own.

    Raises:
        ValueError: the answers could not end (no EOS, or ``generation.stop_at_eos`` off: :func:`check_constrained`),
            where every move's probability would be 0 over 0.
    """
    check_constrained(tokenizer, generation, owner)
    packed = pack_moves(
        tokenizer, prompts, legal_moves, generation.chat_template, True, device, context_length(model), owner
    )
    played = replace(generation, logprobs_from="sampling")  # the sampler's distribution, not the tempered π
    return per_prompt(packed, constrained_logprobs(model, packed, played, tokenizer.eos_token_id))


def scored_move_probabilities(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    legal_moves: Sequence[Sequence[str]],
    generation: GenerationConfig,
    normalization: str = "token",
    device: torch.device | str = "cpu",
    owner: str = "move probabilities",
) -> list[list[float]]:
    """Each legal move's exact probability after each prompt (in the order of ``legal_moves``) under scored answers:
    the softmax of the moves' log-likelihoods normalised by ``normalization`` (:func:`score_logprobs`).
    Differentiable where the caller allows gradients; no autocast of its own."""
    packed = pack_moves(
        tokenizer, prompts, legal_moves, generation.chat_template, False, device, context_length(model), owner
    )
    return per_prompt(packed, score_logprobs(model, packed, normalization)[0])
