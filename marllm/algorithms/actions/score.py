"""Scored moves (``game.actions: score``; TWOSOME, Tan et al., ICLR 2024; GLAM, Carta et al., ICML 2023): a
categorical policy over a game's legal moves, each scored by the model's likelihood of its name.

π(a | s) = softmax over the legal moves a of the (normalised) log-likelihood of a's tokens after the prompt
(:func:`~marllm.models.legal_moves.score_logprobs`). One move is one action: the rollout keeps each row's prompt, its
legal moves' tokens, the move drawn, log π_old(a | s), log π_0(a | s), V(s) (the value head on the prompt's last
hidden state, where the learner has one) and the exact KL(π_old(· | s) ‖ π_0(· | s)) over the legal moves, as
one-"token" columns (B, 1): any learner's update reads them as it reads a one-token response (one step of GAE for
PPO). The learner answers the drawn move's name, which the env's parser maps to it; nothing is generated.

**Each move is its own one-step episode, and its return holds only its own state's KL.** A game credits the move
a seat makes k moves before its last with γ^k · payoff (``game.discount``), so move t's target is
r_t = γ^k·R − η·KL(π(· | s_t) ‖ π_0(· | s_t)); the KL at the seat's later states s_{t'>t} is not added to it. The
update is then the gradient of a per-state regularised objective — at every state the seat reaches, the game's
credit minus η times that state's KL — rather than of the sequence-level E[R − η·Σ_t KL_t], whose gradient would
also charge a move with the KL of the states it leads to (Σ_{t'>t} γ^{t'−t}·η·KL_{t'}). The choice is deliberate: a
seat's moves reach the learner as separate samples from separate calls (other seats move in between), the per-state
form keeps every visited state's policy near the base whether or not earlier moves lead there often, and in the
short games it serves (Kuhn poker: at most two moves per seat) the left-out terms are one later state's KL.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tianshou.data import Batch

from marllm.algorithms.action_modes import ScoreMode, ScoreSettings
from marllm.algorithms.actions.base import Collector, Rescored
from marllm.algorithms.rollout import Rollout
from marllm.models.devices import autocast_for
from marllm.models.legal_moves import (
    first_token_scores,
    score_logprobs,
    scored_move_probabilities,
)
from marllm.models.packed_moves import move_tensors, packed_from_tensors
from marllm.models.policy import ValueHead


@dataclass(eq=False, kw_only=True)
class ScoreCollector(ScoreMode, Collector):
    """One legal move per row drawn from π(· | s), the softmax of the moves' ``normalization``-normalised
    log-likelihoods (:func:`move_scores`); free-text answers are refused.

    Attributes:
        normalization: how a move's log-likelihood is normalised: ``"none"`` (its sum: short names are favoured),
            ``"token"`` (the mean per token) or ``"word"`` (the sum per word of its name). ``generation`` is used for
            its ``chat_template`` only: nothing is sampled token by token.
    """

    normalization: str = "token"

    def __post_init__(self) -> None:
        try:
            ScoreSettings(self.normalization)
        except ValueError as error:
            raise ValueError(f"{self.owner}: {error}") from None
        if self.compute.logits_chunk_rows is not None:
            # Scored moves project the vocabulary only at the moves' own few tokens: there is nothing to chunk, and a
            # setting this mode would not read is refused rather than accepted.
            raise ValueError(
                f"{self.owner}: ppo.compute.logits_chunk_rows applies to answers sampled token by token; "
                "game.actions: score reads no vocabulary-wide logits to chunk: set ppo.compute.logits_chunk_rows: "
                "null"
            )

    def collect(self, observation: Mapping[str, Sequence[Any]], role: str | None = None) -> Rollout:
        """Draw one legal move per row from π(· | s), as a rollout whose responses are the moves' names."""
        if "delta" in observation:
            raise ValueError(f"{self.owner}: game.actions: score {self.sequences}; use game.history: prompt")
        return self._rollout(tuple(observation["prompt"]), role, self.legal_moves(observation))

    def respond(self, prompts: Sequence[str], max_new_tokens: int | None = None) -> tuple[str, ...]:
        """Refused: scored moves need a game's legal moves."""
        raise ValueError(
            f"{self.owner} scores a game's legal moves (game.actions: score) and cannot answer prompts without them"
        )

    @torch.no_grad()
    def play(self, observation: Mapping[str, Sequence[Any]], role: str | None = None) -> tuple[str, ...]:
        """One legal move per prompt drawn from :meth:`move_probabilities` (the global torch generator), recording
        nothing (see :meth:`Collector.play`)."""
        prompts = tuple(observation["prompt"])
        if not prompts:
            return ()
        legal_moves = self.legal_moves(observation)
        rows = self.move_probabilities(prompts, legal_moves)
        width = max(len(row) for row in rows)
        probabilities = torch.tensor([list(row) + [0.0] * (width - len(row)) for row in rows])
        drawn = torch.multinomial(probabilities, 1)[:, 0].tolist()
        return tuple(names[m] for names, m in zip(legal_moves, drawn, strict=True))

    @torch.no_grad()
    def move_probabilities(self, prompts: Sequence[str], legal_moves: Sequence[Sequence[str]]) -> list[list[float]]:
        """π(a | s) of each legal move of each prompt, in the order of ``legal_moves`` (each row sums to 1)."""
        self.activate()
        with autocast_for(self.model, self.compute.autocast_dtype):
            return scored_move_probabilities(
                self.model, self.tokenizer, prompts, legal_moves, self.generation, self.normalization,
                self.device, self.owner,
            )  # fmt: skip

    def rescore(self, mb: Any, prompt_length: int) -> Rescored:
        """log π(a | s) of the moves drawn under the policy now (and V(s) where the learner has a value head), with
        the exact entropy over the legal moves and the mean ratio."""
        table, values = self.scores(self.model, mb, with_values=True)
        logprobs = table.gather(1, mb.response)  # (b, 1): the moves drawn
        with torch.no_grad():
            plogp = torch.where(torch.isfinite(table), table.exp() * table, 0.0)
            stats = {
                "entropy": (-plogp.sum(1)).mean().item(),
                "ratio": torch.exp(logprobs - mb.logprobs).mean().item(),
            }
        return Rescored(logprobs, values, stats)

    def scores(
        self, model: Any, columns: Mapping[str, torch.Tensor], with_values: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:func:`move_scores` under ``model`` (the policy or the reference) with these settings, and the value head
        if ``with_values``."""
        return move_scores(
            model,
            columns,
            value_head=self.value_head if with_values else None,
            normalization=self.normalization,
            autocast_dtype=self.compute.autocast_dtype,
            device=self.device,
            pad_token_id=self.tokenizer.pad_token_id,
        )

    @torch.no_grad()
    def _rollout(self, prompts: tuple[str, ...], role: str | None, legal_moves: list[list[str]]) -> Rollout:
        started = time.perf_counter()
        self.activate()
        chat_template = self.generation.chat_template
        columns = move_tensors(
            self.tokenizer, prompts, legal_moves, chat_template, self.device, self.context_length, self.owner
        )
        table, values = self.scores(self.model, columns, with_values=True)
        action = torch.multinomial(table.exp(), 1)  # (B, 1): one move per row
        with self.reference_model() as reference:
            on = next(reference.parameters()).device
            ref_columns = {key: value.to(on) for key, value in columns.items()}
            ref_table, _ = self.scores(reference, ref_columns, with_values=False)
        legal = torch.isfinite(table)
        kl_full = torch.where(legal, table.exp() * (table - ref_table), 0.0).sum(1, keepdim=True)  # exact, (B, 1)
        logprobs, ref_logprobs = table.gather(1, action), ref_table.gather(1, action)
        tensors = Batch(
            response=action,
            mask=torch.ones_like(logprobs),
            logprobs=logprobs,
            ref_logprobs=ref_logprobs,
            kl_full=kl_full,
            **({"values": values} if values is not None else {}),  # a critic-free learner has no value head
            **columns,
        )
        sampled = logprobs - ref_logprobs
        tensors.kl = kl_full if self.kl_penalty == "full" else sampled
        texts = tuple(names[a] for names, a in zip(legal_moves, action[:, 0].tolist(), strict=True))
        elapsed = time.perf_counter() - started
        timings = {"generation_s": 0.0, "forward_s": elapsed}
        return Rollout(prompts, texts, columns["input_ids"].shape[1], tensors, role=role, timings=timings)


def move_scores(
    model: Any,
    columns: Mapping[str, torch.Tensor],
    *,
    value_head: ValueHead | None,
    normalization: str,
    autocast_dtype: str | None,
    device: torch.device,
    pad_token_id: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, M) log π(· | s) over each row's legal moves (−inf past them) under ``model``, and (B, 1) V(s) from
    ``value_head`` (None without one), on ``device``. ``columns``: :func:`~marllm.models.packed_moves.move_tensors`'.

    Each distinct (prompt, legal moves) is computed once (a game's batch repeats its information states: Kuhn
    poker has 12), and where every move is one token, from one forward of the prompt alone
    (:func:`~marllm.models.legal_moves.first_token_scores`); else every move is a packed row of its own.
    """
    first, inverse = _distinct_rows(columns)
    distinct = {key: columns[key][first] for key in ("input_ids", "attention_mask", "moves", "move_words")}
    with autocast_for(model, autocast_dtype):
        if distinct["moves"].shape[-1] == 1:
            table, values = first_token_scores(model, *distinct.values(), normalization, value_head)
        else:
            packed = packed_from_tensors(*distinct.values(), pad_token_id)
            logprobs, packed_values = score_logprobs(model, packed, normalization, value_head)
            table = packed.per_row(logprobs)
            start = torch.tensor([0, *packed.counts[:-1]], device=logprobs.device).cumsum(0)  # each row's first
            values = None if packed_values is None else packed_values[start].float().unsqueeze(1)
    table = table.to(device)[inverse]
    return table, None if values is None else values.to(device)[inverse]


def _distinct_rows(columns: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The first row of each distinct (prompt, legal moves) of ``columns``, and each row's index among them."""
    keys = torch.cat([columns["attention_mask"] * (columns["input_ids"] + 1), columns["moves"].flatten(1)], 1)
    index_of: dict[tuple[int, ...], int] = {}
    first, inverse = [], []
    for row, key in enumerate(map(tuple, keys.tolist())):
        if key not in index_of:
            index_of[key] = len(first)
            first.append(row)
        inverse.append(index_of[key])
    device = columns["input_ids"].device
    return torch.tensor(first, dtype=torch.long, device=device), torch.tensor(inverse, dtype=torch.long, device=device)
