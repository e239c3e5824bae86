"""An action mode for games that talk (``game.actions: talk.py:TalkOrPropose``): free text on a message turn (a
turn whose view lists no legal move, :meth:`marllm.games.env.GameView.free_text`), a legal move restricted token by
token on every other turn (``constrained``).

A seat moves in all of its games at once, and in :mod:`deal_or_no_deal` every game of a batch is at the same turn, so a
batch of prompts is all messages or all proposals. A message's rollout carries an ``allowed`` column that restricts
nothing (−1 everywhere), so that a learner's messages and proposals merge into one update.
"""

from __future__ import annotations

from typing import Any

import torch

from marllm.algorithms.action_modes import TOKEN_KL
from marllm.algorithms.actions import ConstrainedCollector, TokenCollector


class TalkOrPropose(ConstrainedCollector):
    """Free text where a row has no legal move, a constrained move where it has; see the module docstring."""

    actions = "talk_or_propose"
    summary = "free text on a message turn, a legal move restricted token by token on the others"
    draws_budget = True  # a message's budget is drawn per batch from generation.min_new_tokens..max_new_tokens
    exact_policy = None  # messages have no move probabilities
    kl = {
        mode: f"{text}; a proposal's restricted to the legal moves' continuations" for mode, text in TOKEN_KL.items()
    }

    def _sample(
        self, prompts: tuple[str, ...], legal_moves: list[list[str]] | None, budget: int, capture: bool
    ) -> tuple[Any, torch.Tensor | None]:
        talking = [not moves for moves in legal_moves or [[]] * len(prompts)]
        if not any(talking):
            return super()._sample(prompts, legal_moves, budget, capture)
        if not all(talking):
            raise ValueError(f"{self.owner}: a batch mixes message turns and move turns; each must be all one kind")
        generated, _ = TokenCollector._sample(self, prompts, None, budget, capture)
        response = generated.response
        return generated, torch.full((*response.shape, 1), -1, dtype=torch.long, device=response.device)
