"""One PPO update as functions of their inputs, in the order it runs: the scores it trains on
(:func:`transform_scores`), the targets it trains towards (:func:`ppo_targets`), the batch its epochs train on
(:class:`UpdateBatch`), PPO's clipped loss of a mini-batch from the log-probs and values that the learner's action
mode re-scores (:func:`ppo_objective`; :meth:`~marllm.algorithms.actions.base.Collector.rescore`), and the statistics
it reports. The maths they compose is in :mod:`marllm.algorithms.core`; the optimiser steps in
:mod:`marllm.algorithms.ppo_steps`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tianshou.data import Batch
from tianshou.utils.statistics import RunningMeanStd

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
    from marllm.algorithms.rollout import Rollout


def transform_scores(
    scores: np.ndarray, batch: np.ndarray, statistics: RunningMeanStd, transform: str, clip: float | None
) -> np.ndarray:
    """The scores (B,) an update trains on: ``ppo.score_transform`` from running ``statistics``, which first take in
    the whole ``batch`` of scores (``scores`` itself in one process; every rank's, data-parallel), then the clip.

    Score scaling/normalisation from running statistics (Ziegler et al., 2019; TRL's use_score_scaling /
    use_score_norm) keeps the reward scale, and so the KL trade-off, stable as the policy improves.
    """
    if transform != "none":
        statistics.update(batch)
        mean, std = float(statistics.mean), float(np.sqrt(statistics.var))
        # Every score so far equal (each 0/1 answer right, CORY's r1 + r2 constant): the running std is 0 up to
        # float64 rounding (~1e-8·|mean|), and TRL's std + eps would multiply the score by ~1e7. No spread is
        # no scale to divide by, so leave the score undivided until the scores spread.
        if std <= 1e-6 * max(1.0, abs(mean)):
            std = 1.0
        shift = mean if transform == "normalize" else 0.0
        scores = (scores - shift) / std
    if clip is not None:
        scores = np.clip(scores, -clip, clip)
    return scores


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


@dataclass(frozen=True)
class UpdateBatch:
    """Everything the epochs of an update need from a rollout (a learner's turns of an iteration, merged), computed
    before them without gradients.

    Built by :meth:`~marllm.algorithms.ppo.PPOLearner._preprocess`; the rollout itself is left as it was.

    Attributes:
        batch: the rollout's tensors (the same tensor objects, not copies) and the columns the learner's advantage
            hook added: ``advantages`` and ``returns`` (B, L), and what else the algorithm keeps (PPO's token
            ``rewards`` (B, L); the critic-free ``outcome`` (B,)). Mini-batches are index selections of it.
        scores: the transformed scores (B,), float64: the rewards after the running-statistics transform and clip.
        kl_coef: η of this update's KL penalty (the controller's value when the update began).
        prompt_length: P, the prompt columns of ``input_ids`` before the response.
        global_rows: data-parallel, each row's index in the global batch one process would hold
            (:meth:`~marllm.parallel.distributed.DataParallel.global_rows`); None in one process.
    """

    batch: Batch
    scores: np.ndarray
    kl_coef: float
    prompt_length: int
    global_rows: np.ndarray | None = None

    def __len__(self) -> int:
        """The number of responses."""
        return len(self.scores)


@dataclass(frozen=True)
class UpdateStats:
    """A learner's statistics of its update on an iteration's rollouts, merged; :meth:`as_dict` gives the metrics
    ``update()`` reports.

    Attributes:
        task_reward: the agent's own task reward, batch mean.
        received_reward: the reward it trained on, batch mean.
        score: the transformed score, batch mean.
        kl: the full-vocabulary KL(π ‖ π_0) summed over a response, batch mean.
        kl_penalty: the KL the penalty used (``ppo.kl_penalty``), summed over a response, batch mean.
        kl_coef: η of the update.
        response_length: response tokens, batch mean.
        advantage_stats: the algorithm's statistics of its returns and advantages (``returns/mean``, …).
        generation_s, forward_s, update_s: seconds spent sampling, scoring the rollout, and updating.
        losses: each loss part's mean over the update's mini-batches (``loss/policy``, ``clipfrac``, ``ratio``, …).
        nonfinite_skipped: whether a non-finite loss or gradient abandoned the update; None (not reported) unless
            ``ppo.on_nonfinite`` is ``"skip"``.
    """

    task_reward: float
    received_reward: float
    score: float
    kl: float
    kl_penalty: float
    kl_coef: float
    response_length: float
    advantage_stats: dict[str, float]
    generation_s: float
    forward_s: float
    update_s: float
    losses: dict[str, float]
    nonfinite_skipped: bool | None = None

    @property
    def combined_reward(self) -> float:
        """The task reward less η times the full KL: the KL-regularised objective."""
        return self.task_reward - self.kl_coef * self.kl

    def as_dict(self) -> dict[str, float]:
        """The metrics by name, unprefixed (the loop prefixes them with the learner id)."""
        stats = {
            "task_reward": self.task_reward,
            "received_reward": self.received_reward,
            "score": self.score,
            "kl": self.kl,
            "kl_penalty": self.kl_penalty,
            "kl_coef": self.kl_coef,
            "combined_reward": self.combined_reward,
            "response_length": self.response_length,
            **self.advantage_stats,
            "time/generation_s": self.generation_s,
            "time/forward_s": self.forward_s,
            "time/update_s": self.update_s,
            **self.losses,
        }
        if self.nonfinite_skipped is not None:
            stats["nonfinite_skipped"] = float(self.nonfinite_skipped)
        return stats


def update_stats(
    rollout: Rollout,
    data: UpdateBatch,
    losses: dict[str, list[float]],
    advantage_stats: dict[str, float],
    started: float,
    nonfinite_skipped: bool | None = None,
) -> UpdateStats:
    """The statistics of an update begun at ``started`` (``time.perf_counter()``) on ``rollout``, which ``data`` was
    computed from: its batch means, the algorithm's ``advantage_stats`` and each loss part's mean over ``losses``."""
    b = data.batch
    mask = b.mask
    return UpdateStats(
        task_reward=float(np.mean(rollout.task_rewards)),
        received_reward=float(np.mean(rollout.received_rewards)),
        score=float(np.mean(data.scores)),
        kl=(b.kl_full * mask).sum(1).mean().item(),
        kl_penalty=b.kl.sum(1).mean().item(),
        kl_coef=data.kl_coef,
        response_length=mask.sum(1).mean().item(),
        advantage_stats=advantage_stats,
        generation_s=rollout.timings["generation_s"],
        forward_s=rollout.timings["forward_s"],
        update_s=time.perf_counter() - started,
        losses={key: float(np.mean(values)) for key, values in losses.items()},
        nonfinite_skipped=nonfinite_skipped,
    )
