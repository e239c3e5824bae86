"""RoleBaselines: SPIRAL's role-conditioned advantage estimation (RAE) as a reward wrapper.

Liu et al. (2025), "SPIRAL: Self-Play on Zero-Sum Games Incentivizes Reasoning via Multi-Agent Multi-Turn
Reinforcement Learning", §3: roles differ in expected return (the first mover's advantage), so a running baseline per
(player, role) keeps one role's better odds from reading as a better policy. The baseline is an exponential moving
average of the role's *episode returns* (one per dialogue or game), stepped once per episode with their mean, and each
return is compared with the baseline from before the episode (SPIRAL's code reads the baseline, then updates it), so a
return never lowers its own advantage. Every move of one game sees the same baseline; the baseline is subtracted from
the game's return before the move's discount: a move credited ``γ^k · R − penalty`` is trained on
``γ^k · (R − b) − penalty``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
from pettingzoo import AECEnv
from pettingzoo.utils.wrappers import BaseWrapper

from marllm.envs.info_keys import BATCH_REWARDS, TURN_BATCH_REWARDS, TURN_DISCOUNTS, TURN_GAMES
from marllm.utils.errors import CheckpointError


def check_decay(decay: float) -> float:
    """``decay`` if it is a number in [0, 1), else a ValueError naming it."""
    if isinstance(decay, bool) or not isinstance(decay, int | float) or not 0 <= decay < 1:
        raise ValueError(f"the baseline decay must be a number in [0, 1) (SPIRAL: 0.95), got {decay!r}")
    return float(decay)


def step_baselines(
    returns: Mapping[Hashable, Sequence[float]], baselines: Mapping[Hashable, float], decay: float
) -> dict[Hashable, float]:
    """One EMA step per key: ``b_k ← decay · b_k + (1 − decay) · mean(returns[k])`` (a key new to ``baselines``
    starts at 0). Returns a new dict; ``baselines`` is not changed; keys without returns keep their value."""
    check_decay(decay)
    updated = dict(baselines)
    for key, values in returns.items():
        if len(values):
            updated[key] = decay * float(baselines.get(key, 0.0)) + (1 - decay) * float(np.mean(values))
    return updated


class RoleBaselines(BaseWrapper):
    """Each agent's trained rewards minus the running baseline of its (player, role), stepped once per episode.

    At the end of an episode, for every agent whose info holds per-dialogue ``batch_rewards`` (the episode's return
    R of each dialogue or game, as the wrappers below mixed it): every turn row of ``turn_batch_rewards`` (or the
    ``batch_rewards`` of a one-turn agent) becomes ``reward − discount · b``, with ``b`` the baseline before the
    episode and ``discount`` the row's ``turn_discounts`` (1 where the env reports none); then the baseline takes
    one EMA step with the mean of R over the dialogues the agent acted in. The task rewards are left alone.

    Args:
        env: the env to wrap, outermost (over SharedReward and RolePermutation: the returns it sees are the ones
            the learners train on, and the ``role`` in each info is the role the agent played).
        decay: the EMA's weight on the old baseline, in [0, 1) (SPIRAL: 0.95).
        players: agent id -> the player whose baselines it uses (one learner in several seats is one player); only
            these agents' rewards change (a fixed opponent's are left alone). None: every agent is its own player.
    """

    def __init__(self, env: AECEnv, decay: float = 0.95, players: Mapping[str, str] | None = None):
        super().__init__(env)
        self.decay = check_decay(decay)
        self.players = None if players is None else dict(players)
        self.values: dict[tuple[str, str], float] = {}
        """The running baselines by (player, role)."""
        self._episode_infos: dict[str, dict[str, Any]] | None = None

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self._episode_infos = None
        self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> None:
        self.env.step(action)
        if self._episode_infos is None and self._episode_over():
            self._episode_infos = self._advantages()

    @property
    def infos(self) -> dict[str, dict[str, Any]]:
        inner = self.env.infos
        if self._episode_infos is None:
            return inner
        return {agent: self._episode_infos.get(agent, info) for agent, info in inner.items()}

    def _episode_over(self) -> bool:
        agents = self.env.agents
        terminations, truncations = self.env.terminations, self.env.truncations
        return bool(agents) and all(terminations[a] or truncations[a] for a in agents)

    def _advantages(self) -> dict[str, dict[str, Any]]:
        """The episode's infos with the baselines subtracted, and the baselines stepped (once per key)."""
        adjusted: dict[str, dict[str, Any]] = {}
        returns: dict[tuple[str, str], list[float]] = defaultdict(list)
        for agent, info in self.env.infos.items():
            if BATCH_REWARDS not in info or (self.players is not None and agent not in self.players):
                continue
            player = agent if self.players is None else self.players[agent]
            key = (player, str(info.get("role", agent)))
            baseline = self.values.get(key, 0.0)
            episode = np.asarray(info[BATCH_REWARDS], dtype=np.float64)  # (B,)
            turns, acted = _turn_rows(info, len(episode))
            discounts = info.get(TURN_DISCOUNTS)
            if discounts is None:
                discounts = [np.ones(len(rows)) for rows in acted]
            changed = {**info, BATCH_REWARDS: episode - baseline}
            if TURN_BATCH_REWARDS in info:
                changed[TURN_BATCH_REWARDS] = [
                    np.asarray(turn, dtype=np.float64) - baseline * np.asarray(discount, dtype=np.float64)
                    for turn, discount in zip(turns, discounts, strict=True)
                ]
            adjusted[agent] = changed
            if acted:
                games = np.unique(np.concatenate([np.asarray(rows, dtype=np.int64) for rows in acted]))
                returns[key].extend(episode[games].tolist())
        self.values = step_baselines(returns, self.values, self.decay)
        return adjusted

    def state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The running baselines, as (no tensors, JSON-able meta), for a checkpoint."""
        return {}, {"decay": self.decay, "values": [[*key, value] for key, value in sorted(self.values.items())]}

    def load_state_dict(self, tensors: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Raises:
            CheckpointError: the entries are not (player, role, value) triples.
        """
        try:
            values = {(str(player), str(role)): float(value) for player, role, value in meta["values"]}
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"the role baselines {meta!r} are not (player, role, value) triples") from error
        self.values = values


def _turn_rows(info: Mapping[str, Any], width: int) -> tuple[list[Any], list[np.ndarray]]:
    """The agent's trained reward rows per turn and the dialogues each covers (every one of ``width`` where the env
    reports no ``turn_games``)."""
    turns = list(info.get(TURN_BATCH_REWARDS, [info[BATCH_REWARDS]]))
    acted = list(info.get(TURN_GAMES, [np.arange(width)] * len(turns)))
    return turns, acted
