"""Learners of the critic-free policy-gradient family: GRPO, RLOO and REINFORCE++.

They act, keep rollouts, clip and step exactly as :class:`~marllm.algorithms.ppo.PPOLearner` does (and take its
``ppo`` settings for the optimiser, epochs, mini-batches, clip range, KL coefficient and score transform); they differ
in what they train towards: no value head, and an advantage from the other responses to the same query (GRPO,
RLOO) or from the whole batch (REINFORCE++). The math is in :mod:`marllm.algorithms.critic_free`.
"""

from __future__ import annotations

from typing import Any, Unpack

import torch
from tianshou.data import Batch

from marllm.algorithms.catalog import AlgorithmOptions, compares_groups
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
from marllm.algorithms.critic_free_config import CriticFreeConfig
from marllm.algorithms.learner_arguments import LearnerArguments
from marllm.algorithms.ppo import PPOLearner
from marllm.algorithms.rollout import UpdateBatch

VARIANTS = ("grpo", "rloo", "reinforce_pp")
"""The advantages :class:`CriticFreeLearner` computes (the catalog names that build it)."""


class CriticFreeLearner(PPOLearner):
    """A GRPO, RLOO or REINFORCE++ learner: :class:`PPOLearner` without a value head and with another advantage.

    Args:
        name: the learner id (metric prefix).
        algorithm: ``"grpo"``, ``"rloo"`` or ``"reinforce_pp"``.
        group_size: responses per query in a batch (the env's ``group_size``: consecutive dialogues share a query).
            GRPO and RLOO compare the responses of a group and need at least 2; REINFORCE++ ignores groups.
        settings: where the KL goes, its estimator, the loss aggregation and GRPO's std scaling (None:
            :class:`CriticFreeConfig`'s defaults).
        actions: how the learner acts, any mode (see :class:`PPOLearner`).
        normalization: the ``score`` mode's normalisation of move scores (see :class:`PPOLearner`).
        **learner_kwargs: :class:`PPOLearner`'s other arguments (:class:`LearnerArguments`: ``model``,
            ``tokenizer``, ``reference``, ``config``, ``generation``, ``seed``, ``adapter``, ``kl_controller``,
            ``data_parallel``). ``config`` holds the optimiser, epoch, mini-batch, clip-range, KL-coefficient and
            score-transform settings, which it shares with PPO (its value-function settings are not used);
            data-parallel, each rank's slice of the batch must hold whole groups.

    Everything after ``name`` is keyword-only.
    """

    uses_critic = False
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
        if compares_groups(algorithm) and group_size < 2:
            raise ValueError(
                f"{algorithm} compares the responses to the same query: it needs env.group_size >= 2, got "
                f"{group_size}"
            )
        super().__init__(name, actions=actions, normalization=normalization, **learner_kwargs)
        self.algorithm = algorithm
        self.group_size = group_size
        self.settings = settings or CriticFreeConfig()
        self._kl_coef = 0.0  # η of the update in progress, for the KL term of the loss

    @classmethod
    def from_options(
        cls, learner_id: str, algorithm: str, options: AlgorithmOptions, **learner_kwargs: Any
    ) -> CriticFreeLearner:
        """The ``algorithm`` learner ``learner_id`` with the options' group size, critic-free settings and action
        mode (the algorithm catalog's builder); a class named by reference computes its :attr:`variant`."""
        return cls(
            learner_id,
            algorithm=algorithm if algorithm in VARIANTS else cls.variant,
            group_size=options.group_size,
            settings=options.critic_free,
            actions=options.actions,
            normalization=options.action_normalization,
            **learner_kwargs,
        )

    def _advantages(self, b: Batch, scores: torch.Tensor, kl_coef: float) -> dict[str, torch.Tensor]:
        """``advantages`` and ``returns`` (B, L) and, for GRPO and RLOO, the ``outcome`` (B,) they compare."""
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
        if compares_groups(self.algorithm):
            stats["groups/constant_fraction"] = constant_group_fraction(b.outcome, self.group_size)
        return stats

    def _controlled_kl(self, b: Batch) -> float:
        """With the KL in the loss, the loss's estimator of the rollout's KL (what the penalty bounds)."""
        if self.settings.kl_in == "reward":
            return super()._controlled_kl(b)
        per_token = kl_penalty(b.logprobs, b.ref_logprobs, b.mask, self.settings.kl_estimator)  # (B, L)
        return per_token.sum(1).mean().item()

    def _ppo_steps(self, data: UpdateBatch, losses: dict[str, list[float]]) -> None:
        self._kl_coef = data.kl_coef
        super()._ppo_steps(data, losses)

    def _objective(
        self, mb: Batch, logprobs: torch.Tensor, values: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        kl_in_loss = self.settings.kl_in == "loss"
        result = clipped_policy_gradient_loss(
            logprobs,
            mb.logprobs,
            mb.advantages,
            mb.mask,
            self.config.clip_range,
            self.settings.loss_aggregation,
            ref_logprobs=mb.ref_logprobs if kl_in_loss else None,
            kl_coef=self._kl_coef if kl_in_loss else 0.0,
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
