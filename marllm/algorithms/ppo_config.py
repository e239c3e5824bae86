"""Hyperparameters of token-level PPO, validated when built (sampling's are :class:`GenerationConfig`).

The objective's maths sit directly in :class:`PPOConfig`; the rest in its sections
(:mod:`marllm.algorithms.ppo_sections`): ``optimiser``, ``batching``, ``kl``, ``compute`` and ``guards``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

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
    "MOVED_PPO_KEYS",
    "BatchingConfig",
    "ComputeConfig",
    "GenerationConfig",
    "GuardsConfig",
    "KLConfig",
    "OptimiserConfig",
    "PPOConfig",
    "sectioned_ppo",
]

SECTIONS: dict[str, type] = {
    "optimiser": OptimiserConfig,
    "batching": BatchingConfig,
    "kl": KLConfig,
    "compute": ComputeConfig,
    "guards": GuardsConfig,
}
"""The sections of :class:`PPOConfig`: name -> class."""

MOVED_PPO_KEYS: dict[str, str] = {
    f.name: f"{section}.{f.name}" for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)
}
"""Each ``ppo`` key of the flat layout that moved into a section -> its place there (``"mini_batch_size"`` ->
``"batching.mini_batch_size"``): the loader refuses the flat key with it, :func:`sectioned_ppo` upgrades a run's
recorded config by it and :meth:`PPOConfig.from_flat` places Python keywords by it."""


def sectioned_ppo(ppo: Mapping[str, Any]) -> dict[str, Any]:
    """A ``ppo`` mapping recorded before it had sections (``mini_batch_size`` directly under it) in today's layout;
    one in today's layout as it is. A run's checkpoint keeps its config as it was written, and resuming it compares
    that config with today's."""
    upgraded = dict(ppo)
    for old, new in MOVED_PPO_KEYS.items():
        if old in upgraded:
            section, key = new.split(".")
            upgraded[section] = {**(upgraded.get(section) or {}), key: upgraded.pop(old)}
    return upgraded


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

    In Python, the settings of the flat layout (``mini_batch_size=4`` directly) are written with :meth:`from_flat`.
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
    MOVED_KEYS: ClassVar[dict[str, str]] = MOVED_PPO_KEYS
    """Keys of the flat layout -> their place in a section (the loader refuses them with it)."""

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
        """A config from the settings of the flat layout, each placed in its section by :data:`MOVED_PPO_KEYS`
        (``PPOConfig.from_flat(mini_batch_size=4, init_kl_coef=0.1)`` is ``PPOConfig(batching=BatchingConfig(
        mini_batch_size=4), kl=KLConfig(init_kl_coef=0.1))``); the objective's own settings (``gamma``, ...) and whole
        sections may be given too.

        Raises:
            TypeError: a keyword that is no setting of either layout (the message lists the valid ones).
        """
        own = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(key for key in settings if key not in own and key not in MOVED_PPO_KEYS)
        if unknown:
            raise TypeError(
                f"PPOConfig.from_flat: unknown setting(s) {unknown}; valid ones: {sorted(own | MOVED_PPO_KEYS.keys())}"
            )
        given = {
            key: vars(value) if key in SECTIONS and isinstance(value, SECTIONS[key]) else value
            for key, value in settings.items()
        }
        placed = sectioned_ppo(given)
        for name, section in SECTIONS.items():
            values = placed.get(name)
            if isinstance(values, Mapping):
                placed[name] = section(**values)
        return cls(**placed)
