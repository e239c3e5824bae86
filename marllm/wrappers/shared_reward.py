"""SharedReward: every agent is rewarded with a fixed linear mix of all agents' rewards."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pettingzoo import AECEnv
from pettingzoo.utils.wrappers import BaseWrapper

from marllm.envs.info_keys import BATCH_REWARDS, TURN_BATCH_REWARDS, TURN_GAMES


def cooperation_matrix(num_agents: int, weight: float) -> np.ndarray:
    """``C[i, i] = 1`` and ``C[i, j] = weight`` for ``i != j``: r_i + λ Σ_{j≠i} r_j.

    ``weight = 1`` is CORY's collective reward (r1 + r2); ``weight > 0`` is cooperative, ``weight < 0`` competitive,
    ``weight = 0`` leaves each agent its own reward.
    """
    if num_agents < 1:
        raise ValueError(f"num_agents must be >= 1, got {num_agents}")
    if not np.isfinite(weight):
        raise ValueError(f"the cooperation weight λ must be a finite number, got {weight}")
    matrix = np.full((num_agents, num_agents), float(weight))
    np.fill_diagonal(matrix, 1.0)
    return matrix


def check_coefficients(
    coefficients: Sequence[Sequence[float]] | np.ndarray | None, agents: Sequence[Any]
) -> np.ndarray:
    """Validate an N×N coefficient matrix for ``agents`` (None = all ones)."""
    n = len(agents)
    if coefficients is None:
        return np.ones((n, n))
    try:
        matrix = np.asarray(coefficients, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"reward coefficients must be an {n}x{n} matrix of numbers, got {coefficients!r}") from error
    if matrix.shape != (n, n):
        raise ValueError(
            f"reward coefficients must be an {n}x{n} matrix (one row and one column per agent {list(agents)}), "
            f"got shape {matrix.shape}"
        )
    if not np.all(np.isfinite(matrix)):
        raise ValueError(f"reward coefficients must be finite, got {matrix.tolist()}")
    return matrix


class SharedReward(BaseWrapper):
    """Rewards become ``C · r``: agent i receives ``Σ_j C[i, j] r_j`` for the rewards r of ``possible_agents``.

    Works on any AEC environment: the scalar ``rewards`` (and so the cumulative reward ``last()`` returns) are mixed
    step by step. Environments that batch several dialogues per episode, like :class:`SequentialTextEnv`, also give
    each agent its per-dialogue episode rewards as ``infos[agent]["batch_rewards"]``; those vectors are mixed with the
    same matrix (an agent that already left the episode keeps contributing its last vector). An agent that speaks
    several times also reports one row per turn (``turn_batch_rewards``); each turn is mixed as its own reward plus
    the partners' episode rewards: turn t of agent i gets ``C[i, i] r_i,t + Σ_{j≠i} C[i, j] r_j``.

    Args:
        env: the environment to wrap.
        coefficients: N×N matrix over ``env.possible_agents`` order; default all ones (CORY's r1 + r2).
    """

    def __init__(self, env: AECEnv, coefficients: Sequence[Sequence[float]] | np.ndarray | None = None):
        super().__init__(env)
        self.coefficients = check_coefficients(coefficients, env.possible_agents)
        self._index = {agent: i for i, agent in enumerate(env.possible_agents)}

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.env.reset(seed=seed, options=options)
        self.rewards = {agent: 0.0 for agent in self.env.agents}
        self._cumulative_rewards = {agent: 0.0 for agent in self.env.agents}
        self._episode_vectors: dict[Any, np.ndarray] = {}
        self.infos = self._mix_infos()

    def step(self, action: Any) -> None:
        acting = self.env.agent_selection
        self.env.step(action)
        own = np.zeros(len(self._index))
        for agent, reward in self.env.rewards.items():
            own[self._index[agent]] = reward
        mixed = self.coefficients @ own
        present = self.env.agents
        self.rewards = {agent: float(mixed[self._index[agent]]) for agent in present}
        # last() must return the reward accumulated since the agent last acted, as in every AEC env.
        previous = self._cumulative_rewards
        self._cumulative_rewards = {
            agent: (0.0 if agent == acting else previous.get(agent, 0.0)) + self.rewards[agent] for agent in present
        }
        self.infos = self._mix_infos()

    def _mix_infos(self) -> dict[Any, dict[str, Any]]:
        inner = self.env.infos
        for agent, info in inner.items():
            if BATCH_REWARDS in info:
                self._episode_vectors[agent] = np.asarray(info[BATCH_REWARDS], dtype=np.float64)
        if not self._episode_vectors:
            return dict(inner)
        width = {v.shape for v in self._episode_vectors.values()}
        if len(width) != 1:
            raise ValueError(f"agents report batch_rewards of different shapes {sorted(width)}; cannot mix them")
        stacked = np.zeros((len(self._index), *width.pop()))
        for agent, vector in self._episode_vectors.items():
            stacked[self._index[agent]] = vector
        mixed = self.coefficients @ stacked  # (N, B)
        infos = {}
        for agent, info in inner.items():
            if BATCH_REWARDS not in info:
                infos[agent] = info
                continue
            i = self._index[agent]
            infos[agent] = {**info, BATCH_REWARDS: mixed[i]}
            if TURN_BATCH_REWARDS in info:
                # The episode's mix with this turn's own reward in place of the episode's: written as a correction,
                # so that a turn whose reward is the episode's gets exactly the mixed episode reward.
                own_weight = self.coefficients[i, i]
                if TURN_GAMES in info:  # turn t covers the dialogues (games) turn_games[t] only
                    infos[agent][TURN_BATCH_REWARDS] = [
                        mixed[i][rows] + own_weight * (np.asarray(turn, dtype=np.float64) - stacked[i][rows])
                        for turn, rows in zip(info[TURN_BATCH_REWARDS], info[TURN_GAMES], strict=True)
                    ]
                else:
                    turns = np.asarray(info[TURN_BATCH_REWARDS], dtype=np.float64)  # (T, B)
                    infos[agent][TURN_BATCH_REWARDS] = mixed[i] + own_weight * (turns - stacked[i])
        return infos
