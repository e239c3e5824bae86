"""The opponents a game's seat can name (``game.seats``), in one list, without importing torch.

Each name maps to its builder as a reference (``module:Class`` or ``module:function``), imported only when the seat's
player is built, and to what it needs: of the game (tic-tac-toe, a turn-taking game of perfect information, a small
OpenSpiel game), of the run (a learner it watches) and of ``game.opponents`` (its settings). The config checks a seat
by its entry (:func:`check_needs`) and the seat builder (:func:`marllm.games.seats.seat_players`) builds it by its
entry, so adding an opponent is one entry here, or none: a seat can name an opponent class by reference, as
``agents.algorithm`` names a learner, ``game.seats: [llm, my_opponent.py:MyPlayer]`` (a file relative to the
config's folder) or ``package.module:MyPlayer``.

A builder is called with the seat's :class:`SeatArguments`: a class by its ``from_seat(seat)`` classmethod
(:meth:`FixedPlayer.from_seat <marllm.games.players.fixed.FixedPlayer.from_seat>`, which every fixed player
inherits, calls ``cls(seat.name, seed=seat.seed)``), a function as it is. A referenced class says what it needs of the
game by its ``needs`` class attribute (names of :data:`NEEDS`), read when the config is checked (its file is loaded
then).
"""

from __future__ import annotations

import importlib.util
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marllm.games.env.factory import TIC_TAC_TOE
from marllm.games.env.info_states import NotEnumerableError, enumerate_info_states
from marllm.games.env.openspiel import require_openspiel
from marllm.utils.imports import is_file_reference, load_reference, split_reference

if TYPE_CHECKING:
    from marllm.games.settings import GameConfig

NAMED = "named"
"""An opponent that watches the learner its seat names, ``<opponent>:<learner id>``."""
ONLY = "only"
"""An opponent that watches the run's only learner."""
SMALL_GAME = "small_game"
"""The need of a game whose information states enumerate (checked once for every seat and measurement needing it)."""

REFERENCE_FORMS = "my_opponent.py:MyPlayer relative to the config's folder, or package.module:MyPlayer"


@dataclass(frozen=True)
class Opponent:
    """One entry of :data:`CATALOG`.

    Attributes:
        builder: ``module:Class`` (built by its ``from_seat``) or ``module:function`` that builds its player.
        summary: what it plays, in a line.
        needs: what it needs of the game, names of :data:`NEEDS`, checked in this order.
        settings: its keys of ``game.opponents``.
        learner: the learner it watches: :data:`NAMED` (its seat names one), :data:`ONLY` (the run's only one) or
            None (none: it plays in evaluation too).
        watching: how it watches its learner, in words (for messages).
        player_id: its player's id (its seat's slot), formatted with ``name`` (its own) and ``learner``.
        plays_mode: the action mode its answers are in, which the run's learners must play (None: any).
        tabulates: whether it reads its learner's policy tabulated at every information state (the seat builder
            gives it as :attr:`SeatArguments.learner_policy`).
        snapshots: whether it keeps ``game.opponents.pool_size`` frozen copies of its learner's model (what a
            memory plan counts).
    """

    builder: str
    summary: str
    needs: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()
    learner: str | None = None
    watching: str = "watches"
    player_id: str = "{name}"
    plays_mode: str | None = None
    tabulates: bool = False
    snapshots: bool = False


CATALOG: dict[str, Opponent] = {
    "random": Opponent("marllm.games.players.fixed:RandomMover", "a uniformly random legal move"),
    "minimax": Opponent("marllm.games.players.fixed:TicTacToeMinimax", "perfect tic-tac-toe", needs=("tic_tac_toe",)),
    "mcts": Opponent(
        "marllm.games.players.mcts:MCTSPlayer",
        "OpenSpiel's MCTS",
        ("perfect_information", "openspiel"),
        ("mcts_simulations",),
    ),
    "cfr": Opponent(
        "marllm.games.players.tabular:CFRPlayer", "CFR's average policy", (SMALL_GAME,), ("cfr_iterations",)
    ),
    "best_response": Opponent(
        "marllm.games.players.tabular:BestResponsePlayer",
        "an exact best response to the learner's policy",
        (SMALL_GAME,),
        ("best_response_every",),
        learner=ONLY,
        watching="answers",
        tabulates=True,
    ),
    "snapshot_pool": Opponent(
        "marllm.games.players.snapshots:OpponentPool",
        "one of the learner's last frozen snapshots, drawn per iteration",
        settings=("pool_size", "pool_every"),
        learner=NAMED,
        watching="takes snapshots of",
        player_id="pool-{learner}",
        plays_mode="generate",
        snapshots=True,
    ),
}
"""Opponent name -> :class:`Opponent`: the opponents ``game.seats`` names (besides references)."""

FIXED_OPPONENTS = tuple(name for name, entry in CATALOG.items() if entry.learner is None)
"""The opponents that watch no learner: those an evaluation plays a model against."""


@dataclass(frozen=True)
class SeatArguments:
    """What an opponent's builder gets.

    Attributes:
        game: the config's ``game`` section (the game, ``game.opponents``' settings).
        name: the player's id.
        seed: seeds its draws.
        learner: the learner it watches (its entry's ``learner``), or None.
        learner_id: that learner's id, or None.
        learner_policy: gives that learner's policy tabulated at every information state, for an opponent whose
            entry ``tabulates`` (a best response); else None.
    """

    game: GameConfig
    name: str
    seed: int
    learner: Any = None
    learner_id: str | None = None
    learner_policy: Callable[[], Any] | None = None


LEARNER = "learner"
"""The kind of a seat a learner plays."""

SELF = "self"
"""Reserved (evaluation: a model against itself); not a learner id."""

