"""LLM multi-agent environments (PettingZoo AEC); the tasks that fill them live in :mod:`marllm.tasks`.

``env(**kwargs)`` is the PettingZoo-style factory (the raw env behind the order-enforcing wrapper);
``SequentialTextEnv`` (also ``raw_env``) is the unwrapped class.
"""

from marllm.envs.spaces import TextBatch
from marllm.envs.text_env import RewardFn, RewardFunctionError, SequentialTextEnv, env, raw_env

__all__ = ["RewardFn", "RewardFunctionError", "SequentialTextEnv", "TextBatch", "env", "raw_env"]
