"""RolePermutation: learners play the roles of an env, and the assignment rotates every ``period`` episodes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gymnasium.spaces import Space
from pettingzoo import AECEnv
from pettingzoo.utils.wrappers import BaseWrapper

from marllm.utils.errors import CheckpointError


class RolePermutation(BaseWrapper):
    """Expose learner ids as the agents and re-map learners to the env's roles every ``period`` resets.

    During resets ``k·period + 1 … (k+1)·period`` (counting from 1), learner i plays role ``(i + k) mod N``: with two
    roles the learners swap, with N roles they rotate. Nothing but the mapping changes: a learner keeps its weights,
    optimiser and statistics whatever role it plays. ``infos[learner]["role"]`` tells each learner its current role.

    Args:
        env: the environment whose ``possible_agents`` are the roles.
        period: resets between two permutations (CORY's T_REx), an int >= 1; None keeps the first assignment for
            good (learner ids still stand in for the roles, e.g. for an ablation without role exchange).
        learners: the learner ids, one per role; default ``llm1 … llmN``. Learner i starts in role i.
    """

    def __init__(self, env: AECEnv, period: int | None, learners: Sequence[str] | None = None):
        super().__init__(env)
        self.roles = list(env.possible_agents)
        if period is not None and (isinstance(period, bool) or not isinstance(period, int) or period < 1):
            raise ValueError(
                f"role permutation period must be an int >= 1 (resets between swaps) or None, got {period!r}"
            )
        self.period = period
        learners = [f"llm{i + 1}" for i in range(len(self.roles))] if learners is None else list(learners)
        if len(learners) != len(self.roles):
            raise ValueError(
                f"RolePermutation needs one learner per role: {len(self.roles)} roles {self.roles}, "
                f"{len(learners)} learners {learners}"
            )
        if len(set(learners)) != len(learners):
            raise ValueError(f"learner ids must be unique, got {learners}")
        clash = set(learners) & set(self.roles)
        if clash and learners != self.roles:
            raise ValueError(f"learner ids {sorted(clash)} are also role names; use distinct ids")
        self.learners = learners
        self.num_resets = 0
        self._set_shift(0)

    def _set_shift(self, shift: int) -> None:
        n = len(self.roles)
        self.shift = shift
        self.role_of = {learner: self.roles[(i + shift) % n] for i, learner in enumerate(self.learners)}
        self.learner_of = {role: learner for learner, role in self.role_of.items()}

    def state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The reset count and current assignment, as (no tensors, JSON-able meta), for a checkpoint."""
        return {}, {"num_resets": self.num_resets, "shift": self.shift, "learners": self.learners, "roles": self.roles}

    def load_state_dict(self, tensors: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; the learners and roles must be the same.

        Raises:
            CheckpointError: the learners, roles or counts do not fit.
        """

        if list(meta["learners"]) != self.learners or list(meta["roles"]) != self.roles:
            raise CheckpointError(
                f"the checkpoint's role permutation maps learners {meta['learners']} to roles {meta['roles']}, "
                f"this one learners {self.learners} to roles {self.roles}"
            )
        num_resets, shift = meta["num_resets"], meta["shift"]
        if not isinstance(num_resets, int) or num_resets < 0 or not isinstance(shift, int):
            raise CheckpointError(f"the role permutation's counts {num_resets!r}, {shift!r} are not ints >= 0")
        self.num_resets = num_resets
        self._set_shift(shift % len(self.roles))

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        if self.period is not None:
            self._set_shift((self.num_resets // self.period) % len(self.roles))
        self.num_resets += 1
        self.env.reset(seed=seed, options=options)

    def _by_learner(self, by_role: dict[str, Any]) -> dict[str, Any]:
        return {self.learner_of[role]: value for role, value in by_role.items()}

    @property
    def possible_agents(self) -> list[str]:
        return list(self.learners)

    @property
    def agents(self) -> list[str]:
        return [self.learner_of[role] for role in self.env.agents]

    @property
    def agent_selection(self) -> str:
        return self.learner_of[self.env.agent_selection]

    @property
    def rewards(self) -> dict[str, float]:
        return self._by_learner(self.env.rewards)

    @property
    def _cumulative_rewards(self) -> dict[str, float]:
        return self._by_learner(self.env._cumulative_rewards)

    @property
    def terminations(self) -> dict[str, bool]:
        return self._by_learner(self.env.terminations)

    @property
    def truncations(self) -> dict[str, bool]:
        return self._by_learner(self.env.truncations)

    @property
    def infos(self) -> dict[str, dict[str, Any]]:
        return {self.learner_of[role]: {**info, "role": role} for role, info in self.env.infos.items()}

    def observe(self, agent: str) -> Any:
        return self.env.observe(self.role_of[agent])

    def observation_space(self, agent: str) -> Space:
        return self.env.observation_space(self.role_of[agent])

    def action_space(self, agent: str) -> Space:
        return self.env.action_space(self.role_of[agent])
