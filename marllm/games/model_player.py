"""A model playing a game as a config's ``game.actions`` says: what evaluation, the exploitability tabulation and a
``best_response`` seat play a model (or a learner's model) with. It plays through the collector of its action mode
(:mod:`marllm.algorithms.actions`), the one a learner of that mode acts with in training."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from marllm.algorithms.actions import Collector, new_collector
from marllm.algorithms.ppo_config import ComputeConfig, KLConfig
from marllm.config import TrainConfig
from marllm.games.players.fixed import FixedPlayer
from marllm.models.policy import context_length
from marllm.parallel.placement import Placement


class ModelPlayer(FixedPlayer):
    """A model answering a game's prompts as ``actions`` says (``game.actions``): ``generate``, free text with
    ``generation``'s settings; ``constrained``, a legal move sampled token by token; ``score``, a legal move drawn from
    the softmax of the moves' log-likelihoods (``normalization``); ``think``, free text and then a constrained move.

    It answers with :meth:`~marllm.algorithms.actions.base.Collector.play` of its mode's collector (:attr:`collector`):
    each mode samples as a learner of that mode does in training. Free text (``generate``, ``think``) gets the token
    budgets training samples with: each answer's budget drawn uniformly from ``[generation.min_new_tokens,
    generation.max_new_tokens]`` (training draws one per batch, the same distribution per answer), so that the policy
    an evaluation plays and tabulates is the one training sampled."""

    def __init__(
        self,
        name: str,
        model: Any,
        tokenizer: Any,
        generation: Any,
        actions: str = "generate",
        normalization: str | None = None,
        collector: Collector | None = None,
        compute: ComputeConfig | None = None,
    ):
        super().__init__(name)
        self.model, self.tokenizer = model, tokenizer
        if collector is None:
            compute = compute if compute is not None else ComputeConfig()
            collector = _model_collector(name, model, tokenizer, generation, actions, normalization, compute)
        self.collector = collector
        self.seat: str | None = None
        """The seat it last answered for: where a game is played as one token sequence per seat, the seat whose
        sequences its answers go on from."""
        """What plays: given (a learner's own), or the collector of ``actions`` on ``model`` with ``compute``'s
        settings (None: their defaults); its mode (``collector.actions``) and sampling settings
        (``collector.generation``) are the player's."""

    @classmethod
    def of_run(cls, name: str, model: Any, tokenizer: Any, config: TrainConfig) -> ModelPlayer:
        """``model`` (a checkpoint of the run ``config`` describes) playing as the run's learners played: its game's
        action mode and normalisation, its sampling settings and its ``ppo.compute`` settings, so that an evaluation
        computes in the precision training did (``ppo.compute.autocast_dtype``)."""
        if config.game is None:
            raise ValueError(f"{name}: a model plays a game of a config with a game section")
        actions = config.game.actions
        return cls(
            name, model, tokenizer, config.generation, actions.mode, actions.normalization, compute=config.ppo.compute
        )

    def act(self, observation: Mapping[str, Sequence[Any]], role: str | None = None) -> tuple[str, ...]:
        self.seat = role
        return super().act(observation, role)

    def answer(self, observation: Mapping[str, Sequence[Any]]) -> tuple[str, ...]:
        return self.collector.play(observation, self.seat)

    def move_probabilities(self, prompts: Sequence[str], legal_moves: Sequence[Sequence[str]]) -> list[list[float]]:
        """The exact probability of each legal move of each prompt under ``score`` or ``constrained`` answers (what
        an exploitability evaluation tabulates); ``ValueError`` under ``generate`` and ``think``, whose move
        probabilities can only be estimated from sampled answers."""
        return self.collector.move_probabilities(prompts, legal_moves)


def _model_collector(
    name: str,
    model: Any,
    tokenizer: Any,
    generation: Any,
    actions: str,
    normalization: str | None,
    compute: ComputeConfig,
) -> Collector:
    """The collector of ``actions`` (``score``'s ``normalization``) that plays ``model`` for the player ``name``: a
    whole model on this process (a game plays on one)."""
    placement = Placement()
    return new_collector(
        actions,
        owner=name,
        options={"normalization": normalization} if normalization is not None else None,
        name=name,
        player=name,
        model=model,
        tokenizer=tokenizer,
        reference=None,
        adapter=None,
        compute=compute.settled(placement),
        kl_penalty=KLConfig().kl_penalty,
        generation=generation,
        value_head=None,
        context_length=context_length(model),
        device=next(model.parameters()).device,
        placement=placement,
        rng=np.random.default_rng(0),  # draws no batch budget: play() draws its answers' budgets from torch
    )
