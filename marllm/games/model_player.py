"""A model playing a game as a config's ``game.actions.mode`` says: what evaluation, the exploitability tabulation and a
``best_response`` seat play a model (or a learner's model) with."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from marllm.config.game import EXACT_ACTIONS
from marllm.envs.games.keys import LEGAL_MOVES, PROMPT
from marllm.models.generation import generate_responses
from marllm.models.legal_moves import exact_move_probabilities, generate_moves
from marllm.models.policy import context_length
from marllm.models.thought_moves import generate_thought_and_move
from marllm.players.fixed import FixedPlayer


class ModelPlayer(FixedPlayer):
    """A model answering a game's prompts as ``actions`` says (``game.actions.mode``): ``generate``, free text with
    ``generation``'s settings; ``constrained``, a legal move sampled token by token; ``score``, a legal move drawn from
    the softmax of the moves' log-likelihoods (``normalization``); ``think``, free text and then a constrained move.

    Free text (``generate``, ``think``) gets the token budgets training samples with: each answer's budget drawn
    uniformly from ``[generation.min_new_tokens, generation.max_new_tokens]`` (training draws one per batch, the same
    distribution per answer), so that the policy an evaluation plays and tabulates is the one training sampled."""

    def __init__(
        self,
        name: str,
        model: Any,
        tokenizer: Any,
        generation: Any,
        actions: str = "generate",
        normalization: str = "token",
    ):
        super().__init__(name)
        self.model, self.tokenizer, self.generation = model, tokenizer, generation
        self.actions, self.normalization = actions, normalization

    @torch.no_grad()
    def answer(self, observation: Mapping[str, Sequence[Any]]) -> tuple[str, ...]:
        prompts = tuple(observation[PROMPT])
        if not prompts:
            return ()
        legal_moves = [list(names) for names in observation.get(LEGAL_MOVES, ())]
        context = context_length(self.model)
        if self.actions == "constrained":
            sample = generate_moves(
                self.model, self.tokenizer, prompts, legal_moves, self.generation, context, self.name
            )
            return sample.generated.texts
        if self.actions == "score":
            probabilities = torch.tensor(_padded(self.move_probabilities(prompts, legal_moves)))
            drawn = torch.multinomial(probabilities, 1)[:, 0].tolist()
            return tuple(names[m] for names, m in zip(legal_moves, drawn, strict=True))

        def free_text(rows: list[int], budget: int) -> tuple[str, ...]:
            some = [prompts[i] for i in rows]
            if self.actions == "think":
                moves = [legal_moves[i] for i in rows]
                return generate_thought_and_move(
                    self.model, self.tokenizer, some, moves, self.generation, budget, context, self.name
                ).generated.texts
            return generate_responses(
                self.model, self.tokenizer, some, budget, self.generation, context, self.name
            ).texts

        return answers_by_budget(len(prompts), self.generation, free_text)

    @torch.no_grad()
    def move_probabilities(self, prompts: Sequence[str], legal_moves: Sequence[Sequence[str]]) -> list[list[float]]:
        """The exact probability of each legal move of each prompt under ``score`` or ``constrained`` answers (what
        an exploitability evaluation tabulates); ``ValueError`` under ``generate`` and ``think``, whose move
        probabilities can only be estimated from sampled answers."""
        if self.actions not in EXACT_ACTIONS:
            raise ValueError(
                f"{self.name}: {self.actions} answers have no exact move probabilities; sample them instead"
            )
        device = next(self.model.parameters()).device
        return exact_move_probabilities(
            self.model, self.tokenizer, prompts, legal_moves, self.actions, self.generation, self.normalization, device,
            self.name,
        )  # fmt: skip


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


def _padded(rows: Sequence[Sequence[float]]) -> list[list[float]]:
    """Rows of probabilities padded with 0 to the longest."""
    width = max(len(row) for row in rows)
    return [list(row) + [0.0] * (width - len(row)) for row in rows]
