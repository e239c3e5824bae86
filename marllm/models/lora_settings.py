"""The LoRA settings of a config (``model.lora``), checked without loading torch or peft."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LoraSettings:
    """LoRA adapters (Hu et al., 2021) that make every learner a low-rank delta on one frozen base.

    Attributes:
        r: adapter rank; higher fits more but costs memory and drifts more easily.
        alpha: scaling numerator (the update is scaled by alpha / r).
        dropout: dropout on the adapter input (inactive here: PPO runs with dropout off).
        target_modules: module names to adapt (e.g. ``[c_attn]`` for GPT-2, ``[q_proj, v_proj]`` for Llama);
            null uses peft's default for the architecture.
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] | None = None

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"model.lora.r must be >= 1, got {self.r}")
        if self.alpha <= 0:
            raise ValueError(f"model.lora.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.lora.dropout must be in [0, 1), got {self.dropout}")
