"""Checks of a batched game env's arguments: the game factory, the seats of its copies, the illegal-move policy and
the credit settings."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from pettingzoo import AECEnv

ILLEGAL_POLICIES = ("forfeit", "random")
"""What an answer naming no legal move gets: the player loses the game, or a random legal move is played."""

DEFAULT_MAX_MOVES = 1000
"""The move cap of a game whose view gives no bound of its own (:meth:`~marllm.games.env.GameView.max_moves`)."""


def make_game(game_fn: Callable[[], AECEnv]) -> AECEnv:
    game = game_fn()
    if not isinstance(game, AECEnv):
        raise TypeError(f"game_fn must return a PettingZoo AEC env, got {type(game).__name__}")
    return game


def check_seats(games: Sequence[AECEnv]) -> list[str]:
    seats = list(games[0].possible_agents)
    if not seats:
        raise ValueError("the game has no possible_agents: a batched game needs at least one seat")
    for index, game in enumerate(games[1:], 1):
        if list(game.possible_agents) != seats:
            raise ValueError(f"game {index} has seats {list(game.possible_agents)}, game 0 {seats}: they must be equal")
    return seats


def reset_game(
    game: AECEnv, seed: int, index: int, seats: Sequence[str], name: Callable[[AECEnv], str] | None = None
) -> None:
    """``game.reset(seed=seed)``, refusing a game whose ``reset()`` left it with agents other than its seats
    (``possible_agents``), or with an ``agent_selection`` that is none of its agents (``index``: the game's place in
    the batch, ``name``: gives the game's name for the message, e.g. its view's ``name``).

    Raises:
        ValueError: naming the game of the batch, the agents it set and the seats they must be among.
    """
    game.reset(seed=seed)
    agents = list(getattr(game, "agents", None) or ())
    unknown = [agent for agent in agents if agent not in seats]
    selected = getattr(game, "agent_selection", None)
    if not unknown and (not agents or selected in agents):
        return
    which = f"game {index} of the batch" + (f" ({name(game)})" if name is not None else "")
    if unknown:
        raise ValueError(
            f"{which}: after reset() its agents are {agents}, and {unknown} are not among its "
            f"possible_agents {list(seats)}; a game's reset() must set agents to (some of) its possible_agents"
        )
    raise ValueError(
        f"{which}: after reset() its agent_selection is {selected!r}, not one of its agents "
        f"{agents}; a game's reset() must select the agent to move first"
    )


def check_policy(illegal: str, forfeit_payoffs: Any) -> tuple[str, tuple[float, float] | None]:
    if illegal not in ILLEGAL_POLICIES:
        raise ValueError(f"illegal must be one of {list(ILLEGAL_POLICIES)}, got {illegal!r}")
    if forfeit_payoffs is None:
        return illegal, None
    try:
        loser, others = (float(v) for v in forfeit_payoffs)
    except (TypeError, ValueError) as error:
        message = f"forfeit_payoffs must be (loser's payoff, others' payoff), got {forfeit_payoffs!r}"
        raise ValueError(message) from error
    if not np.isfinite([loser, others]).all():
        raise ValueError(f"forfeit_payoffs must be finite, got {forfeit_payoffs!r}")
    return illegal, (loser, others)


def check_credit(discount: float, illegal_penalty: float) -> tuple[float, float]:
    if isinstance(discount, bool) or not isinstance(discount, int | float) or not 0 < discount <= 1:
        raise ValueError(f"discount must be a number in (0, 1], got {discount!r}")
    if isinstance(illegal_penalty, bool) or not isinstance(illegal_penalty, int | float):
        raise ValueError(f"illegal_penalty must be a number >= 0, got {illegal_penalty!r}")
    if not 0 <= illegal_penalty < float("inf"):
        raise ValueError(f"illegal_penalty must be a finite number >= 0, got {illegal_penalty!r}")
    return float(discount), float(illegal_penalty)


def check_max_moves(max_moves: Any, default: int | None) -> int:
    """``max_moves`` (a positive int); for None ``default`` (the game's own bound), else :data:`DEFAULT_MAX_MOVES`."""
    if max_moves is None:
        return DEFAULT_MAX_MOVES if default is None else max(1, int(default))
    if isinstance(max_moves, bool) or not isinstance(max_moves, int) or max_moves < 1:
        raise ValueError(f"max_moves must be a positive int (moves per game) or None, got {max_moves!r}")
    return max_moves
