"""Token-level math of RLHF-style PPO as small pure functions over padded (B, T) tensors.

Every function takes a ``mask`` (1 for a real response token, 0 for padding) so that padded positions never leak
into a mean, a variance, a bootstrap value or a loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1."""
    return (values * mask).sum() if dim is None else (values * mask).sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is 1 (0 where the mask is empty)."""
    total = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(values, mask, dim) / total.clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over the masked positions (Bessel-corrected by default)."""
    mean = masked_mean(values, mask)
    squared = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        if count < 2:
            return torch.zeros_like(squared)
        squared = squared * count / (count - 1)
    return squared


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise to zero mean and unit variance over the masked positions; padding is returned as 0."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask


def logprobs_of(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log π(token_t | ·) for each position: (B, T, V) logits and (B, T) tokens -> (B, T)."""
    return torch.gather(F.log_softmax(logits.float(), dim=-1), 2, tokens.unsqueeze(-1)).squeeze(-1)


def entropy_of(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position: (B, T, V) -> (B, T)."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def full_kl(policy_logits: torch.Tensor, reference_logits: torch.Tensor) -> torch.Tensor:
    """KL(π ‖ π_0) over the whole vocabulary at each position: (B, T, V) x2 -> (B, T).

    This is the KL the CORY paper plots (summed over the response, averaged over the batch).
    """
    logp = F.log_softmax(policy_logits.float(), dim=-1)
    logq = F.log_softmax(reference_logits.float(), dim=-1)
    return (logp.exp() * (logp - logq)).sum(-1)


def logprobs_and_full_kl(
    policy_logits: torch.Tensor, reference_logits: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """log π(token), log π_0(token) and the full-vocabulary KL at each position, with one log-softmax per model.

    Same values as :func:`logprobs_of` twice and :func:`full_kl`, at half the vocabulary-wide work.
    """
    logp = F.log_softmax(policy_logits.float(), dim=-1)  # (B, T, V)
    logq = F.log_softmax(reference_logits.float(), dim=-1)
    index = tokens.unsqueeze(-1)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    return torch.gather(logp, 2, index).squeeze(-1), torch.gather(logq, 2, index).squeeze(-1), kl


def sampled_kl(logprobs: torch.Tensor, reference_logprobs: torch.Tensor) -> torch.Tensor:
    """The k1 estimator of KL(π ‖ π_0) from the sampled token: log π(a) − log π_0(a).

    Unbiased for the KL, one forward of each model, and negative for single tokens; the RLHF reward shaping of
    Ziegler et al. (2019) and the CORY paper's code use it per token.
    """
    return logprobs - reference_logprobs


def token_rewards(scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """Per-token reward r̂_t = −η·KL_t, plus the sequence score on the last real response token.

    ``scores`` (B,), ``kl`` and ``mask`` (B, T). Sequences with no response token get no reward at all.
    """
    rewards = -kl_coef * kl * mask
    lengths = mask.sum(1).long()
    has_tokens = lengths > 0
    last = (lengths - 1).clamp(min=0)
    rows = torch.arange(scores.shape[0], device=scores.device)
    rewards[rows[has_tokens], last[has_tokens]] += scores[has_tokens].to(rewards.dtype)
    return rewards


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al., 2016) over right-padded responses.

    δ_t = r_t + γ·V_{t+1}·m_{t+1} − V_t and A_t = δ_t + γλ·m_{t+1}·A_{t+1}: the episode ends at the last real token,
    so nothing is bootstrapped from padding. Returns (advantages, returns = advantages + values), both 0 on padding.
    """
    batch, length = rewards.shape
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros(batch, dtype=rewards.dtype, device=rewards.device)
    for t in reversed(range(length)):
        if t + 1 < length:
            next_mask = mask[:, t + 1]
            next_values = values[:, t + 1] * next_mask
        else:
            next_mask = torch.zeros_like(lastgaelam)
            next_values = torch.zeros_like(lastgaelam)
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        lastgaelam = delta + gamma * lam * next_mask * lastgaelam
        advantages[:, t] = lastgaelam
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate (Schulman et al., 2017): mean of max(−A·ρ, −A·clip(ρ, 1±ε)).

    Returns (pg_loss, clipfrac, approx_kl) with approx_kl = ½·E[(log ρ)²] as a monitor of the policy change.
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    pg_losses = -advantages * ratio
    pg_losses_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    pg_loss = masked_mean(torch.max(pg_losses, pg_losses_clipped), mask)
    clipfrac = masked_mean((pg_losses_clipped > pg_losses).float(), mask)
    approx_kl = 0.5 * masked_mean(log_ratio**2, mask)
    return pg_loss, clipfrac, approx_kl


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range_value: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss: ½·mean(max((V − R)², (V_old + clip(V − V_old, ±ε_v) − R)²)).

    The value prediction may move at most ε_v from the rollout's value per update, as in the PPO reference code.
    Returns (v_loss, value clip fraction).
    """
    v_clipped = old_values + torch.clamp(values - old_values, -clip_range_value, clip_range_value)
    v_loss_unclipped = (values - returns) ** 2
    v_loss_clipped = (v_clipped - returns) ** 2
    v_loss = 0.5 * masked_mean(torch.max(v_loss_unclipped, v_loss_clipped), mask)
    v_clipfrac = masked_mean((v_loss_clipped > v_loss_unclipped).float(), mask)
    return v_loss, v_clipfrac


def explained_variance(predicted: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> float:
    """1 − Var[target − predicted] / Var[target] over masked positions (nan when the target is constant)."""
    var_target = masked_var(target, mask)
    if var_target == 0:
        return float("nan")
    return float(1.0 - masked_var(target - predicted, mask) / var_target)
