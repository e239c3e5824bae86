"""Learners: token-level PPO with KL control, the GRPO family (GRPO, RLOO, REINFORCE++), the Learner interface they
share, and the pure functions they are built from."""

from marllm.algorithms.critic_free_config import CriticFreeConfig
from marllm.algorithms.critic_free_learner import CriticFreeLearner
from marllm.algorithms.kl_controller import AdaptiveKLController, FixedKLController, KLController
from marllm.algorithms.learner import Learner
from marllm.algorithms.ppo import NonFiniteLossError, PPOLearner, Rollout
from marllm.algorithms.ppo_config import GenerationConfig, PPOConfig

__all__ = [
    "AdaptiveKLController",
    "CriticFreeConfig",
    "CriticFreeLearner",
    "FixedKLController",
    "GenerationConfig",
    "KLController",
    "Learner",
    "NonFiniteLossError",
    "PPOConfig",
    "PPOLearner",
    "Rollout",
]
