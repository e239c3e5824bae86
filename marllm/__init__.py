"""marllm: multi-agent reinforcement learning for LLMs, with PettingZoo text environments."""

__version__ = "0.1.0"
