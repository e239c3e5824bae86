"""Game views: how a game is shown to a seat (its prompt fields), how its moves are named, and what it paid.

A view is stateless: every method reads the game object (an AEC env, possibly wrapped) and the moves played so far
in it. Views are registered here by a game's name (a PettingZoo env's ``metadata["name"]``, an OpenSpiel game's short
name); :func:`~marllm.games.env.view_lookup.view_for` finds a game's, and games without a view of their own get the
generic one: OpenSpiel's information-state (or observation) string through shimmy, or the PettingZoo observation as
text, with the legal moves by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
from pettingzoo import AECEnv


class Move(NamedTuple):
    """One move applied to a game: who made it, the game's action id, and the move's name."""

    seat: str
    action: int
    name: str


FREE_TEXT = -1
"""The action id a free-text move is recorded with (:meth:`GameView.free_text`); its name is the answer itself."""


class GameView:
    """The generic view of a PettingZoo AEC game; subclasses override what their game shows better.

    Methods take the game (an AEC env) and a seat (one of its agents); ``moves`` are the moves applied so far.
    """

    title: str = ""
    """The game's name in prompts; empty: the env's ``metadata["name"]``."""

    def name(self, game: AECEnv) -> str:
        """The game's name in prompts."""
        return self.title or str(game.unwrapped.metadata.get("name", type(game.unwrapped).__name__))

    def rules(self, game: AECEnv) -> str:
        """A short statement of the rules for the prompt ("" if none)."""
        return ""

    def player(self, game: AECEnv, seat: str) -> str:
        """What the seat is called in the prompt (a mark, a colour, a position)."""
        return seat

    def state(self, game: AECEnv, seat: str, moves: Sequence[Move]) -> str:
        """What the seat sees of the game now: the PettingZoo observation as text."""
        observation = game.observe(seat)
        if isinstance(observation, Mapping) and "observation" in observation:
            observation = observation["observation"]
        if isinstance(observation, np.ndarray):
            return f"Observation (array of shape {observation.shape}):\n{np.array2string(observation)}"
        return f"Observation: {observation}"

    def legal_actions(self, game: AECEnv, seat: str) -> list[int]:
        """The action ids legal for the seat: the observation's or the info's ``action_mask``, else every action
        of its ``Discrete`` action space.

        Raises:
            ValueError: the game marks no legal action (no ``action_mask``) and the seat's ``action_space`` is not
                ``Discrete`` (None, a ``Box`` ...).
        """
        observation = game.observe(seat)
        mask = observation.get("action_mask") if isinstance(observation, Mapping) else None
        if mask is None:
            mask = game.infos.get(seat, {}).get("action_mask")
        if mask is not None:
            return [int(a) for a in np.flatnonzero(mask)]
        space = game.action_space(seat)
        if not hasattr(space, "n"):
            raise ValueError(
                f"game {self.name(game)!r}: seat {seat!r} has action space {space!r}, which is not Discrete, and no "
                "action_mask; a batched game needs discrete moves: its action_space(seat) must return a gymnasium "
                "Discrete, or its observation (a dict) or info must hold an action_mask of the legal actions"
            )
        return list(range(int(space.start), int(space.start + space.n)))

    def move_name(self, game: AECEnv, seat: str, action: int) -> str:
        """The name of an action in prompts and answers."""
        return str(action)

    def legal_moves(self, game: AECEnv, seat: str) -> list[tuple[int, str]]:
        """(action id, name) of each legal move of the seat, in the order the prompt lists them; none on a free-text
        turn (:meth:`free_text`)."""
        if self.free_text(game, seat):
            return []
        return [(a, self.move_name(game, seat, a)) for a in self.legal_actions(game, seat)]

    def free_text(self, game: AECEnv, seat: str) -> bool:
        """Whether the seat's move now is free text (a message the other seats read) rather than one of named legal
        moves: the prompt then lists no move, no parser reads the answer, and the game's ``step`` is given the answer
        itself (a ``str``), never an illegal one. False here: a view says."""
        return False

    def delta(self, game: AECEnv, seat: str, new_moves: Sequence[Move], moves: str) -> str:
        """What the seat reads at a later turn when a game is played as one token sequence per seat (``game.history:
        sequence``): it read its first prompt and wrote its answers, so this is what it needs now, ideally only what
        is new: ``new_moves`` are the other seats' moves since its last answer, ``moves`` the legal moves as a prompt
        lists them (empty on a free-text turn). Here, for any game: its :meth:`state` now, then the request, since
        only a view knows whether its moves may be shown as they come (a simultaneous move may not) and what its state
        holds; a view whose state repeats the history shows only what is new instead (the repeated matrix games' last
        round, Deal or no deal's turns since)."""
        ask = "Your message:" if self.free_text(game, seat) else f"Legal moves: {moves}\nYour move:"
        return f"\n{self.state(game, seat, new_moves)}\n{ask}"

    def metrics(self, game: AECEnv, seat: str) -> Mapping[str, float]:
        """The seat's own measures of one finished game (an agreement, a message's length), beside the env's: each
        key is averaged over the batch's games that report it and logged as ``<learner>/game/<seat>/<key>``. None
        here: a view says."""
        return {}

    def batch_metrics(self, games: Sequence[AECEnv], seat: str) -> Mapping[str, float]:
        """The seat's measures of a whole batch of finished games, that no game has alone (the mutual information
        between a hidden state and a move, estimated over the batch), logged as :meth:`metrics`' are. None here: a
        view says."""
        return {}

    def history(self, game: AECEnv, moves: Sequence[Move]) -> tuple[int, ...]:
        """The game so far as action ids, for scripted players (here: the moves applied)."""
        return tuple(move.action for move in moves)

    def payoffs(self, game: AECEnv, returns: Mapping[str, float]) -> dict[str, float]:
        """Each seat's payoff of a finished game; ``returns`` sums the game's step rewards (the AEC ``rewards``
        after each move)."""
        return dict(returns)

    def loss_payoff(self, game: AECEnv) -> float:
        """The payoff of a seat that forfeits (the game's loss)."""
        return -1.0

    def zero_sum(self, game: AECEnv) -> bool:
        """Whether the payoffs of every game sum to zero (a win is another seat's loss); False here: a view says."""
        return False

    def forfeit_payoffs(self, game: AECEnv) -> tuple[float, float]:
        """(the forfeiting seat's payoff, every other seat's): the game's loss, and in a zero-sum game what winning
        pays, the loss shared out (−loss for two seats) so that a forfeited game stays zero-sum; else 0."""
        loss = float(self.loss_payoff(game))
        others = len(game.unwrapped.possible_agents) - 1
        return loss, (-loss / others if self.zero_sum(game) and others > 0 else 0.0)

    def cooperative_move(self, game: AECEnv, seat: str) -> int | None:
        """The action id of the seat's cooperative move where the game has one (a social dilemma's "cooperate"),
        else None: what an evaluation's cooperation rate counts. None here: a game has none unless its view says."""
        return None

    def max_moves(self, game: AECEnv) -> int | None:
        """The most moves a game can last, where the game says (OpenSpiel's ``max_game_length``); None here: the
        batched env's default cap applies (:data:`~marllm.games.env.checks.DEFAULT_MAX_MOVES`)."""
        return None


