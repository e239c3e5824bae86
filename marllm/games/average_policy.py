"""The average of a sequence of tabulated policies, as the strategy it mixes: what self-play reports in a zero-sum game.

Learners that follow a policy gradient against each other cycle around an equilibrium rather than settle on it; what
converges (in fictitious play, CFR, NFSP) is the *average* of the iterates: playing one of them, drawn uniformly at the
start of each game. :class:`AveragePolicy` keeps that average as one behaviour policy (Kuhn's theorem: in a game of
perfect recall every mixture of behaviour policies has an equivalent one): at an information state ``s`` of player
``i``, each iterate's probabilities weighted by ``i``'s own probability of reaching ``s`` under it,

    avg(a | s) = sum_t reach_t(s) * policy_t(a | s) / sum_t reach_t(s),

where ``reach_t(s)`` is the product of ``policy_t``'s probabilities of ``i``'s own earlier moves on the way to ``s``
(the other players' and chance's moves do not depend on ``i``'s policy, so they cancel). OpenSpiel's
``PolicyAggregator`` computes the same from a list of policies by walking the tree per call; this class adds one
policy at a time into two running sums, which it saves and restores with a run's checkpoints.

With ``weighting="linear"`` the k-th policy added weighs k instead of 1 (CFR+'s linear averaging): the early policies
fade, which matters where learning spends its first iterations far from where it ends.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from marllm.games.env.info_states import GameTree, policy_key
from marllm.games.settings import POLICY_AVERAGES


class AveragePolicy:
    """The reach-weighted average of the ``TabularPolicy`` objects :meth:`add` was given (see the module docstring).

    Args:
        tree: the game's information states (:attr:`ExactGame.tree <marllm.games.exploitability.ExactGame>`);
            the policies added are ``TabularPolicy`` objects of its solved twin, rows in its order.
        weighting: ``uniform`` (every policy the same weight) or ``linear`` (the k-th added weighs k).
    """

    def __init__(self, tree: GameTree, weighting: str = "uniform"):
        if weighting not in POLICY_AVERAGES:
            raise ValueError(f"weighting must be one of {list(POLICY_AVERAGES)}, got {weighting!r}")
        self.tree, self.weighting = tree, weighting
        uniform = tree.uniform_policy()
        self.own_moves = [_own_moves(tree, uniform.state_lookup, info) for info in tree.info_states]
        shape = uniform.action_probability_array.shape
        self.weighted = np.zeros(shape)
        self.reach = np.zeros(shape[0])
        self.count = 0

    def add(self, policy: Any) -> None:
        """Mix in ``policy`` (a ``TabularPolicy`` of the solved twin) with the next weight."""
        table = np.asarray(policy.action_probability_array, dtype=np.float64)
        if table.shape != self.weighted.shape:
            raise ValueError(f"the policy's table has shape {table.shape}, the game's is {self.weighted.shape}")
        reach = np.array([np.prod([table[row, action] for row, action in moves]) for moves in self.own_moves])
        reach *= self.count + 1 if self.weighting == "linear" else 1
        self.weighted += reach[:, None] * table
        self.reach += reach
        self.count += 1

    def policy(self) -> Any:
        """The average as a ``TabularPolicy``; where no policy added reaches a state, the uniform policy's row.

        Raises:
            ValueError: no policy was added.
        """
        if self.count == 0:
            raise ValueError("the average of no policy: add one first")
        average = self.tree.uniform_policy()
        reached = self.reach > 0
        average.action_probability_array[reached] = self.weighted[reached] / self.reach[reached, None]
        return average

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The two running sums (float64) and the count, as a checkpoint saves them."""
        tensors = {"weighted": torch.from_numpy(self.weighted.copy()), "reach": torch.from_numpy(self.reach.copy())}
        return tensors, {"count": self.count}

    def load_state_dict(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` gave; ``ValueError`` if its shapes are not this game's."""
        weighted, reach = tensors["weighted"].numpy(), tensors["reach"].numpy()
        if weighted.shape != self.weighted.shape or reach.shape != self.reach.shape:
            raise ValueError(
                f"the saved average policy has a table of shape {tuple(weighted.shape)}, this game's is "
                f"{self.weighted.shape}"
            )
        self.weighted, self.reach, self.count = weighted.astype(np.float64), reach.astype(np.float64), meta["count"]


def _own_moves(tree: GameTree, lookup: dict[str, int], info: Any) -> list[tuple[int, int]]:
    """(row, action) of each earlier move of ``info``'s player on the way to it, in the solved twin's history."""
    state = tree.solved.new_initial_state()
    moves = []
    for action in info.solved.history():
        if not state.is_chance_node() and state.current_player() == info.player:
            moves.append((lookup[policy_key(tree.solved, state, info.player)], int(action)))
        state.apply_action(action)
    return moves
