"""Token-level math of RLHF-style PPO as small pure functions over padded (B, T) tensors, composed into the targets an
update trains towards (:func:`ppo_targets`) and PPO's clipped loss of a mini-batch (:func:`ppo_objective`).

Every function takes a ``mask`` (1 for a real response token, 0 for padding) so that padded positions never leak
into a mean, a variance, a bootstrap value or a loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from marllm.algorithms.ppo_config import PPOConfig


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1."""
    return (values * mask).sum() if dim is None else (values * mask).sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is 1 (0 where the mask is empty)."""
    total = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(values, mask, dim) / total.clamp(min=1)


def scalars(tensors: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """The values of named 0-dim floating-point tensors as floats, in one device→host copy instead of one
    ``.item()`` each: the stack promotes to the widest dtype, which holds each value exactly, so the floats are those
    ``.item()`` would give."""
    with torch.no_grad():
        values = torch.stack(list(tensors.values())).tolist()
    return dict(zip(tensors, values, strict=True))


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


def masked_whiten(
    values: torch.Tensor,
    mask: torch.Tensor,
    shift_mean: bool = True,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Normalise to zero mean and unit variance over the masked positions; padding is returned as 0.

    ``all_reduce`` (a sum over data-parallel ranks, e.g.
    :attr:`marllm.parallel.placement.DataParallel.sum_over_ranks`) takes the mean and variance over the masked
    positions of every rank's ``values``: the whole batch's moments.
    """
    if all_reduce is None:
        mean, var = masked_mean(values, mask), masked_var(values, mask)
    else:
        mean, var = _global_masked_moments(values, mask, all_reduce)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask


