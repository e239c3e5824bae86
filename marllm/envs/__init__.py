"""LLM multi-agent environments (PettingZoo AEC); the tasks that fill them live in :mod:`marllm.tasks`.

``env(**kwargs)`` is the PettingZoo-style factory (the raw env behind the order-enforcing wrapper);
``SequentialTextEnv`` (also ``raw_env``) is the unwrapped class. A reward that takes a ``context`` parameter is given
a ``RewardContext`` (whose turn it scores, and the dialogue): see :mod:`marllm.envs.reward_context`.
"""

from marllm.envs.reward_context import ContextRewardFn, RewardContext
from marllm.envs.spaces import TextBatch
from marllm.envs.text_env import RewardFn, RewardFunctionError, SequentialTextEnv, env, raw_env

__all__ = [
    "ContextRewardFn",
    "RewardContext",
    "RewardFn",
    "RewardFunctionError",
    "SequentialTextEnv",
    "TextBatch",
    "env",
    "raw_env",
]
