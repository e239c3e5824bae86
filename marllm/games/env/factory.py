"""Games by name, as a config names them: a PettingZoo classic env (``tictactoe_v3``), ``openspiel:<game string>``,
or a game of one's own by reference (``my_game.py:env``, a zero-argument factory of an AEC env).

:func:`game_factory` turns a name into the zero-argument factory :class:`~marllm.games.env.BatchedGameEnv` takes;
:func:`describe_game` builds one copy to report what a config needs to check before a run starts: the game's seats,
its kind, and whether every seat moves in every game of a batch at every turn (``lockstep``).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import pkgutil
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pettingzoo.classic
from pettingzoo import AECEnv

from marllm.games.env.openspiel import OPENSPIEL_PREFIX, load_openspiel_game, openspiel_factory, openspiel_string
from marllm.utils.imports import load_reference

LOCKSTEP_GAMES = ("rps_v2",)
"""PettingZoo games in which every game of a batch lasts as many moves (the same seats, in the same order)."""

TIC_TAC_TOE = ("tictactoe_v3", "openspiel:tic_tac_toe")
"""The names under which tic-tac-toe is played (what :class:`~marllm.games.players.TicTacToeMinimax` plays)."""

MCTS_GAMES = {"tictactoe_v3": "tic_tac_toe", "connect_four_v3": "connect_four"}
"""PettingZoo games with an OpenSpiel twin whose action ids mean the same moves (tic-tac-toe's boards are each
other's transpose, a symmetry of the game): what OpenSpiel's MCTS searches for them."""


_LIMIT_HOLDEM = (
    "openspiel:universal_poker(betting=limit,numPlayers=2,numRounds=4,blind=10 5,firstPlayer=2 1 1 1,numSuits=4,"
    "numRanks=13,numHoleCards=2,numBoardCards=0 3 1 1,raiseSize=10 10 20 20,maxRaises=3 4 4 4)"
)
_NO_LIMIT_HOLDEM = (
    "openspiel:universal_poker(betting=nolimit,numPlayers=2,numRounds=4,blind=100 50,firstPlayer=2 1 1 1,"
    "numSuits=4,numRanks=13,numHoleCards=2,numBoardCards=0 3 1 1,stack=20000 20000)"
)

UNPLAYABLE: dict[str, tuple[str, str]] = {
    "chess_v6": (
        "needs the python-chess package (pip install chess), and marllm has no text view of its observation (an "
        "8×8×111 array)",
        "openspiel:chess (the board as FEN, moves in SAN: e4, Nf3)",
    ),
    "go_v5": (
        "has no text view in marllm: its observation is a 19×19×17 array (about 2,900 tokens as text)",
        "openspiel:go(board_size=9) (a text board, moves named like 'B d4')",
    ),
    "hanabi_v5": (
        "has no text view in marllm: its observation is a vector of 658 numbers (about 2,100 tokens as text)",
        "openspiel:hanabi (hands, hints and fireworks as text) or openspiel:tiny_hanabi",
    ),
    "leduc_holdem_v4": (
        "needs the rlcard package, and marllm has no text view of its observation (a vector of 36 numbers)",
        "openspiel:leduc_poker (your card, the public card and the betting as text)",
    ),
    "texas_holdem_v4": (
        "needs the rlcard package, and marllm has no text view of its observation (a vector of 72 numbers)",
        f"OpenSpiel's limit hold'em, {_LIMIT_HOLDEM}",
    ),
    "texas_holdem_no_limit_v6": (
        "needs the rlcard package, and marllm has no text view of its observation (a vector of 54 numbers)",
        f"OpenSpiel's no-limit hold'em, {_NO_LIMIT_HOLDEM}",
    ),
}
"""PettingZoo classic games marllm refuses: name -> (why it cannot be played, the OpenSpiel game to play instead)."""


def playable_classic_games() -> tuple[str, ...]:
    """The PettingZoo classic games a config may name: those installed, less :data:`UNPLAYABLE`."""
    return tuple(name for name in classic_games() if name not in UNPLAYABLE)


@functools.cache
def classic_games() -> tuple[str, ...]:
    """The PettingZoo classic env names installed (``chess_v6``, ``connect_four_v3``, ``rps_v2``, ``tictactoe_v3``,
    ...), found without importing them (some need optional packages)."""

    names = (module.name for module in pkgutil.iter_modules(pettingzoo.classic.__path__))
    return tuple(sorted(name for name in names if re.fullmatch(r"[a-z_]+_v\d+", name)))


def is_game_reference(name: str) -> bool:
    """Whether ``name`` names a game of one's own by reference (``my_game.py:env``, ``package.module:env``): a
    zero-argument factory of an AEC env (a class, or a function), loaded when the game is built."""
    return ":" in name and not is_openspiel_name(name)


def load_game_reference(name: str) -> Callable[..., AECEnv]:
    """The factory a game reference names; ``ValueError`` where it cannot be loaded or is not callable."""
    factory = load_reference(name)
    if not callable(factory):
        raise ValueError(f"{name} is a {type(factory).__name__}, not a factory of an AEC env (a class or function)")
    return factory


def is_openspiel_name(name: str) -> bool:
    """Whether ``name`` names an OpenSpiel game (``openspiel:<game string>``)."""
    return name.startswith(OPENSPIEL_PREFIX)


def check_game_name(name: str) -> None:
    """Raise ``ValueError`` unless ``name`` is an installed, playable PettingZoo classic env (not in
    :data:`UNPLAYABLE`: those are refused with the reason and the OpenSpiel game to play instead) or
    ``openspiel:<string>``."""
    if is_openspiel_name(name):
        if not openspiel_string(name):
            raise ValueError("an OpenSpiel game needs its game string after 'openspiel:', e.g. openspiel:kuhn_poker")
        return
    if is_game_reference(name):
        load_game_reference(name)
        return
    if name in UNPLAYABLE:
        why, instead = UNPLAYABLE[name]
        raise ValueError(f"{name} cannot be played: it {why}; play {instead}")
    if name not in classic_games():
        playable = playable_classic_games()
        close = difflib.get_close_matches(name, playable, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"unknown game {name!r}{hint}; a game is a PettingZoo classic env, one of {list(playable)}, "
            "openspiel:<game string> (e.g. openspiel:kuhn_poker, "
            "openspiel:repeated_game(stage_game=matrix_pd(),num_repetitions=5)), or a game of one's own by reference "
            "(my_game.py:env)"
        )


def game_factory(name: str, options: Mapping[str, Any] | None = None) -> Callable[[], AECEnv]:
    """A zero-argument factory of the game ``name`` (see the module docstring).

    Args:
        name: a PettingZoo classic env name, ``openspiel:<game string>``, or a game of one's own by reference
            (:func:`is_game_reference`).
        options: keyword arguments of the PettingZoo env function (``{"max_cycles": 1}`` for ``rps_v2``) or of a
            referenced factory; an OpenSpiel game takes its parameters in its game string instead.

    Raises:
        ValueError: an unknown name, options given to an OpenSpiel game, or a game string OpenSpiel cannot load.
        ImportError: the game needs a package that is not installed (OpenSpiel: ``pip install 'marllm[games]'``).
    """
    check_game_name(name)
    options = dict(options or {})
    if is_openspiel_name(name):
        if options:
            raise ValueError(
                f"OpenSpiel games take their parameters in the game string (openspiel:kuhn_poker(players=3)), not "
                f"as options; got options {sorted(options)}"
            )
        return openspiel_factory(name)
    if is_game_reference(name):
        return functools.partial(load_game_reference(name), **options)
    with warnings.catch_warnings():  # PettingZoo warns that its versioned modules will give way to a registry
        warnings.simplefilter("ignore", DeprecationWarning)
        module = importlib.import_module(f"pettingzoo.classic.{name}")
    return functools.partial(module.env, **options)


@dataclass(frozen=True)
class GameInfo:
    """What a config checks of a game before a run: see :func:`describe_game`."""

    name: str
    seats: tuple[str, ...]
    """The game's ``possible_agents``, in order."""
    openspiel: Any
    """The ``pyspiel.Game`` of an OpenSpiel game, else None."""
    lockstep: bool
    """Whether every seat moves in every game of a batch at every turn while no game is forfeited (matrix games,
    their repetitions, rock-paper-scissors)."""

    @property
    def sequential_perfect_information(self) -> bool:
        """Whether OpenSpiel's MCTS can play it: an OpenSpiel game of turns and perfect information, or a PettingZoo
        board with such a twin (:data:`MCTS_GAMES`)."""
        if self.name in MCTS_GAMES:
            return True
        if self.openspiel is None:
            return False
        kind = self.openspiel.get_type()
        return kind.dynamics == kind.dynamics.SEQUENTIAL and kind.information == kind.information.PERFECT_INFORMATION

    def mcts_game(self) -> Any:
        """The OpenSpiel game (a string or ``pyspiel.Game``) that MCTS searches for this game."""
        return MCTS_GAMES.get(self.name, self.openspiel)


def describe_game(name: str, options: Mapping[str, Any] | None = None) -> GameInfo:
    """Build one copy of the game and report its seats and kind (the errors of :func:`game_factory`, and
    ``ValueError`` where the factory returns no AEC env)."""
    factory = game_factory(name, options)
    game = factory()
    if not isinstance(game, AECEnv):
        raise ValueError(
            f"{name} returned {type(game).__name__}, not a PettingZoo AEC env: a game's factory must return one (an "
            "instance of a pettingzoo.AECEnv subclass)"
        )
    try:
        seats = tuple(game.possible_agents)
    finally:
        game.close()
    loaded = load_openspiel_game(name) if is_openspiel_name(name) else None
    if loaded is not None:
        kind = loaded.get_type()
        lockstep = kind.dynamics == kind.dynamics.SIMULTANEOUS and (
            kind.short_name.startswith("matrix_") or kind.short_name == "repeated_game"
        )
    else:
        lockstep = name in LOCKSTEP_GAMES
    return GameInfo(name, seats, loaded, lockstep)
