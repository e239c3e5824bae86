"""Math of the critic-free policy-gradient family (GRPO, Dr. GRPO, RLOO, REINFORCE++) as small pure functions.

None of these methods trains a value model: the baseline of a response comes from the other responses sampled for
the same query (GRPO, RLOO) or from the whole batch (REINFORCE++). The functions here turn outcome rewards into
per-token advantages, compute the per-token KL penalty to the reference model, and aggregate PPO's clipped surrogate
over padded (B, L) responses. Like :mod:`marllm.algorithms.core`, every token-level function takes a ``mask``
(1 for a real response token, 0 for padding; responses are right-padded) and padding never contributes.

Group layout: the B responses of a batch come in B / G consecutive groups of G responses to the same query,
response ``i`` in group ``i // G`` — the order that ``generate(..., num_return_sequences=G)`` and
``repeat_interleave(G)`` of the prompts produce. The group functions reshape (B,) to (B / G, G) and refuse a B
that G does not divide.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import torch

from marllm.algorithms.core import clipped_policy_loss, gae, masked_mean, masked_whiten, sampled_kl, token_rewards

KLEstimator = Literal["k1", "k2", "k3"]
LOG_RATIO_BOUND = 20.0  # verl's clamp of log π_ref/π before k3's exponential; k2's square too
K3_BOUND = 10.0  # and of the k3 estimate
LossAggregation = Literal["token-mean", "seq-mean-token-mean"]


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) outcome rewards -> (B / G, G), one row per query, in a floating dtype."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be one outcome reward per response, shape (B,); got {tuple(rewards.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be at least 1, got {group_size}")
    if rewards.numel() % group_size:
        raise ValueError(
            f"a batch of {rewards.numel()} responses cannot be split into groups of group_size={group_size}: "
            "the batch must hold whole groups (B = number of queries × G, consecutive responses per query)"
        )
    if not rewards.is_floating_point():
        rewards = rewards.float()
    return rewards.view(-1, group_size)


def _constant_groups(grouped: torch.Tensor) -> torch.Tensor:
    """(n, G) -> (n, 1) bool: True for a group whose rewards are all equal (every group of one response)."""
    return (grouped == grouped[:, :1]).all(dim=1, keepdim=True)


def constant_group_fraction(rewards: torch.Tensor, group_size: int) -> float:
    """The share of groups whose rewards are all equal: their advantages are all zero (no learning signal)."""
    return _constant_groups(_grouped(rewards, group_size)).float().mean().item()


def grpo_advantages(
    rewards: torch.Tensor, group_size: int, scale_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO's outcome advantage: (r_i − mean(group)) / (std(group) + eps), one value per response, (B,) -> (B,).

    Shao et al. (2024, DeepSeekMath, §4.1.2, "outcome supervision") normalise each reward by the mean and standard
    deviation of the G rewards sampled for its query. ``scale_by_std=False`` keeps only the mean-centring, as Dr.
    GRPO (Liu et al., 2025, "Understanding R1-Zero-Like Training") recommends: dividing by the std up-weights
    queries that are nearly always or nearly never solved.

    The std is the sample standard deviation (ddof = 1, Bessel-corrected): ``torch.std``'s default, which TRL's and
    verl's GRPO call; the paper does not say which. Against the population std (ddof = 0) it only rescales every
    advantage by sqrt((G − 1) / G) for a given G (rewards {0, 1} with G = 2 give ±0.71 instead of ±1).
    ``eps`` guards the division; a group whose rewards are all equal — every group of one response included — gets
    exactly 0 (it carries no signal about which response is better), never a rounding residue or a NaN.
    """
    grouped = _grouped(rewards, group_size)  # (n, G)
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # (n, G)
    if scale_by_std:
        std = (centred.square().sum(dim=1, keepdim=True) / max(group_size - 1, 1)).sqrt()  # (n, 1), ddof = 1
        centred = centred / (std + eps)
    return torch.where(_constant_groups(grouped), 0.0, centred).reshape(-1)  # (B,)


