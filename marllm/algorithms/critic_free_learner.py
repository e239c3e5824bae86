"""Learners of the critic-free policy-gradient family: GRPO, RLOO and REINFORCE++.

Like :class:`~marllm.algorithms.ppo.PPOLearner` they build on the clipped policy-gradient learner
(:class:`~marllm.algorithms.policy_gradient.PolicyGradientLearner`: acting, rollouts, optimiser steps, and the ``ppo``
settings for the optimiser, epochs, mini-batches, clip range, KL coefficient and score transform); what they add is
their advantage, from the other responses to the same query (GRPO, RLOO) or from the whole batch (REINFORCE++), with
no critic. The maths is in :mod:`marllm.algorithms.critic_free`.
"""

from __future__ import annotations

from typing import Any, Unpack

import torch
from tianshou.data import Batch

from marllm.algorithms.algorithm_options import AlgorithmOptions
from marllm.algorithms.construction import construct
from marllm.algorithms.core import masked_mean
from marllm.algorithms.critic_free import (
    aggregation_weights,
    clipped_policy_gradient_loss,
    constant_group_fraction,
    grpo_kl_penalised_advantages,
    kl_penalty,
    per_token,
    reinforce_plus_plus_advantages,
    rloo_advantages,
)
from marllm.algorithms.critic_free_config import COMPARES_GROUPS, VARIANTS, CriticFreeConfig
from marllm.algorithms.learner_arguments import LearnerArguments
from marllm.algorithms.policy_gradient import PolicyGradientLearner

__all__ = ["VARIANTS", "CriticFreeLearner"]


