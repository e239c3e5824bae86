"""Task rewards: callables ``reward_fn(samples, responses) -> one float per sample``."""

from marllm.rewards.sentiment import ClassifierReward, TextScoreReward

__all__ = ["ClassifierReward", "TextScoreReward"]
