"""marllm: multi-agent reinforcement learning for LLMs, with PettingZoo text environments.

The objects most programs need are importable from here::

    from marllm import SequentialTextEnv, SharedReward, RolePermutation, PPOLearner, make_learners, train

They are loaded on first use, so ``import marllm`` (and the CLI's light commands) do not pay for torch and
transformers until something needs them.

It also makes torch's idle threads wait briefly instead of spinning (``GOMP_SPINCOUNT``, see
:mod:`marllm.utils.threads`), as the ``marllm`` command does, whether torch was imported before it or not: on a
machine shared with other work a program using the library then runs as fast as the command. A ``GOMP_SPINCOUNT`` or
``OMP_WAIT_POLICY`` already set is left as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from marllm.utils.lazy_exports import lazy_exports
from marllm.utils.threads import wait_briefly_when_idle

wait_briefly_when_idle()  # before torch loads libgomp, or into the libgomp it has loaded

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "SequentialTextEnv": "marllm.envs.text_env",
    "RewardFunctionError": "marllm.envs.text_env",
    "SharedReward": "marllm.wrappers.shared_reward",
    "RolePermutation": "marllm.wrappers.role_permutation",
    "PPOLearner": "marllm.algorithms.ppo",
    "PPOConfig": "marllm.algorithms.ppo_config",
    "GenerationConfig": "marllm.models.generation_config",
    "make_learners": "marllm.run.learners",
    "ModelPlacement": "marllm.models.placement",
    "AlgorithmOptions": "marllm.algorithms.catalog",
    "run_iteration": "marllm.loop",
    "train": "marllm.run.train",
    "TrainConfig": "marllm.config",
    "load_config": "marllm.config",
    "ConfigError": "marllm.config.loading",
}

__all__ = [
    "AlgorithmOptions",
    "ConfigError",
    "GenerationConfig",
    "ModelPlacement",
    "PPOConfig",
    "PPOLearner",
    "RewardFunctionError",
    "RolePermutation",
    "SequentialTextEnv",
    "SharedReward",
    "TrainConfig",
    "__version__",
    "load_config",
    "make_learners",
    "run_iteration",
    "train",
]

if TYPE_CHECKING:
    from marllm.algorithms.catalog import AlgorithmOptions
    from marllm.algorithms.ppo import PPOLearner
    from marllm.algorithms.ppo_config import PPOConfig
    from marllm.config import TrainConfig, load_config
    from marllm.config.loading import ConfigError
    from marllm.envs.text_env import RewardFunctionError, SequentialTextEnv
    from marllm.loop import run_iteration
    from marllm.models.generation_config import GenerationConfig
    from marllm.models.placement import ModelPlacement
    from marllm.run.learners import make_learners
    from marllm.run.train import train
    from marllm.wrappers.role_permutation import RolePermutation
    from marllm.wrappers.shared_reward import SharedReward


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
