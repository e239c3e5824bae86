"""OpenSpiel's MCTS bot as a player that does not learn (``open_spiel.python.algorithms.mcts``).

MCTS searches the full game state (rebuilt from the observation's ``history``, chance outcomes included): it is a
perfect-information algorithm, meant for games like tic-tac-toe and connect four; on a game with hidden information
it would see the hidden cards. OpenSpiel's bot supports sequential games with terminal rewards only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from marllm.games.env.openspiel import load_openspiel_game
from marllm.games.players.fixed import FixedPlayer

if TYPE_CHECKING:
    from marllm.games.opponents import SeatArguments


class MCTSPlayer(FixedPlayer):
    """Plays the move OpenSpiel's ``MCTSBot`` (UCT with random-rollout evaluation) picks.

    Args:
        game: the OpenSpiel game string (``"tic_tac_toe"``) or ``pyspiel.Game`` the batched env plays; its action
            ids are the env's ``legal_actions``.
        name: the player's id.
        simulations: MCTS simulations per move (stronger and slower with more).
        uct_c: the UCT exploration constant.
        rollouts: random rollouts per leaf evaluation.
        seed: seeds the search and the rollouts.
    """

    def __init__(
        self,
        game: Any,
        name: str = "mcts",
        simulations: int = 100,
        uct_c: float = 2.0,
        rollouts: int = 1,
        seed: int = 0,
    ):
        super().__init__(name)
        self.game = load_openspiel_game(game)
        from open_spiel.python.algorithms import mcts  # OpenSpiel: the optional marllm[games] extra

        random_state = np.random.RandomState(seed)
        evaluator = mcts.RandomRolloutEvaluator(n_rollouts=rollouts, random_state=random_state)
        self.bot = mcts.MCTSBot(self.game, uct_c, simulations, evaluator, random_state=random_state, solve=True)

    @classmethod
    def from_seat(cls, seat: SeatArguments) -> MCTSPlayer:
        """An ``mcts`` seat's player: the game's MCTS twin, its settings' ``simulations`` per move."""
        game = seat.game
        return cls(game.info.mcts_game(), seat.name, simulations=seat.settings.simulations, seed=seat.seed)

    def choose(self, names: Sequence[str], actions: Sequence[int], history: Sequence[int]) -> str:
        state = self.game.new_initial_state()
        for action in history:
            state.apply_action(int(action))
        action = int(self.bot.step(state))
        if action not in actions:
            raise ValueError(f"player {self.name!r}: MCTS chose action {action}, not among the legal {list(actions)}")
        return names[list(actions).index(action)]
