"""Players that sit at a game without learning, and the adapters that seat learners.

Each implements the :class:`~marllm.algorithms.learner.Learner` protocol with an ``update`` that changes nothing:
``RandomMover`` (a random legal move), ``TicTacToeMinimax`` (perfect tic-tac-toe), ``MCTSPlayer`` (OpenSpiel's
MCTS bot), ``FrozenSnapshot`` (a copy of a learner whose weights never change) and ``OpponentPool`` (one of a
learner's last K snapshots per iteration). ``share_learner`` seats one learner in several seats (self-play), updated
once and rewarded in the order it acted.
"""

from marllm.players.fixed import FixedPlayer, RandomMover, TicTacToeMinimax
from marllm.players.self_play import share_learner
from marllm.players.snapshots import FrozenSnapshot, OpponentPool

__all__ = ["FixedPlayer", "FrozenSnapshot", "OpponentPool", "RandomMover", "TicTacToeMinimax", "share_learner"]
