"""OpenSpiel games as PettingZoo AEC envs (Farama shimmy), and the generic view of any OpenSpiel game.

``open_spiel`` and ``shimmy`` are optional (``pip install 'marllm[games]'``): they are imported when an OpenSpiel game
is built, not when this module is.

:func:`openspiel_env` builds shimmy's ``OpenSpielCompatibilityV0`` with three fixes that matter for game outcomes
(shimmy 2.0.1): shimmy counts chance nodes against ``max_game_length`` (which excludes them), so Kuhn poker is
truncated after its first bet; at a simultaneous node it reports the previous round's rewards again for every
partial joint action; and a dead step adds the last step's rewards once more. The batched env reads outcomes from
the OpenSpiel state itself (``state.returns()``), so a plain shimmy env works there too, except for the truncation.
"""

from __future__ import annotations

import difflib
import functools
from typing import Any

from pettingzoo import AECEnv

from marllm.games.env.views import GameView, Move, is_openspiel, register_fallback_view

EXTRA = "marllm[games]"

OPENSPIEL_PREFIX = "openspiel:"
"""The prefix of an OpenSpiel game string in a game name (``openspiel:kuhn_poker``)."""


def require_openspiel() -> tuple[Any, Any]:
    """``(pyspiel, shimmy)``, or an ImportError that names the optional dependencies."""
    try:  # the optional marllm[games] extra
        import pyspiel
        import shimmy
    except ImportError as error:
        raise ImportError(
            f"OpenSpiel games need the optional dependencies open_spiel and shimmy[openspiel] ({error.name} is "
            f"missing): pip install '{EXTRA}'"
        ) from error
    return pyspiel, shimmy


def openspiel_string(name: str) -> str:
    """The OpenSpiel game string of an ``openspiel:`` name (a bare game string is its own)."""
    return name.removeprefix(OPENSPIEL_PREFIX).strip()


def load_openspiel_game(game: Any) -> Any:
    """The ``pyspiel.Game`` of a game string (``kuhn_poker``, ``openspiel:kuhn_poker``), or ``game`` if it is one.

    Raises:
        ValueError: (one line, naming the game) not a game string or ``pyspiel.Game``, a game OpenSpiel has not
            registered (with close names), or parameters OpenSpiel refuses.
        ImportError: OpenSpiel is not installed (it names ``pip install 'marllm[games]'``).
    """
    pyspiel, _ = require_openspiel()
    if not isinstance(game, str):
        if isinstance(game, pyspiel.Game):
            return game
        raise ValueError(f"{game!r} is not an OpenSpiel game")
    string = openspiel_string(game)
    short, registered = string.split("(")[0].strip(), pyspiel.registered_names()
    if short not in registered:  # refused here: OpenSpiel itself would print its whole list of games first
        close = difflib.get_close_matches(short, registered, n=3)
        hint = f"; close names: {close}" if close else ""
        raise ValueError(
            f"OpenSpiel has no game {short!r}{hint} (pyspiel.registered_names() lists the {len(registered)} it has)"
        )
    try:
        return pyspiel.load_game(string)
    except pyspiel.SpielError as error:
        first = str(error).splitlines()[0].removeprefix("OpenSpiel exception: ")
        raise ValueError(f"OpenSpiel cannot load the game {string!r}: {first}") from None


@functools.cache
def _fixed_env_class() -> type:
    _, shimmy = require_openspiel()

    class OpenSpielGame(shimmy.OpenSpielCompatibilityV0):
        """shimmy's OpenSpiel env, ending when the OpenSpiel state is terminal and rewarding only applied moves."""

        def _update_termination_truncation(self) -> None:
            done = bool(self.game_state.is_terminal())
            self.terminations = {a: done for a in self.agents}
            self.truncations = {a: False for a in self.agents}

        def _update_rewards(self) -> None:
            if self.simultaneous_actions:  # a joint action is still being collected: nothing was applied yet
                self.rewards = {a: 0.0 for a in self.agents}
            else:
                super()._update_rewards()

        def _end_routine(self) -> bool:
            ended = super()._end_routine()
            if ended:  # the dead step changes nobody's reward
                self.rewards = {a: 0.0 for a in self.rewards}
            return ended

    return OpenSpielGame


