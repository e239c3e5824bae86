"""PPO's objective as pure functions of their inputs: the targets an update trains towards (:func:`ppo_targets`),
the loss of a mini-batch of token-level answers (:func:`token_loss`: the policy's forward over prompt and response)
and PPO's clipped loss on the log-probs and values it gives (:func:`ppo_objective`). The maths they compose is in
:mod:`marllm.algorithms.core`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from marllm.algorithms.core import (
    clipped_policy_loss,
    clipped_value_loss,
    explained_variance,
    floor_logprobs,
    gae,
    logprobs_and_entropy,
    masked_mean,
    masked_whiten,
    token_rewards,
)
from marllm.models.devices import autocast_for
from marllm.models.generation import logprob_logits
from marllm.models.move_tries import restrict_logits
from marllm.models.prefix_forward import shared_prefix_response_forward

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from marllm.algorithms.ppo_config import GenerationConfig, PPOConfig
    from marllm.models.policy import ValueHead

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


def token_loss(
    mb: Any,
    prompt_length: int,
    *,
    model: PreTrainedModel,
    value_head: ValueHead | None,
    generation: GenerationConfig,
    eos_token_id: int | None,
    autocast_dtype: str | None,
    objective: Objective,
) -> tuple[torch.Tensor, dict[str, float]]:
    """A mini-batch's loss and its parts: ``objective`` of the log-probs (and values) of its responses under
    ``model`` now, with the mean ``entropy`` and ``ratio`` π/π_old over its response tokens added to the parts.

    The log-probs are those of the distribution sampled (``generation``'s processing; constrained answers'
    restriction, ``mb.allowed``, re-applied), floored where the updated policy's top-k/top-p no longer keeps a token.
    """
    with autocast_for(model, autocast_dtype):  # the forward only: the backward follows its dtypes
        logits, values = shared_prefix_response_forward(
            model, mb.input_ids, mb.attention_mask, prompt_length, value_head
        )
    if "allowed" in mb:  # constrained answers: the restriction they were sampled under, re-applied
        logits = restrict_logits(logits, mb.allowed, inplace=True)
    # The LM head's backward does not read its output: the gradient can take the logits' place.
    sequences = (mb.input_ids, mb.attention_mask, prompt_length)
    logits = logprob_logits(logits, *sequences, generation, eos_token_id, overwrite_logits=True)
    # One pass over the logits for both. Nothing but the log-probs' backward reads the logits after this, so it
    # writes their gradient over them: one (b, L, V) buffer for the forward and the backward.
    logprobs, token_entropy = logprobs_and_entropy(logits, mb.response, overwrite_logits=True)
    del logits
    # With logprobs_from="sampling" a token the updated policy's top-k/top-p no longer keeps has log-prob −inf.
    logprobs = floor_logprobs(logprobs)
    loss, parts = objective(mb, logprobs, values)
    with torch.no_grad():
        parts["entropy"] = masked_mean(token_entropy, mb.mask).item()
        parts["ratio"] = masked_mean(torch.exp(logprobs - mb.logprobs), mb.mask).item()
    return loss, parts


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
