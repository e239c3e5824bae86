"""Task rewards: callables ``reward_fn(samples, responses) -> one float per sample``.

The sentiment rewards are loaded on first use, so that importing :mod:`marllm.rewards.math` (plain Python, which the
offline arithmetic problems use) does not load :mod:`marllm.rewards.sentiment` and, with it, torch and the model
loading of :mod:`marllm.models`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from marllm.utils.lazy_exports import lazy_exports

# public name -> the module that defines it
_EXPORTS = {
    "ClassifierReward": "marllm.rewards.sentiment",
    "TextScoreReward": "marllm.rewards.sentiment",
}

__all__ = ["ClassifierReward", "TextScoreReward"]

if TYPE_CHECKING:
    from marllm.rewards.sentiment import ClassifierReward, TextScoreReward


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
