"""Constrained moves (``game.actions: constrained``): a game's legal move, sampled token by token with each token
restricted to continuations of the legal moves' names, then EOS.

Every restricted token keeps its restriction (the rollout's ``allowed`` column), which the rollout's and the
update's forwards re-apply (:class:`~marllm.algorithms.actions.tokens.TokenCollector`), so the log-probs, the ratio,
the entropy and the KL are those of the distribution sampled, and :meth:`ConstrainedCollector.move_probabilities` is
exact: the product of a move's restricted token probabilities under every processor that sampling applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from marllm.algorithms.action_modes import ConstrainedMode
from marllm.algorithms.actions.tokens import TokenCollector
from marllm.models.devices import autocast_for
from marllm.models.generation import GeneratedBatch
from marllm.models.legal_moves import constrained_move_probabilities, generate_moves


@dataclass(eq=False, kw_only=True)
class ConstrainedCollector(ConstrainedMode, TokenCollector):
    """A legal move per prompt, restricted token by token; see the module docstring."""

    draws_budget = False

    @torch.no_grad()
    def move_probabilities(self, prompts: Sequence[str], legal_moves: Sequence[Sequence[str]]) -> list[list[float]]:
        """The exact probability of each legal move of each prompt as constrained answers play it: the product of its
        tokens' restricted probabilities, its final EOS included (in the order of ``legal_moves``)."""
        self.activate()
        with autocast_for(self.model, self.compute.autocast_dtype):
            return constrained_move_probabilities(
                self.model, self.tokenizer, prompts, legal_moves, self.generation,
                device=self.device, owner=self.owner,
            )  # fmt: skip

    def _sample(
        self, prompts: tuple[str, ...], legal_moves: list[list[str]] | None, budget: int, capture: bool
    ) -> tuple[GeneratedBatch, torch.Tensor | None]:
        assert legal_moves is not None
        # The budget is the longest legal move's: the batch's drawn budget is not used.
        sample = generate_moves(
            self.model, self.tokenizer, prompts, legal_moves, self.generation, self.context_length, self.owner, capture
        )
        return sample.generated, sample.allowed