def _global_masked_moments(
    values: torch.Tensor, mask: torch.Tensor, all_reduce: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`masked_mean` and the Bessel-corrected :func:`masked_var` of the union of every rank's masked values,
    two passes as in one process (the mean first, then the squared deviations from it), summed in float64."""
    totals = all_reduce(torch.stack([masked_sum(values, mask), mask.sum()]).double())
    count = totals[1]
    mean = (totals[0] / count.clamp(min=1)).to(values.dtype)
    squared = all_reduce(masked_sum((values - mean) ** 2, mask).double().reshape(1))[0]
    var = squared / (count - 1) if count >= 2 else torch.zeros_like(squared)
    return mean, var.to(values.dtype)


# Vocabulary-wide math runs over slices of at most this many logits (16 MiB of float32 per temporary): a (B, T, V)
# log-softmax, its exp and their products at once would be several full copies of the logits.
_CHUNK_ELEMENTS = 1 << 20


def _positions(tensor: torch.Tensor) -> torch.Tensor:
    """(B, T, ...) -> (B·T, ...): one row per position, a view of a contiguous tensor."""
    return tensor.reshape(-1, *tensor.shape[2:])


def _chunks(rows: int, width: int) -> list[slice]:
    """Slices of ``rows`` positions of ``width`` logits each, at most ~``_CHUNK_ELEMENTS`` logits per slice."""
    step = max(1, _CHUNK_ELEMENTS // max(1, width))
    return [slice(start, start + step) for start in range(0, rows, step)]


def _plogp(logp: torch.Tensor) -> torch.Tensor:
    """p·log p with 0 where p = 0 (a token that top-k/top-p or EOS suppression removed has log p = −inf)."""
    return torch.where(torch.isneginf(logp), 0.0, logp.exp() * logp)


def _lse_gather_entropy(
    logits: torch.Tensor, tokens: torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """log Σ exp(logits), the token's logit and (optionally) the entropy at each position, in float32, by chunks."""
    flat, index = _positions(logits), tokens.reshape(-1, 1)  # (N, V), (N, 1)
    lse = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
    entropy = torch.empty_like(lse) if with_entropy else None
    for rows in _chunks(*flat.shape):
        chunk = flat[rows].float()  # (n, V)
        lse[rows] = torch.logsumexp(chunk, dim=-1)
        if entropy is not None:
            entropy[rows] = -_plogp(chunk - lse[rows].unsqueeze(-1)).sum(-1)
    picked = torch.gather(flat, 1, index).squeeze(-1).float()
    shape = tokens.shape
    return lse.view(shape), picked.view(shape), None if entropy is None else entropy.view(shape)


class _TokenLogprobs(torch.autograd.Function):
    """log softmax(logits)[token] with a backward that saves only the logits and the normaliser.

    Autograd through ``log_softmax`` + ``gather`` keeps the (B, T, V) log-softmax for the backward and builds two more
    (B, T, V) tensors in it (the scattered output gradient and the input gradient); here the backward writes the
    input gradient, softmax · (−g) + one-hot · g, chunk by chunk into one buffer: a new one, or with
    ``overwrite_logits`` the logits themselves.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, logits: torch.Tensor, tokens: torch.Tensor, with_entropy: bool, overwrite_logits: bool
    ):
        lse, picked, entropy = _lse_gather_entropy(logits, tokens, with_entropy)
        ctx.save_for_backward(logits, tokens, lse)
        ctx.overwrite_logits = overwrite_logits
        if entropy is None:
            entropy = torch.zeros_like(lse)
        ctx.mark_non_differentiable(entropy)
        return picked - lse, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logprobs: torch.Tensor, _grad_entropy: torch.Tensor):  # type: ignore[override]
        logits, tokens, lse = ctx.saved_tensors
        in_place = ctx.overwrite_logits and logits.is_contiguous()
        grad = logits if in_place else torch.empty_like(logits, memory_format=torch.contiguous_format)
        flat_logits, flat_grad = _positions(logits), _positions(grad)  # (N, V)
        index, g, lse = tokens.reshape(-1, 1), grad_logprobs.float().reshape(-1, 1), lse.reshape(-1, 1)
        for rows in _chunks(*flat_logits.shape):
            # Each chunk of logits is read (into a new tensor) before the same rows of ``grad`` are written.
            softmax = (flat_logits[rows].float() - lse[rows]).exp()  # (n, V)
            chunk = softmax.mul_(-g[rows])
            chunk.scatter_add_(1, index[rows], g[rows])
            flat_grad[rows] = chunk
        return grad, None, None, None


LOGPROB_FLOOR = math.log(torch.finfo(torch.float32).tiny)
"""≈ −87.3, the log of the smallest normal float32: what :func:`floor_logprobs` puts in place of −inf."""


def floor_logprobs(logprobs: torch.Tensor) -> torch.Tensor:
    """Raise −inf log-probs to :data:`LOGPROB_FLOOR`, leaving every finite value as it is.

    A token that top-k/top-p removed has log-prob −inf; PPO's ratio exp(log π − log π_old) and the k1 KL of two −inf
    log-probs would be NaN. Floored, the ratio is finite and negligible against any kept token's, and no gradient
    flows through a floored entry.
    """
    return torch.where(torch.isneginf(logprobs), LOGPROB_FLOOR, logprobs)


def logprobs_of(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log π(token_t | ·) for each position: (B, T, V) logits and (B, T) tokens -> (B, T), in float32.

    Differentiable with respect to ``logits``. The vocabulary-wide work runs in chunks of rows, so no float32
    (B, T, V) temporary is made; a token whose logit is −inf (removed by a logits processor) gets −inf.
    """
    return logprobs_and_entropy(logits, tokens, with_entropy=False)[0]


def logprobs_and_entropy(
    logits: torch.Tensor, tokens: torch.Tensor, with_entropy: bool = True, overwrite_logits: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(token) (differentiable) and the entropy of π (no gradient) at each position, from one pass over logits.

    (B, T, V) logits and (B, T) tokens -> two (B, T) float32 tensors; the entropy is zeros if ``with_entropy`` is
    False. Same values as :func:`logprobs_of` and :func:`entropy_of`.

    ``overwrite_logits``: the backward writes the gradient into ``logits`` instead of a new (B, T, V) tensor. Only
    for logits that nothing reads after the backward (the output of the LM head, or of a division of it, whose
    backward does not read it), backpropagated once.
    """
    if logits.requires_grad and torch.is_grad_enabled():
        return _TokenLogprobs.apply(logits, tokens, with_entropy, overwrite_logits)
    lse, picked, entropy = _lse_gather_entropy(logits, tokens, with_entropy)
    return picked - lse, torch.zeros_like(lse) if entropy is None else entropy


def entropy_of(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position: (B, T, V) -> (B, T), in float32, no gradient.

    Tokens with a −inf logit (removed by top-k/top-p) count as probability 0. Computed in chunks of positions.
    """
    tokens = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    with torch.no_grad():
        return logprobs_and_entropy(logits, tokens)[1]


def _kl_terms(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    # p·(log p − log q), 0 where p = 0 (even where q = 0 too); +inf where p > 0 = q, as the KL is then infinite.
    return torch.where(torch.isneginf(logp), 0.0, logp.exp() * (logp - logq))


def full_kl(policy_logits: torch.Tensor, reference_logits: torch.Tensor) -> torch.Tensor:
    """KL(π ‖ π_0) over the whole vocabulary at each position: (B, T, V) x2 -> (B, T), in float32, no gradient.

    This is the KL the CORY paper plots (summed over the response, averaged over the batch). Tokens that π gives
    probability 0 (a −inf logit) add nothing. Computed in chunks of positions.
    """
    tokens = torch.zeros(policy_logits.shape[:-1], dtype=torch.long, device=policy_logits.device)
    return logprobs_and_full_kl(policy_logits, reference_logits, tokens)[2]


def logprobs_and_full_kl(
    policy_logits: torch.Tensor, reference_logits: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """log π(token), log π_0(token) and the full-vocabulary KL at each position, with one log-softmax per model.

    Same values as :func:`logprobs_of` twice and :func:`full_kl`, at half the vocabulary-wide work, in chunks of
    positions so that at most a few chunk-sized temporaries exist besides the two (B, T, V) logits.
    """
    policy, reference, index = _positions(policy_logits), _positions(reference_logits), tokens.reshape(-1, 1)
    logprobs, ref_logprobs, kl = (
        torch.empty(policy.shape[0], dtype=torch.float32, device=tokens.device) for _ in range(3)
    )
    for rows in _chunks(*policy.shape):
        logp = F.log_softmax(policy[rows].float(), dim=-1)  # (n, V)
        logq = F.log_softmax(reference[rows].float(), dim=-1)
        kl[rows] = _kl_terms(logp, logq).sum(-1)
        logprobs[rows] = torch.gather(logp, 1, index[rows]).squeeze(-1)
        ref_logprobs[rows] = torch.gather(logq, 1, index[rows]).squeeze(-1)
    shape = tokens.shape
    return logprobs.view(shape), ref_logprobs.view(shape), kl.view(shape)


def sampled_kl(logprobs: torch.Tensor, reference_logprobs: torch.Tensor) -> torch.Tensor:
    """The k1 estimator of KL(π ‖ π_0) from the sampled token: log π(a) − log π_0(a).

    Unbiased for the KL when the token was drawn from the π whose log-probs are given, one forward of each model,
    and negative for single tokens; the RLHF reward shaping of Ziegler et al. (2019) and the CORY paper's code use it
    per token. If tokens are drawn from a processed distribution μ ≠ π (repetition penalty, top-k/top-p: see
    ``GenerationConfig.logprobs_from``), its mean E_μ[log π(a) − log π_0(a)] is biased for KL(π ‖ π_0).
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
    """Generalised advantage estimation (Schulman et al., 2016) over each row's masked-in tokens, in order.

    δ_t = r_t + γ·V_{t'} − V_t and A_t = δ_t + γλ·A_{t'}, with t' the row's next masked-in position: the episode ends
    at the last one, so nothing is bootstrapped from padding, and tokens masked out between (a seat's observations
    between its answers, :mod:`marllm.algorithms.seat_sequences`) are skipped, so an answer's last token bootstraps
    from the next answer's first. Returns (advantages, returns = advantages + values), both 0 off the mask.
    """
    batch, length = rewards.shape
    advantages = torch.zeros_like(rewards)
    running = torch.zeros(batch, dtype=rewards.dtype, device=rewards.device)
    next_values = torch.zeros_like(running)
    has_next = torch.zeros_like(running)
    for t in reversed(range(length)):
        own = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_values * has_next - values[:, t]
        step = delta + gamma * lam * has_next * running
        running = torch.where(own, step, running)
        next_values = torch.where(own, values[:, t], next_values)
        has_next = torch.where(own, torch.ones_like(has_next), has_next)
        advantages[:, t] = torch.where(own, step, torch.zeros_like(step))
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
    if "turn_scores" in b:  # one token sequence per seat: each turn's score at its last token (seat_sequences)
        rewards = b.turn_scores.to(b.kl.dtype) - kl_coef * b.kl * b.mask
    else:
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
    mb: Any, logprobs: torch.Tensor, values: torch.Tensor, config: PPOConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's loss of a mini-batch: the clipped surrogate plus ``vf_coef`` × the clipped value loss, and its parts."""
    pg_loss, clipfrac, approx_kl = clipped_policy_loss(logprobs, mb.logprobs, mb.advantages, mb.mask, config.clip_range)
    v_loss, v_clipfrac = clipped_value_loss(values.float(), mb.values, mb.returns, mb.mask, config.clip_range_value)
    loss = pg_loss + config.vf_coef * v_loss
    parts = {
        "loss/policy": pg_loss,
        "loss/value": v_loss,
        "loss/total": loss,
        "clipfrac": clipfrac,
        "value_clipfrac": v_clipfrac,
        "approx_kl": approx_kl,
    }
    return loss, scalars(parts)
