"""What an opponent can need of the game (:data:`NEEDS`), each a check that names who needs it: tic-tac-toe, a
turn-taking game of perfect information, OpenSpiel installed, a small OpenSpiel game."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from marllm.games.env.factory import TIC_TAC_TOE
from marllm.games.env.info_states import NotEnumerableError, enumerate_info_states
from marllm.games.env.openspiel import require_openspiel

if TYPE_CHECKING:
    from marllm.games.settings import GameConfig

SMALL_GAME = "small_game"
"""The need of a game whose information states enumerate (checked once for every seat and measurement needing it)."""


def _tic_tac_toe(game: GameConfig, who: str) -> None:
    if game.name not in TIC_TAC_TOE:
        raise ValueError(f"{who} plays tic-tac-toe only ({' or '.join(TIC_TAC_TOE)}), not {game.name}")


def _perfect_information(game: GameConfig, who: str) -> None:
    if not game.info.sequential_perfect_information:
        raise ValueError(
            f"{who} searches the whole state of a turn-taking game of perfect information (an OpenSpiel one, "
            f"tictactoe_v3 or connect_four_v3); {game.name} is not one"
        )


def _openspiel(game: GameConfig, who: str) -> None:
    try:
        require_openspiel()
    except ImportError as error:
        raise ValueError(f"{who} is OpenSpiel's: {error}") from None


def _small_game(game: GameConfig, who: str) -> None:
    if game.info.openspiel is None:
        raise ValueError(
            f"{who} needs an OpenSpiel game (openspiel:<game string>, e.g. openspiel:kuhn_poker) whose information "
            f"states can be enumerated; {game.name} is a PettingZoo game"
        )
    try:
        enumerate_info_states(game.info.openspiel)
    except NotEnumerableError as error:
        raise ValueError(f"{who}: {error}") from None


NEEDS: dict[str, Callable[[GameConfig, str], None]] = {
    "tic_tac_toe": _tic_tac_toe,
    "perfect_information": _perfect_information,
    "openspiel": _openspiel,
    SMALL_GAME: _small_game,
}
"""What an opponent can need of the game -> its check, ``check(game, who)`` raising ``ValueError`` naming ``who``:
tic-tac-toe, a turn-taking game of perfect information, OpenSpiel installed, a small OpenSpiel game (one whose
information states enumerate, :mod:`marllm.games.env.info_states`)."""


def check_needs(game: GameConfig, who: str, needs: tuple[str, ...]) -> None:
    """Refuse ``game`` where it lacks one of ``needs`` (names of :data:`NEEDS`), naming ``who``."""
    for need in needs:
        NEEDS[need](game, who)
