"""Learners: the clipped policy-gradient learner and what is built on it, token-level PPO with KL control and the
GRPO family (GRPO, RLOO, REINFORCE++), the Learner interface they
share, the catalog that names them (:mod:`marllm.algorithms.catalog`), the action modes they act in
(:mod:`marllm.algorithms.actions`), and the pure functions they are built from.

The names below are loaded on first use, so that importing a settings module of this package (as the config does)
does not load torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from marllm.utils.lazy_exports import lazy_exports

_EXPORTS = {
    "ALGORITHMS": "marllm.algorithms.catalog",
    "AdaptiveKLController": "marllm.algorithms.kl_controller",
    "AlgorithmOptions": "marllm.algorithms.catalog",
    "BatchingConfig": "marllm.algorithms.ppo_sections",
    "ComputeConfig": "marllm.algorithms.ppo_sections",
    "CriticFreeConfig": "marllm.algorithms.critic_free_config",
    "CriticFreeLearner": "marllm.algorithms.critic_free_learner",
    "FixedKLController": "marllm.algorithms.kl_controller",
    "GenerationConfig": "marllm.algorithms.ppo_config",
    "GuardsConfig": "marllm.algorithms.ppo_sections",
    "KLConfig": "marllm.algorithms.ppo_sections",
    "KLController": "marllm.algorithms.kl_controller",
    "Learner": "marllm.algorithms.learner",
    "NonFiniteLossError": "marllm.algorithms.ppo_steps",
    "OptimiserConfig": "marllm.algorithms.ppo_sections",
    "PPOConfig": "marllm.algorithms.ppo_config",
    "PPOLearner": "marllm.algorithms.ppo",
    "PolicyGradientLearner": "marllm.algorithms.policy_gradient",
    "Rollout": "marllm.algorithms.rollout",
    "build_learner": "marllm.algorithms.catalog",
}

__all__ = [
    "ALGORITHMS",
    "AdaptiveKLController",
    "AlgorithmOptions",
    "BatchingConfig",
    "ComputeConfig",
    "CriticFreeConfig",
    "CriticFreeLearner",
    "FixedKLController",
    "GenerationConfig",
    "GuardsConfig",
    "KLConfig",
    "KLController",
    "Learner",
    "NonFiniteLossError",
    "OptimiserConfig",
    "PPOConfig",
    "PPOLearner",
    "PolicyGradientLearner",
    "Rollout",
    "build_learner",
]

if TYPE_CHECKING:
    from marllm.algorithms.catalog import ALGORITHMS, AlgorithmOptions, build_learner
    from marllm.algorithms.critic_free_config import CriticFreeConfig
    from marllm.algorithms.critic_free_learner import CriticFreeLearner
    from marllm.algorithms.kl_controller import AdaptiveKLController, FixedKLController, KLController
    from marllm.algorithms.learner import Learner
    from marllm.algorithms.policy_gradient import PolicyGradientLearner
    from marllm.algorithms.ppo import PPOLearner
    from marllm.algorithms.ppo_config import GenerationConfig, PPOConfig
    from marllm.algorithms.ppo_sections import BatchingConfig, ComputeConfig, GuardsConfig, KLConfig, OptimiserConfig
    from marllm.algorithms.ppo_steps import NonFiniteLossError
    from marllm.algorithms.rollout import Rollout

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