VIEWS: dict[str, GameView] = {}
"""Views by game name; :func:`register_view` adds to it."""

MATCHERS: list[tuple[Callable[[str], bool], GameView]] = []
"""(name predicate, view) for families of games (``matrix_*``); tried in order after the exact names."""

FALLBACKS: list[tuple[Callable[[AECEnv], bool], GameView]] = []
"""(game predicate, view) for kinds of env without a view of their own (every OpenSpiel game); tried in order after
the names, before :class:`GameView` itself."""


def register_view(name: str | Callable[[str], bool], view: GameView) -> GameView:
    """Use ``view`` for the game called ``name`` (or for every game whose name satisfies the predicate)."""
    if not isinstance(view, GameView):
        raise TypeError(f"a game view must be a GameView, got {type(view).__name__}")
    if callable(name):
        MATCHERS.append((name, view))
    else:
        VIEWS[name] = view
    return view


def register_fallback_view(matches: Callable[[AECEnv], bool], view: GameView) -> GameView:
    """Use ``view`` for every game that ``matches`` and has no view by its name (a kind of env's generic view)."""
    if not isinstance(view, GameView):
        raise TypeError(f"a game view must be a GameView, got {type(view).__name__}")
    FALLBACKS.append((matches, view))
    return view


def is_openspiel(game: AECEnv) -> bool:
    """Whether the game is an OpenSpiel game behind shimmy's compatibility env (which maps seats to players)."""
    inner = game.unwrapped
    return hasattr(inner, "game_type") and hasattr(inner, "agent_name_id_mapping")


def game_name(game: AECEnv) -> str:
    """An OpenSpiel game's short name, else the env's ``metadata["name"]`` (else its class name)."""
    inner = game.unwrapped
    if is_openspiel(game):
        return str(inner.game_type.short_name)
    return str(getattr(inner, "metadata", {}).get("name", type(inner).__name__))
