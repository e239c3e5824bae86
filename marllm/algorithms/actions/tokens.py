"""Free-text answers (``game.actions: generate``, and every text task): a response sampled token by token, each
token one action of the rollout.

The rollout records, per response token, log π and log π_0 of the token under the distribution it was sampled from
(``generation``'s processing; a restriction to legal continuations where a subclass samples under one, kept as the
``allowed`` column), V of the value head, and the full-vocabulary KL. :meth:`TokenCollector.rescore` re-computes the
same log-probs under the updated policy, the restriction re-applied. Constrained moves and thought-then-move answers
(:mod:`~marllm.algorithms.actions.constrained`, :mod:`~marllm.algorithms.actions.think`) sample otherwise and are
scored alike.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from tianshou.data import Batch

from marllm.algorithms.action_modes import GenerateMode
from marllm.algorithms.actions.base import Collector, Rescored
from marllm.algorithms.core import (
    floor_logprobs,
    logprobs_and_entropy,
    logprobs_and_full_kl,
    masked_mean,
    sampled_kl,
    scalars,
)
from marllm.algorithms.rollout import Rollout
from marllm.algorithms.seat_sequences import SeatTurns, SequenceBook, SequenceKey, sequence_rows
from marllm.games.env import keys
from marllm.models.cache_continuation import can_continue
from marllm.models.chunked_head import check_plain_head, chunked_head_logprobs, head_deferred, writable_in_place
from marllm.models.devices import autocast_for
from marllm.models.generation import GeneratedBatch, generate_responses, logprob_logits, reference_logprob_logits
from marllm.models.move_tries import restrict_logits
from marllm.models.prefix_forward import shared_prefix_response_forward
from marllm.models.token_prompts import TokenPrompts


@dataclass(eq=False, kw_only=True)
class TokenCollector(GenerateMode, Collector):
    """Free text: one response per prompt, of the batch's budget (:meth:`sample_length`), every token an action."""

    draws_budget: ClassVar[bool] = True
    """Whether an answer's length budget is drawn (free text); a constrained move's is its longest legal name's."""
    _plain_head_checked: bool = field(default=False, init=False, repr=False)
    book: SequenceBook = field(default_factory=SequenceBook, init=False, repr=False)
    """The seat sequences of the episode being played (``game.history: sequence``), until the update lays them out."""
    play_book: SequenceBook = field(default_factory=SequenceBook, init=False, repr=False)
    """The seat sequences :meth:`play` goes on from, outside training."""

    def collect(self, observation: Mapping[str, Sequence[Any]], role: str | None = None) -> Rollout:
        """Sample one response per prompt of ``observation["prompt"]``, as a rollout awaiting its rewards; where the
        observation holds a ``delta`` (a game played as one token sequence per seat), one answer after each row's
        sequence, the rollout's tensors left to :meth:`sequence_rollout`."""
        legal_moves = self.legal_moves(observation) if self.needs_legal_moves else None
        if keys.DELTA in observation:
            return self._sequence_turn(observation, role, legal_moves)
        return self._rollout(tuple(observation["prompt"]), role, legal_moves)

    @torch.no_grad()
    def _sequence_turn(
        self, observation: Mapping[str, Sequence[Any]], role: str | None, legal_moves: list[list[str]] | None
    ) -> Rollout:
        started = time.perf_counter()
        budget = self.sample_length()  # drawn every turn, as a re-rendered turn draws it
        turn_keys = tuple((role, int(game)) for game in observation[keys.GAMES])
        self.book.observe(turn_keys, observation[keys.DELTA], self.tokenizer, self.generation.chat_template)
        self.activate()
        with self.placement.generating(self.model), autocast_for(self.model, self.compute.autocast_dtype):
            prompts, generated, answers = self._answer_sequences(self.book, turn_keys, legal_moves, budget)
        timings = {"generation_s": time.perf_counter() - started, "forward_s": 0.0}
        turns = SeatTurns(turn_keys, tuple(answers))
        return Rollout(prompts, generated.texts, 0, Batch(), role=role, timings=timings, seat_turns=turns)

    def _answer_sequences(
        self, book: SequenceBook, turn_keys: Sequence[SequenceKey], legal_moves: list[list[str]] | None, budget: int
    ) -> tuple[TokenPrompts, GeneratedBatch, list[int]]:
        """Sample an answer after each row's sequence in ``book`` (going on from its kept cache where the model can)
        and append it; the prompts, the sampled batch and each row's answer number."""
        continues = can_continue(self.model, self.generation)
        prompts = book.prompts(turn_keys, self.tokenizer, self.model if continues else None)
        generated, allowed = self._sample(prompts, legal_moves, budget, False)
        answers = book.record(turn_keys, generated.response, generated.mask, allowed, self.tokenizer.eos_token_id)
        if continues:
            book.keep(turn_keys, prompts)
        # Only the book holds the rows' caches: the turn's rollout keeps its prompts until the episode's update, and
        # every turn's whole cache kept with them would grow the memory with the square of the game's length.
        prompts.kept = prompts.continuation = None
        return prompts, generated, answers

    @torch.no_grad()
    def sequence_rollout(self, turns: Sequence[Rollout]) -> Rollout:
        """The episode's seat sequences as one rewarded rollout, a row per sequence, scored in one forward of the
        policy and one of the reference each (:mod:`~marllm.algorithms.seat_sequences`); ``turns`` are the turns'
        rewarded rollouts, whose rewards it holds in turn order. The book starts anew."""
        started = time.perf_counter()
        rows = sequence_rows(self.book, self.tokenizer.pad_token_id)
        self.book = SequenceBook()
        device = self.device
        allowed = None if rows.allowed is None else rows.allowed.to(device)
        self.activate()
        ids, attention = rows.input_ids.to(device), rows.attention_mask.to(device)
        tensors = self._scored(
            ids, attention, rows.response.to(device), rows.mask.to(device), rows.prompt_length, allowed
        )
        index = {key: row for row, key in enumerate(rows.keys)}
        credit = SeatTurns(
            keys=tuple(key for turn in turns for key in turn.seat_turns.keys),
            answers=tuple(answer for turn in turns for answer in turn.seat_turns.answers),
            rows=tuple(index[key] for turn in turns for key in turn.seat_turns.keys),
            answer_ends=rows.answer_ends,
        )
        generation_s = sum(turn.timings.get("generation_s", 0.0) for turn in turns)
        roles = {turn.role for turn in turns}
        return Rollout(
            prompts=tuple(
                self.tokenizer.batch_decode(rows.input_ids[:, : rows.prompt_length], skip_special_tokens=True)
            ),
            responses=tuple(self.tokenizer.batch_decode(rows.response, skip_special_tokens=True)),
            prompt_length=rows.prompt_length,
            tensors=tensors,
            role=roles.pop() if len(roles) == 1 else None,
            received_rewards=np.concatenate([turn.received_rewards for turn in turns]),
            task_rewards=np.concatenate([turn.task_rewards for turn in turns]),
            timings={"generation_s": generation_s, "forward_s": time.perf_counter() - started},
            seat_turns=credit,
        )

    def respond(self, prompts: Sequence[str], max_new_tokens: int | None = None) -> tuple[str, ...]:
        """Sample free-text responses without recording anything (evaluation; deploying the agent alone)."""
        budget = max_new_tokens or self.sample_length()
        self.activate()
        with self.placement.generating(self.model), autocast_for(self.model, self.compute.autocast_dtype):
            return generate_responses(
                self.model, self.tokenizer, tuple(prompts), budget, self.generation, self.context_length, self.owner
            ).texts

    @torch.no_grad()
    def play(self, observation: Mapping[str, Sequence[Any]], role: str | None = None) -> tuple[str, ...]:
        """One answer per prompt, recording nothing (see :meth:`Collector.play`); free text (``generate``, ``think``)
        draws each answer's budget, as the rollout's per-batch draw would, from one distribution. Where the
        observation holds a ``delta``, each answer goes on from the seat's (``role``'s) sequence of its game, which
        starts anew where the delta is the whole prompt (the seat's first answer in a game)."""
        prompts = tuple(observation["prompt"])
        if not prompts:
            return ()
        legal_moves = self.legal_moves(observation) if self.needs_legal_moves else None
        self.activate()
        sequences = keys.DELTA in observation
        if sequences:
            turn_keys = [(role, int(game)) for game in observation[keys.GAMES]]
            for key, delta, prompt in zip(turn_keys, observation[keys.DELTA], prompts, strict=True):
                if delta == prompt:
                    self.play_book.sequences.pop(key, None)
            self.play_book.observe(turn_keys, observation[keys.DELTA], self.tokenizer, self.generation.chat_template)

        def answer(rows: Sequence[int], budget: int) -> tuple[str, ...]:
            moves = None if legal_moves is None else [legal_moves[i] for i in rows]
            if sequences:
                return self._answer_sequences(self.play_book, [turn_keys[i] for i in rows], moves, budget)[1].texts
            return self._sample(tuple(prompts[i] for i in rows), moves, budget, False)[0].texts

        with self.placement.generating(self.model), autocast_for(self.model, self.compute.autocast_dtype):
            if not self.draws_budget:
                return answer(range(len(prompts)), 0)
            return answers_by_budget(len(prompts), self.generation, answer)

    def rescore(self, mb: Any, prompt_length: int) -> Rescored:
        """log π of ``mb``'s response tokens under the policy now (the distribution sampled: ``generation``'s
        processing and ``mb.allowed``'s restriction re-applied; floored where the updated policy's top-k/top-p no
        longer keeps a token), its values, and the mean entropy and ratio over the response tokens."""
        if self.compute.logits_chunk_rows is not None:
            return self._rescore_by_chunks(mb, prompt_length, self.compute.logits_chunk_rows)
        with autocast_for(self.model, self.compute.autocast_dtype):  # the forward only: the backward follows its dtypes
            logits, values = shared_prefix_response_forward(
                self.model, mb.input_ids, mb.attention_mask, prompt_length, self.value_head
            )
        if "allowed" in mb:  # constrained answers: the restriction they were sampled under, re-applied
            logits = restrict_logits(logits, mb.allowed, inplace=True)
        # The LM head's backward does not read its output: the gradient can take the logits' place.
        sequences = (mb.input_ids, mb.attention_mask, prompt_length)
        logits = logprob_logits(logits, *sequences, self.generation, self.tokenizer.eos_token_id, overwrite_logits=True)
        # One pass over the logits for both. Nothing but the log-probs' backward reads the logits after this, so it
        # writes their gradient over them: one (b, L, V) buffer for the forward and the backward.
        logprobs, token_entropy = logprobs_and_entropy(logits, mb.response, overwrite_logits=True)
        del logits
        return _rescored(mb, logprobs, token_entropy, values)

    def _rescore_by_chunks(self, mb: Any, prompt_length: int, chunk_rows: int) -> Rescored:
        """:meth:`rescore` with the LM head applied ``chunk_rows`` rows at a time and recomputed in the backward
        (``ppo.compute.logits_chunk_rows``, :mod:`marllm.models.chunked_head`): the same log-probs up to float
        rounding."""
        if not self._plain_head_checked:
            check_plain_head(self.model, self.owner)
            self._plain_head_checked = True
        autocast = functools.partial(autocast_for, self.model, self.compute.autocast_dtype)
        with autocast(), head_deferred(self.model) as head:
            hidden, values = shared_prefix_response_forward(  # (b, L, H): what the head would have projected
                self.model, mb.input_ids, mb.attention_mask, prompt_length, self.value_head
            )
        eos = self.tokenizer.eos_token_id

        def logprobs_of_rows(logits: torch.Tensor, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
            if "allowed" in mb:
                logits = restrict_logits(logits, mb.allowed[rows], inplace=writable_in_place(logits))
            sequences = (mb.input_ids[rows], mb.attention_mask[rows], prompt_length)
            logits = logprob_logits(logits, *sequences, self.generation, eos, overwrite_logits=True)
            return logprobs_and_entropy(logits, mb.response[rows], overwrite_logits=True)

        logprobs, token_entropy = chunked_head_logprobs(head, hidden, chunk_rows, logprobs_of_rows, autocast)
        return _rescored(mb, logprobs, token_entropy, values)

    def _sample(
        self, prompts: tuple[str, ...], legal_moves: list[list[str]] | None, budget: int, capture: bool
    ) -> tuple[GeneratedBatch, torch.Tensor | None]:
        """The sampled responses of at most ``budget`` tokens and, where the mode restricts tokens, their restriction
        (B, L, K); ``capture`` keeps generate's logits (and hidden states) for the rollout."""
        args = (self.model, self.tokenizer, prompts, budget, self.generation, self.context_length, self.owner)
        return generate_responses(*args, capture), None

    def _from_generate(self) -> bool:
        """Whether the rollout's log-probs are generate's own forwards (``ppo.compute.rollout_from_generate``)."""
        return bool(self.compute.rollout_from_generate)

    @torch.no_grad()
    def _rollout(self, prompts: tuple[str, ...], role: str | None, legal_moves: list[list[str]] | None) -> Rollout:
        started = time.perf_counter()
        from_generate = self._from_generate()
        # Every token mode draws the batch's budget, used or not: the generator also shuffles the mini-batches.
        budget = self.sample_length()
        self.activate()
        with self.placement.generating(self.model), autocast_for(self.model, self.compute.autocast_dtype):
            generated_batch, allowed = self._sample(prompts, legal_moves, budget, from_generate)
        prompt_ids, prompt_mask = generated_batch.prompt_ids, generated_batch.prompt_mask
        response, mask = generated_batch.response, generated_batch.mask
        generated = time.perf_counter()
        input_ids = torch.cat([prompt_ids, response], 1)  # (B, P+L)
        attention_mask = torch.cat([prompt_mask, torch.ones_like(response)], 1)
        captured = generated_batch if from_generate else None
        tensors = self._scored(
            input_ids, attention_mask, response, mask.float(), prompt_ids.shape[1], allowed, captured
        )
        timings = {"generation_s": generated - started, "forward_s": time.perf_counter() - generated}
        return Rollout(prompts, generated_batch.texts, prompt_ids.shape[1], tensors, role=role, timings=timings)

    def _scored(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        response: torch.Tensor,
        mask: torch.Tensor,
        prompt_length: int,
        allowed: torch.Tensor | None,
        generated: GeneratedBatch | None = None,
    ) -> Batch:
        """The rollout's tensors of these rows (prompt and response, (B, P+L)), scored :meth:`_chunks` rows at a
        time (:meth:`_score`; from ``generated``'s own logits and hidden states where given), and their KL."""
        columns: dict[str, list[torch.Tensor]] = defaultdict(list)
        for rows in self._chunks(len(input_ids)):
            captured = None if generated is None else (generated.logits[rows], generated.hidden[rows])
            restriction = None if allowed is None else allowed[rows]
            for key, value in self._score(
                input_ids[rows], attention_mask[rows], prompt_length, captured, restriction
            ).items():
                columns[key].append(value)
        tensors = Batch(
            input_ids=input_ids,
            attention_mask=attention_mask,
            response=response,
            mask=mask,
            **{key: torch.cat(parts, 0) for key, parts in columns.items()},
            **({"allowed": allowed} if allowed is not None else {}),
        )
        tensors.kl = (
            tensors.kl_full if self.kl_penalty == "full" else sampled_kl(tensors.logprobs, tensors.ref_logprobs)
        ) * tensors.mask
        return tensors

    def _score(
        self,
        ids: torch.Tensor,
        attention: torch.Tensor,
        prompt_length: int,
        captured: tuple[torch.Tensor, torch.Tensor] | None,
        allowed: torch.Tensor | None,
    ) -> dict[str, torch.Tensor]:
        """The rollout's columns of some rows (``ids``: prompt and response, (b, P+L)): log π and log π_0 of each
        response token under the distribution sampled, V, and the full KL. ``captured``: generate's own logits and
        hidden states of these rows, used instead of a second forward; ``allowed``: their restriction, if any."""
        response = ids[:, prompt_length:]
        settings = (prompt_length, self.generation, self.tokenizer.eos_token_id)
        with autocast_for(self.model, self.compute.autocast_dtype):
            if captured is not None:  # generate's own forwards, instead of a second one over prompt and response
                logits, hidden = captured
                values = None if self.value_head is None else self.value_head(hidden)
            else:
                logits, values = shared_prefix_response_forward(
                    self.model, ids, attention, prompt_length, self.value_head
                )
        if allowed is not None:  # the distribution constrained answers were sampled from
            logits = restrict_logits(logits, allowed, inplace=True)
        # Tempered or processed in place: at most the policy's and the reference's (b, L, V) logits are alive.
        logits = logprob_logits(logits, ids, attention, *settings, inplace=True)
        with self.reference_model() as reference:
            # The reference may live on another device than the policy (agents.reference_device).
            on = next(reference.parameters()).device
            with autocast_for(reference, self.compute.autocast_dtype):
                ref_logits, _ = shared_prefix_response_forward(reference, ids.to(on), attention.to(on), prompt_length)
            # model.reference_dtype may differ from the policy's: the wider of the two (float32 for a bfloat16
            # reference of a float32 policy), so that processing, restriction and log-softmax see one dtype.
            ref_logits = ref_logits.to(logits.device, torch.promote_types(ref_logits.dtype, logits.dtype))
        if allowed is not None:  # π_0 restricted alike: both are distributions over the same legal tokens
            ref_logits = restrict_logits(ref_logits, allowed, inplace=True)
        ref_logits = reference_logprob_logits(ref_logits, logits, ids, attention, *settings, inplace=True)
        logprobs, ref_logprobs, kl_full = logprobs_and_full_kl(logits, ref_logits, response)
        del logits, ref_logits  # before the next chunk's forward
        scored = {"logprobs": floor_logprobs(logprobs), "ref_logprobs": floor_logprobs(ref_logprobs)}
        if values is not None:
            scored["values"] = values.float()
        return scored | {"kl_full": kl_full}

    def _chunks(self, batch_size: int) -> list[slice]:
        size = self.compute.forward_batch_size or batch_size
        return [slice(start, start + size) for start in range(0, batch_size, size)]


def _rescored(mb: Any, logprobs: torch.Tensor, token_entropy: torch.Tensor, values: torch.Tensor | None) -> Rescored:
    """A rescore's result from its log-probs, floored where they are −inf, with the mean entropy and ratio over ``mb``'s
    response tokens."""
    # With logprobs_from="sampling" a token the updated policy's top-k/top-p no longer keeps has log-prob −inf.
    logprobs = floor_logprobs(logprobs)
    with torch.no_grad():
        stats = scalars(
            {
                "entropy": masked_mean(token_entropy, mb.mask),
                "ratio": masked_mean(torch.exp(logprobs - mb.logprobs), mb.mask),
            }
        )
    return Rescored(logprobs, values, stats)


def answers_by_budget(
    count: int, generation: Any, answer: Callable[[list[int], int], Sequence[str]]
) -> tuple[str, ...]:
    """``count`` answers, each with its own budget drawn uniformly from ``[generation.min_new_tokens,
    generation.max_new_tokens]`` (the global torch generator): ``answer(rows, budget)`` is called once per drawn
    budget with the rows that drew it, and the answers come back in row order."""
    budgets = torch.randint(generation.min_new_tokens, generation.max_new_tokens + 1, (count,)).tolist()
    answers: list[str] = [""] * count
    for budget in sorted(set(budgets)):
        rows = [i for i, drawn in enumerate(budgets) if drawn == budget]
        for i, text in zip(rows, answer(rows, budget), strict=True):
            answers[i] = text
    return tuple(answers)
