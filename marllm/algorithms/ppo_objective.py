"""PPO's objective as pure functions of their inputs: the targets an update trains towards (:func:`ppo_targets`) and
PPO's clipped loss on the log-probs and values that an action mode's re-scoring of a mini-batch gives
(:func:`ppo_objective`; :meth:`~marllm.algorithms.actions.base.Collector.rescore`). The maths they compose is in
:mod:`marllm.algorithms.core`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from marllm.algorithms.core import (
    clipped_policy_loss,
    clipped_value_loss,
    explained_variance,
    gae,
    masked_mean,
    masked_whiten,
    token_rewards,
)

if TYPE_CHECKING:

    from marllm.algorithms.ppo_config import PPOConfig

Objective = Callable[[Any, torch.Tensor, "torch.Tensor | None"], tuple[torch.Tensor, dict[str, float]]]
"""``objective(mini_batch, logprobs, values) -> (loss, parts)``: an algorithm's loss of a mini-batch from the
updated policy's log-probs (b, L) of its responses and its values (b, L), or None without a value head."""


def ppo_targets(
    b: Any,
    scores: torch.Tensor,
    kl_coef: float,
    config: PPOConfig,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """PPO's columns for a rollout's tensors ``b``, from its (transformed) scores (B,) and η: token ``rewards`` (the
    score at the last response token, −η·KL at every token), GAE ``advantages`` and ``returns`` against the value
    head's ``b.values`` (Schulman et al., 2016), the advantages whitened over the batch's response tokens if
    ``config.whiten_advantages`` (data-parallel, over the global batch: ``all_reduce`` sums over the ranks)."""
    rewards = token_rewards(scores, b.kl, b.mask, kl_coef)
    advantages, returns = gae(rewards, b.values, b.mask, config.gamma, config.lam)
    if config.whiten_advantages:
        advantages = masked_whiten(advantages, b.mask, all_reduce=all_reduce)
    return {"rewards": rewards, "advantages": advantages, "returns": returns}


def ppo_target_stats(b: Any) -> dict[str, float]:
    """The mean return and value over the response tokens of ``b``, and how much of the returns' variance the values
    explain."""
    return {
        "returns/mean": masked_mean(b.returns, b.mask).item(),
        "values/mean": masked_mean(b.values, b.mask).item(),
        "explained_variance": explained_variance(b.values, b.returns, b.mask),
    }


def ppo_objective(
    mb: Any, logprobs: torch.Tensor, values: torch.Tensor | None, config: PPOConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's loss of a mini-batch: the clipped surrogate plus ``vf_coef`` × the clipped value loss, and its parts."""
    pg_loss, clipfrac, approx_kl = clipped_policy_loss(logprobs, mb.logprobs, mb.advantages, mb.mask, config.clip_range)
    assert values is not None  # uses_critic
    v_loss, v_clipfrac = clipped_value_loss(values.float(), mb.values, mb.returns, mb.mask, config.clip_range_value)
    loss = pg_loss + config.vf_coef * v_loss
    parts = {
        "loss/policy": pg_loss.item(),
        "loss/value": v_loss.item(),
        "loss/total": loss.item(),
        "clipfrac": clipfrac.item(),
        "value_clipfrac": v_clipfrac.item(),
        "approx_kl": approx_kl.item(),
    }
    return loss, parts
