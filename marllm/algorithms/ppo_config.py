"""Hyperparameters of token-level PPO, validated when built (sampling's are :class:`GenerationConfig`).

The objective's maths sit directly in :class:`PPOConfig`; the rest in its sections
(:mod:`marllm.algorithms.ppo_sections`): ``optimiser``, ``batching``, ``kl``, ``compute`` and ``guards``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from marllm.algorithms.ppo_sections import (
    AUTO_MICRO_BATCH_SIZE,
    BatchingConfig,
    ComputeConfig,
    GuardsConfig,
    KLConfig,
    OptimiserConfig,
)
from marllm.models.generation_config import GenerationConfig
from marllm.utils.checks import choice, in_unit_interval, non_negative, positive

__all__ = [
    "AUTO_MICRO_BATCH_SIZE",
    "PPO_SETTING_PLACES",
    "BatchingConfig",
    "ComputeConfig",
    "GenerationConfig",
    "GuardsConfig",
    "KLConfig",
    "OptimiserConfig",
    "PPOConfig",
]

SECTIONS: dict[str, type] = {
    "optimiser": OptimiserConfig,
    "batching": BatchingConfig,
    "kl": KLConfig,
    "compute": ComputeConfig,
    "guards": GuardsConfig,
}
"""The sections of :class:`PPOConfig`: name -> class."""

PPO_SETTING_PLACES: dict[str, str] = {
    f.name: f"{section}.{f.name}" for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)
}
"""Each setting of a section -> its place (``"mini_batch_size"`` -> ``"batching.mini_batch_size"``), by which
:meth:`PPOConfig.from_flat` places Python keywords."""


def _placed(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with each section's setting moved into its section."""
    placed = dict(settings)
    for name, place in PPO_SETTING_PLACES.items():
        if name in placed:
            section, key = place.split(".")
            placed[section] = {**(placed.get(section) or {}), key: placed.pop(name)}
    return placed


@dataclass
class PPOConfig:
    """Token-level PPO with a KL penalty to the reference. Defaults are the CORY paper's IMDB setting (Table 1).

    Attributes:
        gamma: discount over response tokens (1: the sequence reward reaches the first token undiscounted).
        lam: GAE λ; lower trades variance for value-function bias.
        clip_range: ε of the clipped policy ratio.
        clip_range_value: how far one update may move a value prediction from the rollout's.
        vf_coef: weight of the value loss in the shared-trunk loss.
        whiten_advantages: normalise advantages over the batch's response tokens.
        score_transform: what is done to the task score before it enters the token reward: ``"none"``,
            ``"scale"`` (divide by the running std) or ``"normalize"`` (subtract the running mean, divide by the
            running std). The paper turns scaling and normalisation on for IMDB. While the running std is zero up
            to float rounding (every score so far equal, e.g. every 0/1 answer right) the score is not divided.
        score_clip: clip the transformed score to ±score_clip (None: no clip).
        optimiser: Adam's step and the gradient's clip (:class:`OptimiserConfig`).
        batching: epochs, mini-batches and optimiser steps (:class:`BatchingConfig`).
        kl: the KL penalty and its coefficient's control (:class:`KLConfig`).
        compute: how the update is computed, not what (:class:`ComputeConfig`).
        guards: what an update does when the policy blows up (:class:`GuardsConfig`).

    In Python, every setting may be given by its own name, without its section, to :meth:`from_flat`.
    """

    gamma: float = 1.0
    lam: float = 0.95
    clip_range: float = 0.2
    clip_range_value: float = 0.2
    vf_coef: float = 0.1
    whiten_advantages: bool = True
    score_transform: Literal["none", "scale", "normalize"] = "normalize"
    score_clip: float | None = None
    optimiser: OptimiserConfig = field(default_factory=OptimiserConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    kl: KLConfig = field(default_factory=KLConfig)
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    guards: GuardsConfig = field(default_factory=GuardsConfig)

    def __post_init__(self) -> None:
        for key, section in SECTIONS.items():
            if not isinstance(getattr(self, key), section):
                raise TypeError(f"ppo.{key} must be a {section.__name__}, got {getattr(self, key)!r}")
        in_unit_interval("ppo", self, "gamma", "lam")
        non_negative("ppo", self, "clip_range", "clip_range_value", "vf_coef")
        choice("ppo", self, "score_transform", ("none", "scale", "normalize"))
        if self.score_clip is not None:
            positive("ppo", self, "score_clip")

    @classmethod
    def from_flat(cls, **settings: Any) -> PPOConfig:
        """A config from settings given by their own names, each placed in its section by :data:`PPO_SETTING_PLACES`
        (``PPOConfig.from_flat(mini_batch_size=4, init_kl_coef=0.1)`` is ``PPOConfig(batching=BatchingConfig(
        mini_batch_size=4), kl=KLConfig(init_kl_coef=0.1))``); the objective's own settings (``gamma``, ...) and whole
        sections may be given too.

        Raises:
            TypeError: a keyword that is no setting (the message lists the valid ones).
        """
        own = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(key for key in settings if key not in own and key not in PPO_SETTING_PLACES)
        if unknown:
            valid = sorted(own | PPO_SETTING_PLACES.keys())
            raise TypeError(f"PPOConfig.from_flat: unknown setting(s) {unknown}; valid ones: {valid}")
        given = {
            key: vars(value) if key in SECTIONS and isinstance(value, SECTIONS[key]) else value
            for key, value in settings.items()
        }
        placed = _placed(given)
        for name, section in SECTIONS.items():
            values = placed.get(name)
            if isinstance(values, Mapping):
                placed[name] = section(**values)
        return cls(**placed)
