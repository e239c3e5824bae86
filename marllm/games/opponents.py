"""The opponents a game's seat can name (``game.seats``): :data:`OPPONENT_REGISTRY`, torch-free, and the typed
:class:`Seat` each entry of ``game.seats`` is read into once.

Each built-in opponent is an :class:`Opponent` registered by name: what it needs of the game (tic-tac-toe, a
turn-taking game of perfect information, a small OpenSpiel game) and of the run (a learner it watches), its own
settings as a dataclass written with its seat (``game.seats: [llm, {cfr: {iterations: 200}}]``; a seat that names
it alone takes their defaults), and its player's builder as ``implementation``, imported only when the seat's player
is built. A seat can also name an opponent class by reference, as ``agents.algorithm`` names a learner, ``game.seats:
[llm, my_opponent.py:MyPlayer]`` (a file relative to the config's folder) or ``package.module:MyPlayer``, with
settings of its own where the class declares them (its ``Settings`` dataclass): ``{my_opponent.py:MyPlayer: {depth:
2}}``.

A builder is called with the seat's :class:`SeatArguments`: a class by its ``from_seat(seat)`` classmethod
(:meth:`FixedPlayer.from_seat <marllm.games.players.fixed.FixedPlayer.from_seat>`, which every fixed player
inherits, calls ``cls(seat.name, seed=seat.seed)``), a function as it is. A referenced class says what it needs of
the game by its ``needs`` class attribute (names of :data:`NEEDS`), read when the config is checked (its file is
loaded then).
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from marllm.games.needs import NEEDS, SMALL_GAME, check_needs  # noqa: F401 - check_needs re-exported
from marllm.utils.dataclass_tree import build, to_dict
from marllm.utils.registry import Extension, Registry, reference_problem

if TYPE_CHECKING:
    from marllm.games.settings import GameConfig

NAMED = "named"
"""An opponent that watches the learner its seat names (its settings' ``learner``)."""
ONLY = "only"
"""An opponent that watches the run's only learner."""


class Opponent(Extension):
    """An opponent's facts.

    Attributes:
        needs: what it needs of the game, names of :data:`NEEDS`, checked in this order.
        learner: the learner it watches: :data:`NAMED` (its settings name one, ``learner``), :data:`ONLY` (the run's
            only one) or None (none: it plays in evaluation too).
        watching: how it watches its learner, in words (for messages).
        player_id: its player's id (its seat's slot), formatted with ``name`` (its own) and ``learner``.
        plays_mode: the action mode its answers are in, which the run's learners must play (None: any).
        tabulates: whether it reads its learner's policy tabulated at every information state (the seat builder
            gives it as :attr:`SeatArguments.learner_policy`).
        snapshots: whether it keeps ``size`` frozen copies of its learner's model (what a memory plan counts).
    """

    needs: ClassVar[tuple[str, ...]] = ()
    learner: ClassVar[str | None] = None
    watching: ClassVar[str] = "watches"
    player_id: ClassVar[str] = "{name}"
    plays_mode: ClassVar[str | None] = None
    tabulates: ClassVar[bool] = False
    snapshots: ClassVar[bool] = False


OPPONENT_REGISTRY: Registry[type[Opponent]] = Registry("opponent", Opponent, "my_opponent.py:MyPlayer")
"""Opponent name -> :class:`Opponent`: the opponents ``game.seats`` names (besides references)."""


def _at_least_one(owner: str, settings: Any) -> None:
    for key, value in vars(settings).items():
        if isinstance(value, int) and value < 1:
            raise ValueError(f"{owner}.{key} must be an integer >= 1, got {value}")


@OPPONENT_REGISTRY.register("random")
class RandomOpponent(Opponent):
    implementation = "marllm.games.players.fixed:RandomMover"
    summary = "a uniformly random legal move"


@OPPONENT_REGISTRY.register("minimax")
class MinimaxOpponent(Opponent):
    implementation = "marllm.games.players.fixed:TicTacToeMinimax"
    summary = "perfect tic-tac-toe"
    needs = ("tic_tac_toe",)


@dataclass(frozen=True)
class MCTSSettings:
    """An ``mcts`` seat's settings. Attributes: simulations: per move."""

    simulations: int = 100

    def __post_init__(self) -> None:
        _at_least_one("mcts", self)


@OPPONENT_REGISTRY.register("mcts")
class MCTSOpponent(Opponent):
    implementation = "marllm.games.players.mcts:MCTSPlayer"
    summary = "OpenSpiel's MCTS"
    needs = ("perfect_information", "openspiel")
    Settings = MCTSSettings


@dataclass(frozen=True)
class CFRSettings:
    """A ``cfr`` seat's settings. Attributes: iterations: CFR's, solved once when the run starts (its
    exploitability shrinks as O(1/√iterations): Kuhn poker about 0.015 after 50, Leduc about 0.2 s an iteration)."""

    iterations: int = 100

    def __post_init__(self) -> None:
        _at_least_one("cfr", self)


@OPPONENT_REGISTRY.register("cfr")
class CFROpponent(Opponent):
    implementation = "marllm.games.players.tabular:CFRPlayer"
    summary = "CFR's average policy"
    needs = (SMALL_GAME,)
    Settings = CFRSettings


@dataclass(frozen=True)
class BestResponseSettings:
    """A ``best_response`` seat's settings. Attributes: every: iterations between two readings of the learner's
    policy (each tabulates the learner at every information state: exact under ``score`` and ``constrained``, the
    mode's ``exploitability_samples`` answers per state under ``generate`` and ``think``)."""

    every: int = 1

    def __post_init__(self) -> None:
        _at_least_one("best_response", self)


@OPPONENT_REGISTRY.register("best_response")
class BestResponseOpponent(Opponent):
    implementation = "marllm.games.players.tabular:BestResponsePlayer"
    summary = "an exact best response to the learner's policy"
    needs = (SMALL_GAME,)
    learner = ONLY
    watching = "answers"
    tabulates = True
    Settings = BestResponseSettings


@dataclass(frozen=True)
class SnapshotPoolSettings:
    """A ``snapshot_pool`` seat's settings.

    Attributes:
        learner: the learner id whose snapshots it keeps.
        size: K, the snapshots it keeps (each a copy of the learner's model).
        every: iterations between two snapshots.
    """

    learner: str
    size: int = 4
    every: int = 1

    def __post_init__(self) -> None:
        _at_least_one("snapshot_pool", self)
        if not _LEARNER_ID.fullmatch(self.learner):
            raise ValueError(f"snapshot_pool.learner must be a learner id, got {self.learner!r}")


@OPPONENT_REGISTRY.register("snapshot_pool")
class SnapshotPoolOpponent(Opponent):
    implementation = "marllm.games.players.snapshots:OpponentPool"
    summary = "one of the learner's last frozen snapshots, drawn per iteration"
    learner = NAMED
    watching = "takes snapshots of"
    player_id = "pool-{learner}"
    plays_mode = "generate"
    snapshots = True
    Settings = SnapshotPoolSettings


FIXED_OPPONENTS = tuple(name for name, entry in OPPONENT_REGISTRY.builtins().items() if entry.learner is None)
"""The opponents that watch no learner: those an evaluation plays a model against."""


@dataclass(frozen=True)
class SeatArguments:
    """What an opponent's builder gets.

    Attributes:
        game: the config's ``game`` section.
        name: the player's id.
        seed: seeds its draws.
        learner: the learner it watches (its entry's ``learner``), or None.
        learner_id: that learner's id, or None.
        learner_policy: gives that learner's policy tabulated at every information state, for an opponent whose
            entry ``tabulates`` (a best response); else None.
        settings: its seat's settings (an instance of its ``Settings``), or None where it has none.
    """

    game: GameConfig
    name: str
    seed: int
    learner: Any = None
    learner_id: str | None = None
    learner_policy: Callable[[], Any] | None = None
    settings: Any = None


LEARNER = "learner"
"""The kind of a seat a learner plays."""

SELF = "self"
"""Reserved (evaluation: a model against itself); not a learner id."""

_LEARNER_ID = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class Seat:
    """One entry of ``game.seats``, read once when the config is made (:meth:`from_config`).

    Attributes:
        kind: ``learner``, an opponent's name in :data:`OPPONENT_REGISTRY`, or an opponent's reference
            (``module:Class``).
        learner: the learner id (a learner's own, or the one its opponent watches); None for the others.
        settings: the opponent's settings (an instance of its ``Settings``), or None.
    """

    kind: str
    learner: str | None = None
    settings: Any = None

    @classmethod
    def from_config(cls, value: Any, path: str) -> Seat:
        """Read a seat as written: a learner id, an opponent's name or reference, or ``{opponent: {settings}}``."""
        if isinstance(value, Seat):
            return value
        if isinstance(value, Mapping):
            if len(value) != 1:
                raise ValueError(f"{path}: a seat with settings is one opponent and its settings, got {dict(value)}")
            [(kind, given)] = value.items()
            return cls._opponent(str(kind), given, path)
        if not isinstance(value, str):
            raise ValueError(f"{path}: {value!r} is not a seat; a seat is {_valid_seats()}")
        if value in OPPONENT_REGISTRY or OPPONENT_REGISTRY.is_reference(value):
            return cls._opponent(value, None, path)
        if value == SELF or not _LEARNER_ID.fullmatch(value):
            raise ValueError(
                f"{path}: {value!r} is not a seat; a seat is {_valid_seats()} (a learner id starts with a letter and "
                "has letters, digits, '_', '.' and '-' only)"
            )
        return cls(LEARNER, value)

    @classmethod
    def _opponent(cls, kind: str, given: Any, path: str) -> Seat:
        prefix, colon, learner = kind.partition(":")
        if colon and prefix in OPPONENT_REGISTRY:  # an opponent's name, then a colon: not a reference
            if OPPONENT_REGISTRY.builtins()[prefix].learner == NAMED:  # the grammar `snapshot_pool:<learner>`
                raise ValueError(f"{path}: write {{{prefix}: {{learner: {learner}}}}} for {kind!r}")
            raise ValueError(f"{path}: {kind!r} is not a seat; a seat is {_valid_seats()}")
        if kind not in OPPONENT_REGISTRY:
            why = reference_problem(kind) if OPPONENT_REGISTRY.is_reference(kind) else "no opponent has that name"
            if why is not None:
                raise ValueError(f"{path}: {kind!r} is not a seat; a seat is {_valid_seats()} ({why})")
        settings_class = OPPONENT_REGISTRY.entry(kind, path).Settings
        if settings_class is None:
            if given:
                raise ValueError(f"{path}: the opponent {kind} has no settings, got {given!r}")
            return cls(kind)
        settings = build(settings_class, {} if given is None else given, f"{path}.{kind}")
        return cls(kind, getattr(settings, "learner", None), settings)

    def to_config(self) -> Any:
        """The seat as a config writes it."""
        if self.is_learner:
            return self.learner
        return self.kind if self.settings is None else {self.kind: to_dict(self.settings)}

    @property
    def spec(self) -> str:
        """The seat in one word, for messages: the learner id or the opponent's kind."""
        return self.learner if self.is_learner else self.kind  # type: ignore[return-value]

    @property
    def is_learner(self) -> bool:
        """Whether a learner plays it."""
        return self.kind == LEARNER

    @property
    def opponent(self) -> type[Opponent] | None:
        """The opponent's entry (a reference's loaded), or None for a learner's seat."""
        return None if self.is_learner else opponent(self.kind)

    @property
    def player_id(self) -> str:
        """Who plays it: the learner id, the opponent's name (a reference's class name), ``pool-<learner>`` for a
        snapshot pool."""
        if self.is_learner:
            assert self.learner is not None
            return self.learner
        if self.kind in OPPONENT_REGISTRY:
            return OPPONENT_REGISTRY.builtins()[self.kind].player_id.format(name=self.kind, learner=self.learner)
        return self.kind.rpartition(":")[2]


def _valid_seats() -> str:
    return (
        f"a learner id (e.g. llm), an opponent: {', '.join(OPPONENT_REGISTRY.names())} (with its settings: "
        "{cfr: {iterations: 200}}, {snapshot_pool: {learner: llm}}), or an opponent class by reference "
        "(package.module:Class, or file.py:Class relative to the config's folder)"
    )


def opponent(kind: str) -> type[Opponent]:
    """The entry of ``kind``: a registered name, or a reference (loaded, its ``needs`` read).

    Raises:
        ValueError: a reference that does not load, names no class or function, or needs what :data:`NEEDS` lacks.
    """
    entry = OPPONENT_REGISTRY.entry(kind, "game.seats")
    if not callable(OPPONENT_REGISTRY.implementation(kind, "game.seats")):
        raise ValueError(f"{kind} is not callable; name an opponent class or a builder function")
    unknown = [need for need in entry.needs if need not in NEEDS]
    if unknown:
        raise ValueError(f"{kind} needs {unknown}, which are not needs; they are {list(NEEDS)}")
    return entry


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
    builder_reference = opponent(kind).implementation
    target = OPPONENT_REGISTRY.implementation(kind, where or "game.seats")
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
