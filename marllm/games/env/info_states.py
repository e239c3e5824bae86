"""Every information state of a small OpenSpiel game, with the prompt its seat sees there in a batched game.

:func:`enumerate_info_states` walks the whole game tree of an OpenSpiel game (chance outcomes included) and keeps,
for each information state of each player, one state of the game *as played* (what a view renders) and the matching
state of its *solved twin*: the game as OpenSpiel's solvers (CFR, best response, NashConv) take it: simultaneous games
turned into turn-based ones (``pyspiel.convert_to_turn_based``; the second mover does not see the first one's move),
and a repeated game given full recall (its observation otherwise shows the last round only, so histories that a
prompt tells apart would share a key). Action ids are the same in both. :meth:`GameTree.observation` renders the
prompt of every information state with a view and templates, as :class:`~marllm.games.env.BatchedGameEnv` would,
and checks that every state of an information set renders the same prompt (a policy of prompts is then a policy of
information states).

A game is refused with one line saying why when it is not an OpenSpiel game of turns or simultaneous moves, has no
perfect-recall information-state strings, lasts more than :data:`MAX_GAME_LENGTH` moves, or has more than
``max_info_states`` information states (default :data:`MAX_INFO_STATES`; Kuhn poker has 12, Leduc poker 936, a
5-round repeated prisoner's dilemma 682, tic-tac-toe 4,520).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from marllm.games.env import keys
from marllm.games.env.openspiel import load_openspiel_game, openspiel_env, require_openspiel
from marllm.games.env.prompts import GameTemplate, check_game_templates, prompt_fields
from marllm.games.env.view_lookup import view_for
from marllm.games.env.views import GameView, Move

MAX_INFO_STATES = 4000
"""The most information states an exact evaluation enumerates by default (each is one prompt a model answers)."""

MAX_GAME_LENGTH = 256
"""The longest game (in moves) whose tree is walked: longer ones are refused before the walk."""

VALID = "Kuhn or Leduc poker, a matrix game, a small repeated game"


class NotEnumerableError(ValueError):
    """The game's information states cannot be enumerated (see the module docstring)."""


@dataclass(frozen=True)
class InfoState:
    """One information state of one player: the key of the solved twin's tabular policy, and a state reaching it."""

    key: str
    player: int
    seat: str
    played: Any
    """A ``pyspiel.State`` of the game as played, in this information state (what the view renders)."""
    solved: Any
    """The matching state of the solved twin."""
    moves: tuple[Move, ...]
    """The moves applied before (as the batched env records them; named by OpenSpiel's ``action_to_string``)."""
    move_number: int
    """The seat's answers so far + 1."""


@dataclass
class GameTree:
    """The information states of a game (:func:`enumerate_info_states`), in the row order of :meth:`uniform_policy`.

    Attributes:
        game: the ``pyspiel.Game`` as played.
        solved: its solved twin (see the module docstring).
        info_states: one per information state.
        members: information-state key -> every (played state, moves, move number) in that information set.
    """

    game: Any
    solved: Any
    info_states: list[InfoState]
    members: dict[str, list[tuple[Any, tuple[Move, ...], int]]] = field(repr=False)
    decision_states: dict[str, Any] = field(repr=False)

    def uniform_policy(self) -> Any:
        """A uniform ``TabularPolicy`` of the solved twin (rows in :attr:`info_states` order)."""
        from open_spiel.python import policy as policy_lib  # OpenSpiel: the optional marllm[games] extra

        return policy_lib.TabularPolicy(self.solved, states=self.decision_states)

    def observation(
        self, view: GameView | None = None, templates: GameTemplate | Mapping[str, GameTemplate] | None = None
    ) -> dict[str, tuple[Any, ...]]:
        """A batched env's observation with one row per information state (``games``: the row indices).

        Raises:
            NotEnumerableError: two states of one information set render different prompts or legal moves (the view
                shows more than the seat knows), or the view's legal moves differ from OpenSpiel's.
        """
        env = openspiel_env(self.game)
        view = view_for(env) if view is None else view
        prompts = check_game_templates(templates, env.possible_agents)
        rows: dict[str, list[Any]] = {k: [] for k in (keys.PROMPT, keys.LEGAL_MOVES, keys.LEGAL_ACTIONS, keys.HISTORY)}
        for info in self.info_states:
            seen = {_render(env, view, prompts, info.seat, *member) for member in self.members[info.key]}
            if len(seen) != 1:
                raise NotEnumerableError(
                    f"the prompts of {info.seat} differ within one information state ({info.key!r}): the view shows "
                    f"more than the seat knows, so its policy is not one of information states"
                )
            prompt, legal = seen.pop()
            if sorted(a for a, _ in legal) != sorted(info.solved.legal_actions(info.player)):
                raise NotEnumerableError(f"the view's legal moves {legal} at {info.key!r} are not OpenSpiel's")
            rows[keys.PROMPT].append(prompt)
            rows[keys.LEGAL_MOVES].append(tuple(name for _, name in legal))
            rows[keys.LEGAL_ACTIONS].append(tuple(a for a, _ in legal))
            rows[keys.HISTORY].append(tuple(int(a) for a in info.played.history()))
        return {**{k: tuple(v) for k, v in rows.items()}, keys.GAMES: tuple(range(len(self.info_states)))}


