"""Learners: token-level PPO with KL control, and the pure functions it is built from."""

from marllm.algorithms.kl_controller import AdaptiveKLController, FixedKLController
from marllm.algorithms.ppo import NonFiniteLossError, PPOLearner, Rollout
from marllm.algorithms.ppo_config import GenerationConfig, PPOConfig

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "GenerationConfig",
    "NonFiniteLossError",
    "PPOConfig",
    "PPOLearner",
    "Rollout",
]
