"""Reason, then act (``game.actions: think``): free text of the batch's budget, a thought-end marker, then a legal
move restricted token by token (:mod:`marllm.models.thought_moves`).

The thought's tokens and the move's are one response: the rollout scores them in one forward over both, the move's
restriction kept as the ``allowed`` column (the thought's positions unrestricted), as
:class:`~marllm.algorithms.actions.tokens.TokenCollector` scores any restricted response.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from marllm.algorithms.action_modes import ThinkMode
from marllm.algorithms.actions.tokens import TokenCollector
from marllm.models.generation import GeneratedBatch
from marllm.models.thought_moves import generate_thought_and_move


@dataclass(eq=False, kw_only=True)
class ThinkCollector(ThinkMode, TokenCollector):
    """A thought, then a legal move; see the module docstring."""

    def _sample(
        self, prompts: tuple[str, ...], legal_moves: list[list[str]] | None, budget: int, capture: bool
    ) -> tuple[GeneratedBatch, torch.Tensor | None]:
        assert legal_moves is not None
        sample = generate_thought_and_move(
            self.model, self.tokenizer, prompts, legal_moves, self.generation, budget, self.context_length, self.owner
        )
        return sample.generated, sample.allowed

    def _from_generate(self) -> bool:
        # A thought and its move come from two generate calls: their log-probs from one forward over both.
        return False
