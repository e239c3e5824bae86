"""Settings of the critic-free learners (GRPO, RLOO, REINFORCE++), validated when built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from marllm.utils.checks import choice

VARIANTS = ("grpo", "rloo", "reinforce_pp")
"""The advantages a critic-free learner computes (the catalog names that build one)."""

COMPARES_GROUPS = ("grpo", "rloo")
"""The variants whose advantage compares the answers to one query (they need ``env.group_size`` >= 2)."""


@dataclass
class CriticFreeConfig:
    """Settings of the GRPO-family learners (the ``critic_free`` config section).

    Attributes:
        kl_in: where the KL to the reference enters. ``"reward"``: as PPO does, −η·KL per token in the reward (the
            estimator of ``ppo.kl.kl_penalty``; for GRPO and RLOO summed over the response and subtracted from the
            outcome reward before the group baseline). ``"loss"``: as GRPO's paper does, η × the ``kl_estimator``
            per token added to the loss, the reward being the task score alone.
        kl_estimator: the per-token estimator of the KL as a loss term (x = log π_0 − log π of the sampled token):
            ``"k3"`` (Schulman, 2020: exp(x) − x − 1, non-negative, unbiased, GRPO's; its gradient is, on-policy,
            that of the reverse KL(π_0 ‖ π); clamped as verl does), ``"k2"`` (½·x², biased, whose gradient is that
            of KL(π ‖ π_0), the KL it is meant to bound) or ``"k1"`` (−x, whose gradient is zero in expectation: a
            loss term that does nothing on average). With ``kl_in: loss`` the adaptive KL controller is fed this
            estimator's summed KL of the rollout (what the loss penalises), not ``ppo.kl.kl_penalty``'s.
        loss_aggregation: ``"token-mean"`` (mean over every response token of the mini-batch, DAPO) or
            ``"seq-mean-token-mean"`` (mean over each response, then over responses: GRPO's paper).
        scale_by_std: GRPO divides each group's centred task scores by their standard deviation; false keeps the
            centring only. With the KL in the reward, the group-centred −η·ΣKL is added after that division, so the
            penalty keeps the size η gives it (:func:`~marllm.algorithms.critic_free.grpo_kl_penalised_advantages`).

    Dr. GRPO (Liu et al., 2025) is two changes to GRPO, both needed: ``scale_by_std: false`` and no per-answer length
    normalisation, i.e. ``loss_aggregation: token-mean`` (every token of the mini-batch weighs the same; the paper
    divides by a constant token budget instead, which differs from the mini-batch's token count only by a factor common
    to the whole mini-batch). That factor is common to a whole optimiser step only with one mini-batch per step; with
    ``ppo.batching.gradient_accumulation_steps`` > 1 set ``ppo.batching.loss_reduction: step_token_mean`` so that every
    token of the step weighs the same, as the constant normaliser makes it. ``seq-mean-token-mean`` brings the length
    normalisation back.

    ``ppo.score_transform`` applies to these learners too, before the group baseline: for GRPO with
    ``scale_by_std`` a running rescale of the scores cancels out in the division (up to its ε); for RLOO and Dr.
    GRPO it rescales every advantage by a running std that drifts over training, which neither method does, so
    configs of those methods should set ``ppo.score_transform: none``.
    """

    kl_in: Literal["reward", "loss"] = "reward"
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    loss_aggregation: Literal["token-mean", "seq-mean-token-mean"] = "token-mean"
    scale_by_std: bool = True

    def __post_init__(self) -> None:
        choice("critic_free", self, "kl_in", ("reward", "loss"))
        choice("critic_free", self, "kl_estimator", ("k1", "k2", "k3"))
        choice("critic_free", self, "loss_aggregation", ("token-mean", "seq-mean-token-mean"))
        if not isinstance(self.scale_by_std, bool):
            raise ValueError(f"critic_free.scale_by_std must be true or false, got {self.scale_by_std!r}")