def openspiel_env(game: Any, render_mode: str | None = None) -> AECEnv:
    """An OpenSpiel game as a PettingZoo AEC env, through shimmy (with the fixes in this module's docstring).

    Args:
        game: a game string (``"kuhn_poker"``, ``"repeated_game(stage_game=matrix_pd(),num_repetitions=5)"``) or a
            loaded ``pyspiel.Game``; its parameters are kept across resets (shimmy reloads the game by name).
        render_mode: shimmy's render mode (None or ``"human"``).
    """
    loaded = load_openspiel_game(game)
    parameters = loaded.get_parameters()
    return _fixed_env_class()(
        game_name=loaded.get_type().short_name, config=parameters or None, render_mode=render_mode
    )


def openspiel_factory(game: Any) -> Any:
    """A zero-argument factory of :func:`openspiel_env` games, for ``BatchedGameEnv(game_fn=...)``; ``game`` (a game
    string or a loaded ``pyspiel.Game``) is loaded here, once, not at each env it makes."""
    return functools.partial(openspiel_env, load_openspiel_game(game))


class OpenSpielView(GameView):
    """The generic view of an OpenSpiel game: for imperfect-information games the seat's information-state string,
    otherwise its observation string, each under a line naming it; moves named by ``state.action_to_string``;
    payoffs ``state.returns()``."""

    @staticmethod
    def game_state(game: AECEnv) -> Any:
        """The OpenSpiel state of a shimmy env."""
        return game.unwrapped.game_state

    @staticmethod
    def player_id(game: AECEnv, seat: str) -> int:
        """The OpenSpiel player number of a seat."""
        return int(game.unwrapped.agent_name_id_mapping[seat])

    def name(self, game: AECEnv) -> str:
        return self.title or str(game.unwrapped.game_type.long_name)

    def state(self, game: AECEnv, seat: str, moves: tuple[Move, ...] | list[Move]) -> str:
        """OpenSpiel's string of what the seat knows, under a line that says which string it is (a bare
        information state such as liar's dice's ``5`` means nothing without it)."""
        state, player, kind = self.game_state(game), self.player_id(game, seat), game.unwrapped.game_type
        perfect = kind.information == kind.information.PERFECT_INFORMATION
        if kind.provides_information_state_string and not (perfect and kind.provides_observation_string):
            what = "your information state (your private information and the public history of the game)"
            text = str(state.information_state_string(player))
        elif kind.provides_observation_string:
            what = "the game" if perfect else "your observation (your private information and what is public now)"
            text = str(state.observation_string(player))
        else:
            what, text = "the game", str(state)
        return f"You are player {player}. {what[0].upper()}{what[1:]}, as OpenSpiel writes it:\n{text or '(empty)'}"

    def legal_actions(self, game: AECEnv, seat: str) -> list[int]:
        return [int(a) for a in self.game_state(game).legal_actions(self.player_id(game, seat))]

    def move_name(self, game: AECEnv, seat: str, action: int) -> str:
        return str(self.game_state(game).action_to_string(self.player_id(game, seat), action))

    def history(self, game: AECEnv, moves: tuple[Move, ...] | list[Move]) -> tuple[int, ...]:
        return tuple(int(a) for a in self.game_state(game).history())

    def payoffs(self, game: AECEnv, returns: dict[str, float]) -> dict[str, float]:
        values = self.game_state(game).returns()
        return {seat: float(values[self.player_id(game, seat)]) for seat in game.unwrapped.possible_agents}

    def loss_payoff(self, game: AECEnv) -> float:
        return float(self.game_state(game).get_game().min_utility())

    def zero_sum(self, game: AECEnv) -> bool:
        kind = game.unwrapped.game_type
        return bool(kind.utility == kind.utility.ZERO_SUM)

    def max_moves(self, game: AECEnv) -> int | None:
        # shimmy's pyspiel.Game (there before the first reset). A simultaneous move is one answer per seat: the
        # game's length times its players bounds the answers of every kind of game.
        loaded = getattr(game.unwrapped, "_env", None)
        if not hasattr(loaded, "max_game_length"):
            return None
        return int(loaded.max_game_length()) * int(loaded.num_players())


register_fallback_view(is_openspiel, OpenSpielView())