_LEARNER_ID = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class Seat:
    """One entry of ``game.seats``, read.

    Attributes:
        spec: as written.
        kind: ``learner``, an opponent's name in :data:`CATALOG`, or an opponent's
            reference (``module:Class``).
        learner: the learner id (a learner's own, or the one its opponent watches); None for the others.
    """

    spec: str
    kind: str
    learner: str | None = None

    @property
    def is_learner(self) -> bool:
        """Whether a learner plays it."""
        return self.kind == LEARNER

    @property
    def opponent(self) -> Opponent | None:
        """The opponent's entry (a reference's loaded), or None for a learner's seat."""
        return None if self.is_learner else opponent(self.kind)

    @property
    def player_id(self) -> str:
        """Who plays it: the learner id, the opponent's name (a reference's class name), ``pool-<learner>`` for a
        snapshot pool."""
        if self.is_learner:
            assert self.learner is not None
            return self.learner
        if self.kind in CATALOG:
            return CATALOG[self.kind].player_id.format(name=self.kind, learner=self.learner)
        return split_reference(self.kind)[1]


def _valid_seats() -> str:
    plain = [name for name, entry in CATALOG.items() if entry.learner != NAMED]
    named = [f"{name}:<learner id>" for name, entry in CATALOG.items() if entry.learner == NAMED]
    return (
        f"a learner id (e.g. llm), a fixed opponent: {', '.join(plain)} or {' or '.join(named)}, or an opponent "
        f"class by reference ({REFERENCE_FORMS})"
    )


def parse_seat(spec: str, where: str) -> Seat:
    """Read one seat (``where`` names it in errors, e.g. ``game.seats[1]``). A reference is checked for its file or
    module, not loaded."""
    name, colon, learner = spec.partition(":")
    entry = CATALOG.get(name)
    if entry is not None and bool(colon) == (entry.learner == NAMED):
        if colon and not _LEARNER_ID.fullmatch(learner):
            raise ValueError(
                f"{where}: {spec!r} must name a learner id after {name + ':'!r}; a seat is {_valid_seats()}"
            )
        return Seat(spec, name, learner or None)
    if is_reference(spec):
        why = check_reference(spec)
        if why is not None:
            raise ValueError(f"{where}: {spec!r} is not a seat; a seat is {_valid_seats()} ({why})")
        return Seat(spec, spec)
    if spec == SELF or not _LEARNER_ID.fullmatch(spec):
        raise ValueError(
            f"{where}: {spec!r} is not a seat; a seat is {_valid_seats()} (a learner id starts with a letter and has "
            "letters, digits, '_', '.' and '-' only)"
        )
    return Seat(spec, LEARNER, spec)


def is_reference(spec: str) -> bool:
    """Whether ``spec`` names an opponent by reference rather than by catalog name (with or without a learner)."""
    return ":" in spec and spec.partition(":")[0] not in CATALOG


def check_reference(spec: str) -> str | None:
    """Why ``spec`` (a reference) cannot name an opponent without loading it (a missing file, no such module), or
    None."""
    try:
        module, _ = split_reference(spec)
    except ValueError as error:
        return str(error)
    if is_file_reference(spec):
        return None if Path(module).expanduser().is_file() else f"it names the file {module}, which does not exist"
    top = module.partition(".")[0]
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"no module named {top!r} can be found"


def opponent(kind: str) -> Opponent:
    """The entry of ``kind``: a catalog name, or a reference (loaded, its ``needs`` read).

    Raises:
        ValueError: a reference that does not load, names no class or function, or needs what :data:`NEEDS` lacks.
    """
    if kind in CATALOG:
        return CATALOG[kind]
    target = load_reference(kind)
    if not callable(target):
        raise ValueError(f"{kind} is a {type(target).__name__}; name an opponent class or a builder function")
    needs = tuple(getattr(target, "needs", ()))
    unknown = [need for need in needs if need not in NEEDS]
    if unknown:
        raise ValueError(f"{kind} needs {unknown}, which are not needs; they are {list(NEEDS)}")
    return Opponent(kind, (getattr(target, "__doc__", None) or "").strip().partition("\n")[0], needs)


def build_opponent(kind: str, seat: SeatArguments, where: str | None = None) -> Any:
    """The player of ``kind`` for ``seat``: its builder's ``from_seat(seat)`` (a class), or its builder called.

    Args:
        kind: a catalog name or a reference (:attr:`Seat.kind`).
        seat: what its builder gets.
        where: what named it, for errors (``game.seats[1]``); None: not said.

    Raises:
        ValueError: the builder is not callable, or it raised (the message names the opponent, what named it, where
            it is defined and the line that raised; the builder's error is the cause).
    """
    builder_reference = opponent(kind).builder
    target = load_reference(builder_reference)
    builder = getattr(target, "from_seat", None) if isinstance(target, type) else target
    if not callable(builder):
        raise ValueError(
            f"{kind}: {target!r} has no from_seat; name a class with a from_seat(seat) classmethod (every "
            "marllm.games.players.FixedPlayer has one) or a function of the seat"
        )
    try:
        return builder(seat)
    except Exception as error:
        named = f"{where}: " if where else ""
        defined = "" if builder_reference == kind else f", built by {builder_reference}"
        raise ValueError(
            f"{named}building the opponent {kind!r} (player {seat.name!r}{defined}) failed{_raised_at(error)}: "
            f"{type(error).__name__}: {error}"
        ) from error


def _raised_at(error: BaseException) -> str:
    """`` at file.py:line in function``: where ``error`` was raised (the innermost frame of its traceback), or ""."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" at {Path(last.filename).name}:{last.lineno} in {last.name}"


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
