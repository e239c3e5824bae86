"""One token sequence per seat and game (``game.history: sequence``): what a learner keeps of a game it plays, and
how an update reads it.

A seat's sequence is its first observation, tokenized as a prompt is, then at each later turn only what is new since
its answer (the game's ``delta`` observation, :data:`~marllm.games.env.keys.DELTA`), and after each observation its
answer's tokens exactly as they were sampled: nothing is rendered to text and tokenized again, so the tokens trained
on are the tokens sampled. :class:`SequenceBook` grows the sequences while a learner acts; :func:`sequence_rows` lays
them out as one rollout row each, the first observation as the prompt and everything after it as the response, the
seat's own tokens masked in (the observations between its answers are read, not trained on).

An update credits each turn's reward at the turn's last token, as the difference of its credited return and the
next turn's (:func:`turn_score_tokens`), so that with γ = 1 the return from a turn's tokens is the credit the same
turn gets when played from re-rendered prompts; GAE (:func:`~marllm.algorithms.core.gae`) runs over the seat's own
tokens across its turns, skipping the observation tokens between them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tianshou.data import Batch

from marllm.algorithms.rollout import Rollout, UpdateBatch
from marllm.models.cache_continuation import RowCache, continued_layout, row_caches
from marllm.models.token_prompts import TokenPrompts, observation_ids

SequenceKey = tuple[str | None, int]
"""A seat's sequence of one game: (its role, the game's index in the batch)."""


@dataclass
class SeatSequence:
    """One seat's tokens of one game so far, with where each of its answers lies in them."""

    ids: list[int] = field(default_factory=list)
    answers: list[tuple[int, int]] = field(default_factory=list)
    """Each answer's [start, end) in ``ids``."""
    allowed: list[torch.Tensor | None] = field(default_factory=list)
    """Each answer's restriction (its tokens' allowed ids, (n, K), −1-padded), or None where it had none."""
    ended_with_eos: bool = False
    cache: RowCache | None = None
    """The key/value cache of the sequence's first tokens, kept from its last generation (None: none kept)."""

    @property
    def first_length(self) -> int:
        """The tokens of the first observation: the prompt of the sequence's rollout row."""
        return self.answers[0][0] if self.answers else len(self.ids)


class SequenceBook:
    """A learner's sequences of the games it plays in one episode, by (role, game); cleared by each update."""

    def __init__(self) -> None:
        self.sequences: dict[SequenceKey, SeatSequence] = {}

    def __bool__(self) -> bool:
        return bool(self.sequences)

    def observe(self, keys: Sequence[SequenceKey], deltas: Sequence[str], tokenizer: Any, chat_template: bool) -> None:
        """Append each row's observation (its first, or what is new since its last answer) to its sequence."""
        for key, text in zip(keys, deltas, strict=True):
            sequence = self.sequences.setdefault(key, SeatSequence())
            first = not sequence.ids
            sequence.ids += observation_ids(tokenizer, text, first, chat_template, sequence.ended_with_eos)

    def prompts(self, keys: Sequence[SequenceKey], tokenizer: Any, model: Any = None) -> TokenPrompts:
        """The rows' sequences as prompts to answer after, laid out to go on from their kept caches where ``model``
        (the one that will generate; None: none) has any."""
        prompts = TokenPrompts(tokenizer, [self.sequences[key].ids for key in keys])
        caches = [self.sequences[key].cache for key in keys]
        if model is not None and any(cache is not None for cache in caches):
            prompts.continuation = continued_layout(model, prompts.ids, caches)
        return prompts

    def keep(self, keys: Sequence[SequenceKey], prompts: TokenPrompts) -> None:
        """Keep each row's cache from the generation after ``prompts`` (its ``kept`` cache, if any), for its next
        turn."""
        if prompts.kept is None:
            return
        cache, mask = prompts.kept
        for key, row in zip(keys, row_caches(cache, mask), strict=True):
            self.sequences[key].cache = row

    def record(
        self,
        keys: Sequence[SequenceKey],
        response: torch.Tensor,
        mask: torch.Tensor,
        allowed: torch.Tensor | None,
        eos_token_id: int | None,
    ) -> list[int]:
        """Append each row's answer (``response`` (B, L) up to ``mask``'s end) to its sequence, as sampled; each
        row's answer number in its sequence."""
        lengths = mask.sum(1).tolist()
        numbers = []
        for row, (key, length) in enumerate(zip(keys, lengths, strict=True)):
            sequence = self.sequences[key]
            tokens = response[row, : int(length)].tolist()
            start = len(sequence.ids)
            sequence.ids += tokens
            sequence.answers.append((start, len(sequence.ids)))
            sequence.allowed.append(None if allowed is None else allowed[row, : int(length)].cpu())
            sequence.ended_with_eos = bool(tokens) and tokens[-1] == eos_token_id
            numbers.append(len(sequence.answers) - 1)
        return numbers


@dataclass(frozen=True)
class SequenceRows:
    """A book's sequences as rollout rows: the first observation left-padded as the prompt, the rest right-padded
    as the response, the seat's own tokens masked in.

    Attributes:
        keys: each row's sequence.
        input_ids, attention_mask: (B, P + L).
        response, mask: (B, L); ``mask`` 1 on the seat's answers' tokens only.
        allowed: (B, L, K) where an answer had a restriction, −1 (unrestricted) elsewhere; else None.
        prompt_length: P.
        answer_ends: per row, per answer, the position in the response of the answer's last token (−1: an empty
            answer, which no reward can be put on).
    """

    keys: tuple[SequenceKey, ...]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response: torch.Tensor
    mask: torch.Tensor
    allowed: torch.Tensor | None
    prompt_length: int
    answer_ends: tuple[tuple[int, ...], ...]


