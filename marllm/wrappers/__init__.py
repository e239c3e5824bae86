"""PettingZoo wrappers that turn any AEC env into a CORY-style cooperative game."""

from marllm.wrappers.role_baselines import RoleBaselines
from marllm.wrappers.role_permutation import RolePermutation
from marllm.wrappers.shared_reward import SharedReward, check_coefficients, cooperation_matrix

__all__ = ["RoleBaselines", "RolePermutation", "SharedReward", "check_coefficients", "cooperation_matrix"]
