"""KL coefficient controllers: small objects with ``.value`` and ``.update(current_kl, n_steps)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from marllm.algorithms.ppo_config import PPOConfig


@runtime_checkable
class KLController(Protocol):
    """What a learner needs of its KL controller (TRL's ``kl_ctl``): the coefficient η and how it adapts.

    ``value`` is read at the start of each batch's update (the η of its KL penalty) and written back when a
    checkpoint is restored; ``update`` is called after each batch whose update completed, with the KL the penalty
    used (summed over a response, averaged over the batch) and the batch size.
    """

    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...


@dataclass
class FixedKLController:
    """Keeps the KL coefficient η constant."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""


@dataclass
class AdaptiveKLController:
    """Proportional controller of Ziegler et al. (2019), "Fine-Tuning Language Models from Human Preferences".

    After each batch, ``e = clip(KL / target − 1, −0.2, 0.2)`` and ``η ← η · (1 + e · n_steps / horizon)``: η grows
    when the policy drifts beyond the target KL and shrinks below it, by at most 20% of ``n_steps / horizon``.

    Args:
        value: initial η.
        target: the KL (summed over a response) the controller steers to.
        horizon: how many samples it takes to move η by the full error; larger is slower.
    """

    value: float
    target: float
    horizon: int

    def __post_init__(self) -> None:
        if self.target <= 0:
            raise ValueError(f"adaptive KL target must be > 0, got {self.target}")
        if self.horizon <= 0:
            raise ValueError(f"adaptive KL horizon must be > 0, got {self.horizon}")

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


def kl_controller_from(config: PPOConfig) -> KLController:
    """The controller of ``config.kl.kl_control``: :class:`AdaptiveKLController` or :class:`FixedKLController`."""
    if config.kl.kl_control == "adaptive":
        return AdaptiveKLController(config.kl.init_kl_coef, config.kl.target_kl, config.kl.kl_horizon)
    return FixedKLController(config.kl.init_kl_coef)