class _Snapshot:
    """Stands in for shimmy's env where a view reads it: the seats, the game type and one OpenSpiel state."""

    def __init__(self, env: Any, state: Any, seat: str):
        self.possible_agents = env.possible_agents
        self.agent_name_id_mapping = env.agent_name_id_mapping
        self.agent_id_name_mapping = env.agent_id_name_mapping
        self.game_type = env.game_type
        self.metadata = env.metadata
        self.game_state = state
        self.agent_selection = seat

    @property
    def unwrapped(self) -> _Snapshot:
        return self


def _render(
    env: Any, view: GameView, prompts: Mapping[str, Any], seat: str, state: Any, moves: tuple[Move, ...], number: int
) -> tuple[str, tuple[tuple[int, str], ...]]:
    snapshot = _Snapshot(env, state, seat)
    legal = tuple((int(a), str(name)) for a, name in view.legal_moves(snapshot, seat))  # type: ignore[arg-type]
    fields = prompt_fields(view, snapshot, seat, moves, [name for _, name in legal], number)  # type: ignore[arg-type]
    return str(prompts[seat](fields)), legal


def solved_twin(game: Any) -> Any:
    """The game as OpenSpiel's solvers take it (see the module docstring); ``NotEnumerableError`` if there is none."""
    pyspiel, _ = require_openspiel()
    kind = game.get_type()
    name = kind.short_name
    if kind.dynamics not in (kind.dynamics.SEQUENTIAL, kind.dynamics.SIMULTANEOUS):
        raise NotEnumerableError(f"{name} is a {kind.dynamics} game; exact evaluation takes {VALID}")
    if name == "repeated_game":
        parameters = dict(game.get_parameters())
        if parameters.get("recall", 1) < parameters["num_repetitions"]:
            game = pyspiel.load_game(name, {**parameters, "recall": parameters["num_repetitions"]})
    elif not kind.provides_information_state_string:
        raise NotEnumerableError(
            f"{name} has no information-state strings (perfect recall), which exact evaluation keys its policy by; "
            f"it takes {VALID}"
        )
    if kind.dynamics == kind.dynamics.SIMULTANEOUS:
        game = pyspiel.convert_to_turn_based(game)
    return game


def policy_key(solved: Any, state: Any, player: int) -> str:
    """The key of ``(state, player)`` in a ``TabularPolicy`` of the solved twin (as OpenSpiel's own ``_state_key``)."""
    kind = solved.get_type()
    if kind.provides_information_state_string:
        return str(state.information_state_string(player))
    if kind.provides_observation_string:
        return str(state.observation_string(player))
    return str(state)


def load_game(game: Any) -> Any:
    """A ``pyspiel.Game`` from a game string (``kuhn_poker``, ``openspiel:kuhn_poker``) or a loaded game
    (:func:`~marllm.games.env.openspiel.load_openspiel_game`), refused with a :class:`NotEnumerableError`."""
    try:
        return load_openspiel_game(game)
    except ValueError as error:
        raise NotEnumerableError(f"{error}; exact evaluation takes {VALID}") from None