def grpo_kl_penalised_advantages(
    scores: torch.Tensor,
    kl_sums: torch.Tensor,
    kl_coef: float,
    group_size: int,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO's advantage with the KL penalty in the reward, (B,), (B,) -> (B,).

    The task ``scores`` are normalised per group (:func:`grpo_advantages`), then the penalty −η·ΣKL is added,
    centred on its group mean (the group is the baseline of the whole reward) but never divided by the scores'
    std. Normalising score − η·ΣKL together would make the penalty's size depend on the scores' spread: a group
    whose scores are all equal (all solved, all failed) would get a full-size advantage made of KL alone,
    whatever η is. As OpenRLHF's group normalisation does, only the task score is normalised.
    """
    kl_grouped = _grouped(kl_sums, group_size)  # (n, G)
    kl_centred = (kl_grouped - kl_grouped.mean(dim=1, keepdim=True)).reshape(-1)  # (B,)
    return grpo_advantages(scores, group_size, scale_by_std, eps) - kl_coef * kl_centred


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO's advantage: r_i minus the mean of the other G − 1 rewards of its group, (B,) -> (B,).

    Ahmadian et al. (2024, "Back to Basics"; after Kool et al., 2019): the leave-one-out baseline does not
    depend on the response it is subtracted from, so the gradient estimate stays unbiased; it equals
    G / (G − 1) · (r_i − mean(group)), and a group's advantages sum to 0. A group of equal rewards gets exactly 0.
    """
    if group_size < 2:
        raise ValueError(
            f"RLOO needs at least 2 responses per query (group_size={group_size}): the baseline of a response is the "
            "mean of the other G − 1 rewards of its group"
        )
    grouped = _grouped(rewards, group_size)  # (n, G)
    others_mean = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)  # (n, G)
    return torch.where(_constant_groups(grouped), 0.0, grouped - others_mean).reshape(-1)  # (B,)


