"""A game's parts built from a config's ``game`` section, the one place training and evaluation build them: the
batched game env (:func:`game_env`) and the fixed players (:func:`fixed_player`).

Training wraps the env for its learners (:func:`marllm.run.games.build_game_env`) and adds the players made from a
learner (a snapshot pool, a best response); evaluation and round-robins play the bare env against these players.
"""

from __future__ import annotations

from marllm.config.game import GameConfig
from marllm.envs.games import BatchedGameEnv
from marllm.envs.games.catalog import game_factory
from marllm.players import RandomMover, TicTacToeMinimax
from marllm.players.fixed import FixedPlayer
from marllm.players.mcts import MCTSPlayer
from marllm.players.tabular import CFRPlayer

FIXED_PLAYERS = ("random", "minimax", "mcts", "cfr")
"""The kinds of fixed player :func:`fixed_player` builds (those that need no learner)."""


def game_env(game: GameConfig, batch_size: int, seed: int | None = None) -> BatchedGameEnv:
    """``batch_size`` games of ``game`` at once, with its options, templates, parser, illegal-answer policy, discount,
    illegal-answer penalty and move cap; ``seed`` seeds the deals."""
    return BatchedGameEnv(
        game_factory(game.name, game.options),
        batch_size,
        templates=game.templates,
        parser=game.parser,
        illegal=game.illegal,
        discount=game.discount,
        illegal_penalty=game.illegal_penalty,
        max_moves=game.max_moves,
        seed=seed,
    )


def fixed_player(game: GameConfig, kind: str, name: str, seed: int) -> FixedPlayer:
    """A fresh fixed player of ``kind`` (one of :data:`FIXED_PLAYERS`) for ``game``, named ``name``, seeded.

    Raises:
        ValueError: ``kind`` is not one of :data:`FIXED_PLAYERS`.
    """
    if kind == "random":
        return RandomMover(name, seed=seed)
    if kind == "minimax":
        return TicTacToeMinimax(name, seed=seed)
    if kind == "mcts":
        return MCTSPlayer(game.info.mcts_game(), name, simulations=game.opponents.mcts_simulations, seed=seed)
    if kind == "cfr":
        return CFRPlayer(game.info.openspiel, game.opponents.cfr_iterations, name, seed=seed)
    raise ValueError(f"unknown fixed player {kind!r}; the fixed players are {list(FIXED_PLAYERS)}")
