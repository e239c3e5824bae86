"""Players that sit at a game without learning.

Each implements the :class:`~marllm.algorithms.learner.Learner` protocol with an ``update`` that changes nothing:
``RandomMover`` (a random legal move), ``TicTacToeMinimax`` (perfect tic-tac-toe), ``MCTSPlayer`` (OpenSpiel's
MCTS bot), ``FrozenSnapshot`` (a copy of a learner whose weights never change) and ``OpponentPool`` (one of a
learner's last K snapshots per iteration). One learner in several seats (self-play) needs no adapter: the loop
(:func:`~marllm.loop.run_iteration`) rewards it in the order it acted and updates it once.
"""

from marllm.games.players.fixed import FixedPlayer, RandomMover, TicTacToeMinimax
from marllm.games.players.snapshots import FrozenSnapshot, OpponentPool

__all__ = ["FixedPlayer", "FrozenSnapshot", "OpponentPool", "RandomMover", "TicTacToeMinimax"]
