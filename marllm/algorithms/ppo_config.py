"""Hyperparameters of token-level PPO and of sampling, validated when built."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal


@dataclass
class PPOConfig:
    """Token-level PPO with a KL penalty to the reference. Defaults are the CORY paper's IMDB setting (Table 1).

    Attributes:
        learning_rate: Adam step size. Larger moves the policy (and the KL) faster per batch.
        mini_batch_size: samples per forward/backward pass.
        gradient_accumulation_steps: mini-batches whose gradients are summed before one optimiser step, so one step
            covers ``mini_batch_size × gradient_accumulation_steps`` samples (the paper's GSM8K run: 2 × 16 = 32).
        ppo_epochs: passes over each batch; more reuses data more but drifts further from the rollout policy.
        gamma: discount over response tokens (1: the sequence reward reaches the first token undiscounted).
        lam: GAE λ; lower trades variance for value-function bias.
        clip_range: ε of the clipped policy ratio.
        clip_range_value: how far one update may move a value prediction from the rollout's.
        vf_coef: weight of the value loss in the shared-trunk loss.
        whiten_advantages: normalise advantages over the batch's response tokens.
        max_grad_norm: clip the global gradient norm (None: no clipping, as in the paper's setup).
        kl_penalty: per-token KL in the reward: ``"k1"`` = log π(a) − log π_0(a) of the sampled token (unbiased,
            one gather), ``"full"`` = exact KL over the whole vocabulary (lower variance, same forward passes).
        kl_control: ``"adaptive"`` (Ziegler et al. proportional controller) or ``"fixed"``.
        init_kl_coef: η at the start.
        target_kl: KL (summed over a response) the adaptive controller steers to.
        kl_horizon: the adaptive controller's horizon in samples.
        score_transform: what is done to the task score before it enters the token reward: ``"none"``,
            ``"scale"`` (divide by the running std) or ``"normalize"`` (subtract the running mean, divide by the
            running std). The paper turns scaling and normalisation on for IMDB.
        score_clip: clip the transformed score to ±score_clip (None: no clip).
        forward_batch_size: rows per forward pass when scoring a rollout (None: the whole batch at once).
        adam_eps: Adam's ε.
    """

    learning_rate: float = 1.41e-5
    mini_batch_size: int = 256
    gradient_accumulation_steps: int = 1
    ppo_epochs: int = 4
    gamma: float = 1.0
    lam: float = 0.95
    clip_range: float = 0.2
    clip_range_value: float = 0.2
    vf_coef: float = 0.1
    whiten_advantages: bool = True
    max_grad_norm: float | None = None
    kl_penalty: Literal["k1", "full"] = "k1"
    kl_control: Literal["adaptive", "fixed"] = "adaptive"
    init_kl_coef: float = 0.3
    target_kl: float = 6.0
    kl_horizon: int = 10_000
    score_transform: Literal["none", "scale", "normalize"] = "normalize"
    score_clip: float | None = None
    forward_batch_size: int | None = None
    adam_eps: float = 1e-8

    def __post_init__(self) -> None:
        _positive(self, "learning_rate", "mini_batch_size", "gradient_accumulation_steps", "ppo_epochs", "adam_eps")
        _in_unit_interval(self, "gamma", "lam")
        _non_negative(self, "clip_range", "clip_range_value", "vf_coef", "init_kl_coef")
        _choice(self, "kl_penalty", ("k1", "full"))
        _choice(self, "kl_control", ("adaptive", "fixed"))
        _choice(self, "score_transform", ("none", "scale", "normalize"))
        if self.kl_control == "adaptive":
            _positive(self, "target_kl", "kl_horizon")
        for name in ("max_grad_norm", "score_clip", "forward_batch_size"):
            if getattr(self, name) is not None:
                _positive(self, name)

    @property
    def backward_batch_size(self) -> int:
        """Samples per optimiser step."""
        return self.mini_batch_size * self.gradient_accumulation_steps

    def check_batch_size(self, batch_size: int) -> None:
        """A batch must split into whole optimiser steps."""
        if batch_size % self.backward_batch_size:
            raise ValueError(
                f"batch size {batch_size} is not divisible by ppo.mini_batch_size × ppo.gradient_accumulation_steps"
                f" = {self.mini_batch_size} × {self.gradient_accumulation_steps} = {self.backward_batch_size}"
            )


@dataclass
class GenerationConfig:
    """Sampling of responses. Defaults are the paper's IMDB setting.

    Attributes:
        min_new_tokens, max_new_tokens: each batch's response length is drawn uniformly from this range (inclusive)
            and used as the batch's token budget; a response may end earlier with EOS.
        top_k: keep the k most likely tokens (0: no top-k filtering).
        top_p: nucleus sampling mass (1.0: no filtering).
        temperature: softmax temperature of sampling.
        repetition_penalty: > 1 discourages repeating earlier tokens.
        stop_at_eos: end a response at EOS; if False, EOS is an ordinary token and every response runs to the budget.
    """

    min_new_tokens: int = 4
    max_new_tokens: int = 16
    top_k: int = 0
    top_p: float = 1.0
    temperature: float = 1.0
    repetition_penalty: float = 1.1
    stop_at_eos: bool = True

    def __post_init__(self) -> None:
        _positive(self, "min_new_tokens", "max_new_tokens", "temperature", "repetition_penalty")
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"generation.min_new_tokens ({self.min_new_tokens}) must be <= generation.max_new_tokens "
                f"({self.max_new_tokens})"
            )
        _non_negative(self, "top_k")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"generation.top_p must be in (0, 1], got {self.top_p}")


def _positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{_section(obj)}.{name} must be a finite number > 0, got {value}")


def _non_negative(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"{_section(obj)}.{name} must be a finite number >= 0, got {value}")


def _in_unit_interval(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{_section(obj)}.{name} must be in [0, 1], got {value}")


def _choice(obj: object, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(obj, name)
    if value not in choices:
        raise ValueError(f"{_section(obj)}.{name} must be one of {list(choices)}, got {value!r}")


def _section(obj: object) -> str:
    return {"PPOConfig": "ppo", "GenerationConfig": "generation"}.get(type(obj).__name__, type(obj).__name__)
