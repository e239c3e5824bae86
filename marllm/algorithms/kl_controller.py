"""KL coefficient controllers: small objects with ``.value`` and ``.update(current_kl, n_steps)``."""

from __future__ import annotations

from dataclasses import dataclass


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
