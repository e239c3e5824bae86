"""Task rewards: callables ``reward_fn(samples, responses) -> one float per sample``.

The sentiment rewards are loaded on first use, so that importing :mod:`marllm.rewards.math` (plain Python, which the
offline arithmetic problems use) does not load :mod:`marllm.rewards.sentiment` and, with it, torch and the model
loading of :mod:`marllm.models`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it
_EXPORTS = {
    "ClassifierReward": "marllm.rewards.sentiment",
    "TextScoreReward": "marllm.rewards.sentiment",
}

__all__ = ["ClassifierReward", "TextScoreReward"]

if TYPE_CHECKING:
    from marllm.rewards.sentiment import ClassifierReward, TextScoreReward


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'marllm.rewards' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