def enumerate_info_states(game: Any, max_info_states: int = MAX_INFO_STATES) -> GameTree:
    """Walk the whole tree of ``game`` (a ``pyspiel.Game`` or game string) and return its information states.

    Raises:
        NotEnumerableError: not an OpenSpiel game, no perfect-recall keys, or more than ``max_info_states``
            information states (the walk stops there).
    """
    loaded = load_game(game)
    if loaded.max_game_length() > MAX_GAME_LENGTH:
        raise NotEnumerableError(
            f"{loaded} lasts up to {loaded.max_game_length()} moves; exact evaluation walks every game to its end (at "
            f"most {MAX_GAME_LENGTH} moves) and takes {VALID}"
        )
    walk = _Walk(loaded, solved_twin(loaded), max_info_states)
    walk.node(loaded.new_initial_state(), walk.solved.new_initial_state(), (0,) * loaded.num_players(), ())
    tree = GameTree(loaded, walk.solved, [], walk.members, walk.decision_states)
    lookup = tree.uniform_policy().state_lookup
    if set(lookup) != set(walk.first):
        raise NotEnumerableError(f"the information states of {loaded} do not match OpenSpiel's tabular policy's")
    tree.info_states = sorted(walk.first.values(), key=lambda info: lookup[info.key])
    return tree


class _Walk:
    """The depth-first walk of :func:`enumerate_info_states` over the played game and its solved twin at once."""

    def __init__(self, game: Any, solved: Any, limit: int):
        self.game, self.solved, self.limit = game, solved, limit
        self.first: dict[str, InfoState] = {}
        self.members: dict[str, list[tuple[Any, tuple[Move, ...], int]]] = {}
        self.decision_states: dict[str, Any] = {}

    def node(self, played: Any, solved: Any, answers: tuple[int, ...], moves: tuple[Move, ...]) -> None:
        if played.is_terminal():
            return
        if played.is_chance_node():
            for outcome, _ in played.chance_outcomes():
                self.node(played.child(outcome), solved.child(outcome), answers, moves)
        elif played.is_simultaneous_node():
            self.joint(played, solved, answers, moves, [])
        else:
            player = played.current_player()
            self.visit(played, solved, player, answers, moves)
            for action in played.legal_actions():
                move = Move(_seat(player), int(action), played.action_to_string(player, action))
                self.node(played.child(action), solved.child(action), _bump(answers, [player]), (*moves, move))

    def joint(self, played: Any, solved: Any, answers: tuple[int, ...], moves: tuple[Move, ...], chosen: list[int]):
        """One simultaneous round: the players choose in seat order (the twin's turns), then the round is applied."""
        if len(chosen) == self.game.num_players():
            after = played.clone()
            after.apply_actions(chosen)
            self.node(after, solved, _bump(answers, range(len(chosen))), moves)
            return
        player = len(chosen)
        if solved.current_player() != player:
            raise NotEnumerableError(f"{self.game}: the turn-based twin asks player {solved.current_player()} first")
        self.visit(played, solved, player, answers, moves)
        for action in played.legal_actions(player):
            move = Move(_seat(player), int(action), played.action_to_string(player, action))
            self.joint(played, solved.child(action), answers, (*moves, move), [*chosen, int(action)])

    def visit(self, played: Any, solved: Any, player: int, answers: tuple[int, ...], moves: tuple[Move, ...]):
        key = policy_key(self.solved, solved, player)
        self.decision_states[solved.history_str()] = solved
        self.members.setdefault(key, []).append((played, moves, answers[player] + 1))
        if key in self.first:
            return
        if len(self.first) >= self.limit:
            raise NotEnumerableError(
                f"{self.game} has more than {self.limit} information states, too many to enumerate: exact evaluation "
                f"(cfr, best_response, exploitability) enumerates every one and takes {VALID}; evaluate this game "
                "by play instead (marllm eval --games)"
            )
        self.first[key] = InfoState(key, player, _seat(player), played, solved, moves, answers[player] + 1)


def _seat(player: int) -> str:
    return f"player_{player}"  # shimmy's agent names


def _bump(answers: tuple[int, ...], players: Sequence[int] | range) -> tuple[int, ...]:
    return tuple(n + (p in players) for p, n in enumerate(answers))