def per_token(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Give every real token of a response its response's advantage: (B,) and (B, L) mask -> (B, L), 0 on padding.

    GRPO's outcome supervision sets Â_{i,t} = r̃_i for all tokens t of response i (Shao et al., 2024, §4.1.2).
    """
    return advantages.unsqueeze(1) * mask.to(advantages.dtype)  # (B, 1) * (B, L)


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, estimator: KLEstimator = "k3"
) -> torch.Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from the sampled tokens: (B, L) x3 -> (B, L), 0 on padding.

    With x = log π_ref(a) − log π(a) for a token a drawn from π (Schulman, "Approximating KL Divergence", 2020):

    - ``"k1"``: −x = log π(a) − log π_ref(a), unbiased but negative for some tokens. It is the form used when the
      KL goes into the reward (Ziegler et al., 2019; REINFORCE++); as a loss its expected gradient is 0.
    - ``"k2"``: ½·x² ≥ 0, biased but low-variance. As a loss, its gradient with respect to the policy's parameters
      is, in expectation over a ~ π, the gradient of KL(π ‖ π_ref): the KL the penalty is meant to bound.
    - ``"k3"``: exp(x) − x − 1 ≥ 0, unbiased with lower variance; the KL loss term of GRPO (Shao et al., 2024,
      eq. 4). Its gradient with respect to log π is 1 − π_ref/π, whose expectation over a ~ π is the gradient of
      KL(π_ref ‖ π), the reverse KL, not of the KL it estimates.

    Padded positions are set to x = 0 before any arithmetic, so garbage there (−inf, NaN) reaches neither the value
    nor the gradient. For k3, as verl does, x is clamped to ±20 and the estimate to at most 10: a log-prob floored
    by :func:`marllm.algorithms.core.floor_logprobs` would otherwise give exp(x) up to 1e37 and a gradient as large.
    For k2 x is clamped to ±20 as well (an estimate of at most 200): a floored log-prob, which has no gradient, would
    otherwise report thousands per token.
    """
    valid = mask.bool()
    if estimator == "k1":
        return torch.where(valid, sampled_kl(logprobs, ref_logprobs), 0.0)
    log_ratio = torch.where(valid, ref_logprobs - logprobs, 0.0)  # x = log π_ref/π, (B, L)
    log_ratio = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        # expm1(x) − x: the same exp(x) − 1 − x without the cancellation of exp(x) − 1 near x = 0; the lower clamp
        # only removes a rounding residue below 0.
        return (torch.expm1(log_ratio) - log_ratio).clamp(min=0.0, max=K3_BOUND)
    raise ValueError(f"unknown KL estimator {estimator!r}: expected 'k1', 'k2' or 'k3'")


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """G_t = Σ_{k ≥ t} γ^{k−t} r_k over the real tokens of each right-padded response: (B, L) -> (B, L).

    With γ = 1 this is the reverse cumulative sum of the token rewards. 0 on padding; rewards on padding are ignored.
    """
    return gae(rewards * mask, torch.zeros_like(rewards), mask, gamma, 1.0)[0]


def reinforce_plus_plus_advantages(
    scores: torch.Tensor,
    kl: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    gamma: float = 1.0,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu, 2025): token returns of KL-shaped rewards, whitened over the batch, with no critic.

    ``scores`` (B,) are the task rewards, ``kl`` (B, L) a per-token KL estimate (k1 in the paper:
    :func:`kl_penalty` with ``"k1"``) and ``mask`` (B, L). The token reward is −β·KL_t at every token plus the score
    at the last real token (:func:`marllm.algorithms.core.token_rewards`), its return the sum of the future token
    rewards (:func:`discounted_returns`, γ = 1 by default), and the advantage that return normalised by the mean and
    (Bessel-corrected) std over all real tokens of the batch (:func:`marllm.algorithms.core.masked_whiten`).
    ``all_reduce`` (a sum over data-parallel ranks) whitens over the batch of every rank.
    Returns (advantages, returns), both (B, L) and 0 on padding.
    """
    rewards = token_rewards(scores, kl, mask, kl_coef)  # (B, L)
    returns = discounted_returns(rewards, mask, gamma)  # (B, L)
    return masked_whiten(returns, mask, all_reduce=all_reduce), returns


def aggregation_weights(mask: torch.Tensor, mode: LossAggregation = "token-mean") -> torch.Tensor:
    """Per-token weights w such that masked_mean(x, w) = Σ w·x / Σ w is the chosen loss aggregation: (B, L).

    - ``"token-mean"``: w = mask, the mean over all real tokens of the batch, so every token weighs the same and a
      long response weighs more (DAPO, Yu et al., 2025, §3.3 "token-level policy gradient loss"; PPO in core.py).
    - ``"seq-mean-token-mean"``: w = mask / L_i, the mean over each response's tokens, then over the responses with
      at least one real token, so every response weighs the same (the 1/G Σ_i 1/|o_i| Σ_t of GRPO, Shao et al.,
      2024, eq. 3). A response with no real token gets weight 0 and does not count among the responses.

    Σ w (the token count, or the count of non-empty responses) is what micro-batches must be weighted by when their
    losses are accumulated into one step.
    """
    weights = mask if mask.is_floating_point() else mask.float()  # (B, L)
    if mode == "token-mean":
        return weights
    if mode == "seq-mean-token-mean":
        return weights / weights.sum(dim=1, keepdim=True).clamp(min=1)  # (B, L) / (B, 1)
    raise ValueError(f"unknown loss aggregation {mode!r}: expected 'token-mean' or 'seq-mean-token-mean'")


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: LossAggregation = "token-mean") -> torch.Tensor:
    """Aggregate per-token ``values`` (B, L) into a scalar by ``mode`` (see :func:`aggregation_weights`); 0 if empty."""
    return masked_mean(values, aggregation_weights(mask, mode))


class PolicyLoss(NamedTuple):
    """The terms of :func:`clipped_policy_gradient_loss`, each a scalar tensor."""

    loss: torch.Tensor  # pg_loss + kl_coef · kl_loss: the one to backpropagate
    pg_loss: torch.Tensor  # the aggregated clipped surrogate
    kl_loss: torch.Tensor  # the aggregated per-token KL penalty (0 without reference log-probs)
    clipfrac: torch.Tensor  # share of the (aggregation-weighted) tokens where the clipped term was chosen
    approx_kl: torch.Tensor  # ½·E[(log π − log π_old)²], a monitor of the policy change


def clipped_policy_gradient_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float,
    loss_agg_mode: LossAggregation = "token-mean",
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
) -> PolicyLoss:
    """PPO's clipped surrogate with critic-free advantages, aggregated by ``loss_agg_mode``, plus a KL loss term.

    All tensors (B, L). Per token, with ρ = exp(log π − log π_old), the loss is max(−A·ρ, −A·clip(ρ, 1 ± ε)), as in
    :func:`marllm.algorithms.core.clipped_policy_loss`, which computes it here with the weights of
    :func:`aggregation_weights` as its mask (so clipfrac and approx_kl are aggregated the same way as the loss). With
    ``ref_logprobs``, ``kl_coef`` · the same aggregation of :func:`kl_penalty` is added, as in GRPO's objective
    (Shao et al., 2024, eq. 3: the β·D_KL term sits inside the per-token mean). When the KL is already in the
    reward (REINFORCE++), leave ``ref_logprobs`` out.

    Padded positions are replaced by finite values (ratio 1, advantage 0) before any arithmetic, so they reach
    neither the loss nor its gradient whatever they hold.
    """
    if ref_logprobs is None and kl_coef != 0.0:
        raise ValueError(f"kl_coef={kl_coef} needs ref_logprobs to compute the KL loss term")
    valid = mask.bool()
    logprobs = torch.where(valid, logprobs, 0.0)
    old_logprobs = torch.where(valid, old_logprobs, 0.0)
    advantages = torch.where(valid, advantages, 0.0)
    weights = aggregation_weights(mask.to(logprobs.dtype), loss_agg_mode)  # (B, L)
    pg_loss, clipfrac, approx_kl = clipped_policy_loss(logprobs, old_logprobs, advantages, weights, clip_range)
    if ref_logprobs is None:
        kl_loss = torch.zeros_like(pg_loss)
    else:
        kl_loss = masked_mean(kl_penalty(logprobs, ref_logprobs, mask, kl_estimator), weights)
    return PolicyLoss(pg_loss + kl_coef * kl_loss, pg_loss, kl_loss, clipfrac, approx_kl)
