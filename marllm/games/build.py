"""A game's parts built from a config's ``game`` section, the one place training and evaluation build them: the
batched game env (:func:`game_env`) and the fixed players (:func:`fixed_player`).

Training wraps the env for its learners (:func:`marllm.games.training.build_game_env`) and adds the players made from a
learner (a snapshot pool, a best response); evaluation and round-robins play the bare env against these players.
"""

from __future__ import annotations

from typing import Any

from marllm.games.env import BatchedGameEnv
from marllm.games.env.factory import game_factory
from marllm.games.opponents import FIXED_OPPONENTS, OPPONENT_REGISTRY, Seat, SeatArguments, build_opponent, opponent
from marllm.games.settings import GameConfig


def game_env(game: GameConfig, batch_size: int, seed: int | None = None) -> BatchedGameEnv:
    """``batch_size`` games of ``game`` at once, with its options, templates, parser, illegal-answer policy, discount,
    illegal-answer penalty, move cap and history; ``seed`` seeds the deals."""
    return BatchedGameEnv(
        game_factory(game.name, game.options),
        batch_size,
        templates=game.templates,
        parser=game.parser,
        illegal=game.illegal,
        discount=game.discount,
        illegal_penalty=game.illegal_penalty,
        max_moves=game.max_moves,
        history=game.history,
        seed=seed,
    )


def fixed_player(game: GameConfig, kind: str, name: str, seed: int) -> Any:
    """A fresh player of the opponent ``kind`` (one of :data:`~marllm.games.opponents.FIXED_OPPONENTS`, or an
    opponent class by reference) for ``game``, named ``name``, seeded, with the settings of the config's seat of it
    (its defaults where no seat names it).

    Raises:
        ValueError: ``kind`` is neither, or is an opponent that watches a learner.
    """
    if not (kind in FIXED_OPPONENTS or OPPONENT_REGISTRY.is_reference(kind)) or opponent(kind).learner is not None:
        raise ValueError(f"unknown fixed player {kind!r}; the fixed players are {list(FIXED_OPPONENTS)}")
    # the settings of the config's seat of this opponent, where it seats one; else the opponent's defaults
    seated = [seat.settings for seat in game.seats if seat.kind == kind]
    settings = seated[0] if seated else Seat.from_config(kind, "--opponent").settings
    return build_opponent(kind, SeatArguments(game, name, seed, settings=settings))