def sequence_rows(book: SequenceBook, pad_token_id: int) -> SequenceRows:
    """Lay the book's sequences out as rollout rows (:class:`SequenceRows`), in the order they began."""
    keys = tuple(book.sequences)
    sequences = [book.sequences[key] for key in keys]
    prompt_length = max(s.first_length for s in sequences)
    length = max(len(s.ids) - s.first_length for s in sequences)
    width = max((a.shape[1] for s in sequences for a in s.allowed if a is not None), default=0)
    rows = len(sequences)
    input_ids = torch.full((rows, prompt_length + length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    mask = torch.zeros((rows, length))
    allowed = torch.full((rows, length, width), -1, dtype=torch.long) if width else None
    answer_ends = []
    for b, sequence in enumerate(sequences):
        first, ids = sequence.first_length, torch.tensor(sequence.ids, dtype=torch.long)
        start = prompt_length - first
        input_ids[b, start : start + len(ids)] = ids
        attention_mask[b, start : start + len(ids)] = 1
        ends = []
        for (begin, end), restriction in zip(sequence.answers, sequence.allowed, strict=True):
            mask[b, begin - first : end - first] = 1
            if allowed is not None and restriction is not None:
                allowed[b, begin - first : end - first, : restriction.shape[1]] = restriction
            ends.append(end - first - 1 if end > begin else -1)
        answer_ends.append(tuple(ends))
    response = input_ids[:, prompt_length:].clone()
    return SequenceRows(keys, input_ids, attention_mask, response, mask, allowed, prompt_length, tuple(answer_ends))


def turn_score_tokens(
    scores: np.ndarray, rows: np.ndarray, answers: np.ndarray, answer_ends: Sequence[Sequence[int]], length: int
) -> torch.Tensor:
    """(B, L) token scores of sequences from per-turn scores: turn ``j`` (of sequence ``rows[j]``, its answer number
    ``answers[j]``) scored ``scores[j]`` (its credited return) puts, at its answer's last token, its score less the
    next answer's of the same sequence, so that the sum from any answer on is that answer's score.

    Raises:
        ValueError: an answer scored twice, or one with no token (nothing to put its reward on).
    """
    table: dict[tuple[int, int], float] = {}
    for score, row, answer in zip(scores.tolist(), rows.tolist(), answers.tolist(), strict=True):
        if (row, answer) in table:
            raise ValueError(f"sequence {row}'s answer {answer} was scored twice")
        table[(row, answer)] = score
    tokens = torch.zeros((len(answer_ends), length), dtype=torch.float32)
    for (row, answer), score in table.items():
        position = answer_ends[row][answer]
        if position < 0:
            raise ValueError(f"sequence {row}'s answer {answer} has no token to put its reward on")
        following = table.get((row, answer + 1), 0.0)
        tokens[row, position] += score - following
    return tokens


@dataclass(frozen=True)
class SeatTurns:
    """Which answer of which seat sequence each row of a rollout's rewards is: for one turn, the sequences' keys;
    once the sequences are laid out as rows (:func:`sequence_rows`), also each reward's row and the answers' ends."""

    keys: tuple[SequenceKey, ...]
    answers: tuple[int, ...]
    rows: tuple[int, ...] = ()
    answer_ends: tuple[tuple[int, ...], ...] = ()


def sequence_update_batch(
    rollout: Rollout,
    transform: Callable[[np.ndarray, np.ndarray], np.ndarray],
    advantages: Callable[[Any, torch.Tensor, float], dict[str, torch.Tensor]],
    kl_coef: float,
    placement: Any,
) -> UpdateBatch:
    """What the epochs train on, from the rewarded rollout of laid-out sequences: each turn's reward transformed as a
    re-rendered turn's would be (``transform``, the learner's score transform, over the turn rows), put on its
    answer's last token (:func:`turn_score_tokens`, the ``turn_scores`` column), then the algorithm's
    ``advantages``. The batch's scores (one per sequence) are its first turn's transformed return.

    Raises:
        ValueError: the learner's placement spans processes (sequences are laid out in one process).
    """
    if placement.world_size > 1:
        raise ValueError(
            "game.history: sequence lays a seat's sequences out in one process; it does not run data-parallel or "
            "sharded yet (use game.history: prompt)"
        )
    turns = rollout.seat_turns
    scores = transform(rollout.received_rewards, np.arange(len(rollout.received_rewards)))
    length = rollout.tensors.response.shape[1]
    rows, answers = np.asarray(turns.rows), np.asarray(turns.answers)
    tokens = turn_score_tokens(scores, rows, answers, turns.answer_ends, length).to(rollout.tensors.mask.device)
    batch = Batch(rollout.tensors, turn_scores=tokens)
    columns = advantages(batch, tokens.sum(1), kl_coef)
    firsts = tokens.sum(1).double().cpu().numpy()
    return UpdateBatch(Batch(batch, **columns), firsts, kl_coef, rollout.prompt_length, None)