class CriticFreeLearner(PolicyGradientLearner):
    """A GRPO, RLOO or REINFORCE++ learner: the clipped policy gradient with a group or batch baseline, no critic.

    Args:
        name: the learner id (metric prefix).
        algorithm: ``"grpo"``, ``"rloo"`` or ``"reinforce_pp"``.
        group_size: responses per query in a batch (the env's ``group_size``: consecutive dialogues share a query).
            GRPO and RLOO compare the responses of a group and need at least 2; REINFORCE++ ignores groups.
        settings: where the KL goes, its estimator, the loss aggregation and GRPO's std scaling (None:
            :class:`CriticFreeConfig`'s defaults).
        actions: how the learner acts, any mode (see :class:`PolicyGradientLearner`).
        normalization: the ``score`` mode's normalisation of move scores (see :class:`PolicyGradientLearner`).
        **learner_kwargs: :class:`PolicyGradientLearner`'s other arguments (:class:`LearnerArguments`: ``model``,
            ``tokenizer``, ``reference``, ``config``, ``generation``, ``seed``, ``adapter``, ``kl_controller``,
            ``placement``). ``config`` holds the optimiser, epoch, mini-batch, clip-range, KL-coefficient and
            score-transform settings, which it shares with PPO (its value-function settings are not used);
            data-parallel, each rank's slice of the batch must hold whole groups.

    Everything after ``name`` is keyword-only.
    """

    variant: str = "grpo"
    """The advantage a subclass named by reference (``agents.algorithm: my_file.py:MyLearner``) computes, one of
    :data:`VARIANTS`: a catalog name says it itself."""

    def __init__(
        self,
        name: str,
        *,
        algorithm: str = "grpo",
        group_size: int = 1,
        settings: CriticFreeConfig | None = None,
        actions: str = "generate",
        normalization: str | None = None,
        **learner_kwargs: Unpack[LearnerArguments],
    ):
        if algorithm not in VARIANTS:
            raise ValueError(f"a critic-free learner's algorithm must be one of {list(VARIANTS)}, got {algorithm!r}")
        if algorithm in COMPARES_GROUPS and group_size < 2:
            raise ValueError(
                f"{algorithm} compares the responses to the same query: it needs env.group_size >= 2, got {group_size}"
            )
        super().__init__(name, actions=actions, normalization=normalization, **learner_kwargs)
        self.algorithm = algorithm
        self.group_size = group_size
        self.settings = settings or CriticFreeConfig()

    @classmethod
    def from_options(
        cls, learner_id: str, algorithm: str, options: AlgorithmOptions, **learner_kwargs: Any
    ) -> CriticFreeLearner:
        """The ``algorithm`` learner ``learner_id`` with the options' group size, critic-free settings and action
        mode (the algorithm catalog's builder); a class named by reference computes its :attr:`variant`."""
        arguments = {
            "algorithm": algorithm if algorithm in VARIANTS else cls.variant,
            "group_size": options.group_size,
            "settings": options.critic_free,
            "actions": options.actions,
            "normalization": options.action_normalization,
            **learner_kwargs,
        }
        return construct(cls, learner_id, **arguments)  # checked against the constructor before it is called

    def _advantages(self, b: Batch, scores: torch.Tensor, kl_coef: float) -> dict[str, torch.Tensor]:
        """``advantages`` and ``returns`` (B, L) and, for GRPO and RLOO, the ``outcome`` (B,) they compare."""
        if "turn_scores" in b:
            raise ValueError(
                f"learner {self.name!r} ({self.algorithm}): game.history: sequence trains with ppo (GAE across a "
                "seat's turns); the critic-free learners take one outcome per response: use game.history: prompt"
            )
        kl_in_reward = self.settings.kl_in == "reward"
        if self.algorithm == "reinforce_pp":
            # Hu (2025): token rewards (the score at the last token, −η·KL at every token), returns-to-go with
            # γ = 1, normalised over every response token of the batch: the batch is the baseline.
            kl = b.kl if kl_in_reward else torch.zeros_like(b.kl)
            advantages, returns = reinforce_plus_plus_advantages(
                scores, kl, b.mask, kl_coef, all_reduce=self._all_reduce()
            )
            return {"advantages": advantages, "returns": returns}
        if len(scores) % self.group_size:
            raise ValueError(
                f"learner {self.name!r} ({self.algorithm}): a batch of {len(scores)} responses is not whole groups of "
                f"{self.group_size}; set env.group_size to the learner's group size"
            )
        kl_sums = b.kl.sum(1) if kl_in_reward else torch.zeros_like(scores)
        outcome = scores - kl_coef * kl_sums  # the score, less the KL when it is in the reward
        if self.algorithm == "grpo":
            advantages = grpo_kl_penalised_advantages(
                scores, kl_sums, kl_coef, self.group_size, self.settings.scale_by_std
            )
        else:  # RLOO's baseline is linear in the reward: the KL in it needs no separate treatment
            advantages = rloo_advantages(outcome, self.group_size)
        # ``scores``: what the groups compare (groups/constant_fraction); ``returns``: the outcome, per token.
        return {"advantages": per_token(advantages, b.mask), "outcome": scores, "returns": per_token(outcome, b.mask)}

    def _advantage_stats(self, b: Batch) -> dict[str, float]:
        stats = {
            "returns/mean": masked_mean(b.returns, b.mask).item(),
            "advantages/abs_mean": masked_mean(b.advantages.abs(), b.mask).item(),
        }
        if self.algorithm in COMPARES_GROUPS:
            stats["groups/constant_fraction"] = constant_group_fraction(b.outcome, self.group_size)
        return stats

    def _controlled_kl(self, b: Batch) -> float:
        """With the KL in the loss, the loss's estimator of the rollout's KL (what the penalty bounds)."""
        if self.settings.kl_in == "reward":
            return super()._controlled_kl(b)
        per_token = kl_penalty(b.logprobs, b.ref_logprobs, b.mask, self.settings.kl_estimator)  # (B, L)
        return per_token.sum(1).mean().item()

    def _objective(
        self, mb: Batch, logprobs: torch.Tensor, values: torch.Tensor | None, kl_coef: float
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped surrogate aggregated by ``critic_free.loss_aggregation``, plus η × the KL estimator where
        ``critic_free.kl_in`` is ``loss``."""
        kl_in_loss = self.settings.kl_in == "loss"
        result = clipped_policy_gradient_loss(
            logprobs,
            mb.logprobs,
            mb.advantages,
            mb.mask,
            self.config.clip_range,
            self.settings.loss_aggregation,
            ref_logprobs=mb.ref_logprobs if kl_in_loss else None,
            kl_coef=kl_coef if kl_in_loss else 0.0,
            kl_estimator=self.settings.kl_estimator,
        )
        parts = {
            "loss/policy": result.pg_loss.item(),
            "loss/kl": result.kl_loss.item(),
            "loss/total": result.loss.item(),
            "clipfrac": result.clipfrac.item(),
            "approx_kl": result.approx_kl.item(),
        }
        return result.loss, parts

    def _sample_masses(self, mask: torch.Tensor) -> torch.Tensor:
        # The loss aggregation's weight of each response: its tokens for a token mean, 1 for a mean over responses
        # (0 for an empty one).
        return aggregation_weights(mask, self.settings.loss_aggregation).sum(1)
