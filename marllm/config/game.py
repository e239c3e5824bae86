"""The ``game`` section of a training config: a batched game in place of the text env, and who sits in each seat.

A seat is a learner id (a learner the run trains; the same id in every seat is self-play) or a fixed opponent:
``random``, ``minimax`` (tic-tac-toe), ``mcts`` (OpenSpiel's MCTS, on turn-taking games of perfect information),
``cfr`` and ``best_response`` (on small OpenSpiel games: CFR's average policy, an exact best response to the learner) or
``snapshot_pool:<learner>`` (the last ``pool_size`` frozen snapshots of that learner, one drawn per iteration). The
game is built once while the config is read, so a bad name, a seat count that does not fit or a missing optional
package is an error before anything loads.

The section has three of its own: ``game.actions`` (how a learner's answer becomes a move), ``game.opponents`` (the
settings of the fixed opponents) and ``game.measurement`` (what is measured of the learners' policies). A key of the
flat layout that moved into one of them (``game.pool_size``, ``game.actions: score``) is refused with its new place.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from marllm.envs.games.catalog import TIC_TAC_TOE, GameInfo, describe_game
from marllm.envs.games.checks import ILLEGAL_POLICIES
from marllm.envs.games.info_states import NotEnumerableError, enumerate_info_states
from marllm.envs.games.openspiel import require_openspiel
from marllm.envs.games.parsers import PARSERS
from marllm.envs.games.prompts import check_game_templates
from marllm.utils.checks import choice

OPPONENTS = ("random", "minimax", "mcts", "cfr", "best_response")
"""The fixed opponents a seat names by themselves."""

EXACT_OPPONENTS = ("cfr", "best_response")
"""The opponents that solve the game exactly (small OpenSpiel games, :mod:`marllm.envs.games.info_states`)."""

ACTIONS = ("generate", "constrained", "score", "think")
"""How an answer becomes a move (``game.actions.mode``)."""

EXACT_ACTIONS = ("constrained", "score")
"""The action modes whose move probabilities a model gives exactly (the others' are sampled)."""

ACTION_NORMALIZATIONS = ("none", "token", "word")
"""How ``score`` normalises a move's log-likelihood (``game.actions.normalization``)."""

POLICY_AVERAGES = ("uniform", "linear")
"""How the measured policies weigh in a run's average policy (``game.measurement.policy_average``)."""

POOL_PREFIX = "snapshot_pool:"
"""``snapshot_pool:<learner>``: a pool of frozen snapshots of a learner."""

SELF = "self"
"""Reserved (evaluation: a model against itself); not a learner id."""

_LEARNER_ID = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class Seat:
    """One entry of ``game.seats``, read.

    Attributes:
        spec: as written.
        kind: ``learner``, ``random``, ``minimax``, ``mcts`` or ``snapshot_pool``.
        learner: the learner id (a learner's own, or the one a pool takes snapshots of); None for the others.
    """

    spec: str
    kind: str
    learner: str | None = None

    @property
    def player_id(self) -> str:
        """Who plays it: the learner id, the opponent's name, ``pool-<learner>`` for a snapshot pool."""
        if self.kind == "learner":
            assert self.learner is not None
            return self.learner
        if self.kind == "snapshot_pool":
            return f"pool-{self.learner}"
        return self.kind


def parse_seat(spec: str, where: str) -> Seat:
    """Read one seat (``where`` names it in errors, e.g. ``game.seats[1]``)."""
    valid = f"a learner id (e.g. llm) or a fixed opponent: {', '.join(OPPONENTS)} or {POOL_PREFIX}<learner id>"
    if spec in OPPONENTS:
        return Seat(spec, spec)
    if spec.startswith(POOL_PREFIX):
        learner = spec.removeprefix(POOL_PREFIX)
        if not _LEARNER_ID.fullmatch(learner):
            raise ValueError(f"{where}: {spec!r} must name a learner id after {POOL_PREFIX!r}; a seat is {valid}")
        return Seat(spec, "snapshot_pool", learner)
    if spec == SELF or not _LEARNER_ID.fullmatch(spec):
        raise ValueError(
            f"{where}: {spec!r} is not a seat; a seat is {valid} (a learner id starts with a letter and has letters, "
            "digits, '_', '.' and '-' only)"
        )
    return Seat(spec, "learner", spec)


@dataclass
class ActionsConfig:
    """``game.actions``: how a learner's answer becomes a move.

    Attributes:
        mode: ``generate`` (free text of up to ``max_new_tokens``, then the parser: the model must learn the answer
            format, and may answer illegally); ``constrained`` (sampled token by token from the model's distribution
            restricted to continuations of the legal moves' names, then EOS: every answer is legal, and the
            token-level update re-applies the restriction, so its ratio is that of the distribution sampled);
            ``score`` (TWOSOME/GLAM: a categorical over the legal moves, each scored by the model's likelihood of its
            name after the prompt, normalised by ``normalization``; one move is one action, with a value head on the
            prompt's last hidden state for ``ppo``); ``think`` (SPIRAL's reason, then act: free text of generation's
            budget, then ``\\nMove:`` and a ``constrained`` move, credited as one response; its move probabilities
            are sampled, as ``generate``'s). ``marllm eval`` plays with the same mode. Every learner of
            ``agents.algorithm`` plays every mode (:mod:`marllm.algorithms.actions`); ``grpo`` and ``rloo`` are
            refused in a game.
        normalization: ``score``'s normalisation of a move's log-likelihood: ``none`` (the sum over its tokens:
            favours short names), ``token`` (the mean per token, TWOSOME's token normalisation) or ``word`` (the sum
            divided by the name's words, TWOSOME's word normalisation). ``score`` only: another value than ``token``
            with another mode is refused.
    """

    mode: str = "generate"
    normalization: str = "token"
    SCALAR_FIELD: ClassVar[str] = "mode"
    """The field a scalar given for the whole section was meant for (the error names it)."""

    def __post_init__(self) -> None:
        choice("game.actions", self, "mode", ACTIONS)
        choice("game.actions", self, "normalization", ACTION_NORMALIZATIONS)
        default = type(self).__dataclass_fields__["normalization"].default
        if self.mode != "score" and self.normalization != default:
            # the default is accepted with every mode, as the dataclass cannot tell it from a value left out
            raise ValueError(
                f"game.actions.normalization: {self.normalization} applies to game.actions.mode: score only (how it "
                f"normalises a move's log-likelihood), and game.actions.mode is {self.mode}, which would ignore it; "
                "leave game.actions.normalization out, or set game.actions.mode: score"
            )


@dataclass
class OpponentsConfig:
    """``game.opponents``: the settings of the fixed opponents a seat names.

    Attributes:
        pool_size: K, the snapshots a ``snapshot_pool`` seat keeps (each a copy of the learner's model).
        pool_every: iterations between two snapshots of a pool.
        mcts_simulations: simulations per move of an ``mcts`` seat.
        cfr_iterations: CFR iterations of a ``cfr`` seat (solved once, when the run starts; its exploitability
            shrinks as O(1/√iterations): Kuhn poker about 0.015 after 50, Leduc takes about 0.2 s per iteration).
        best_response_every: iterations between two readings of the learner's policy by a ``best_response`` seat
            (each reading tabulates the learner at every information state: exact under ``score`` and
            ``constrained``, ``game.measurement.exploitability_samples`` answers per state under ``generate``). A
            ``best_response`` seat answers the run's only learner.
    """

    pool_size: int = 4
    pool_every: int = 1
    mcts_simulations: int = 100
    cfr_iterations: int = 100
    best_response_every: int = 1

    def __post_init__(self) -> None:
        for key in ("pool_size", "pool_every", "mcts_simulations", "cfr_iterations", "best_response_every"):
            if getattr(self, key) < 1:
                raise ValueError(f"game.opponents.{key} must be an integer >= 1, got {getattr(self, key)}")


@dataclass
class MeasurementConfig:
    """``game.measurement``: what is measured of the learners' policies while they train.

    Attributes:
        exploitability_every: every this many iterations, the metric ``<learner>/game/exploitability`` (and
            ``nash_conv``) of each learner's tabulated policy (:mod:`marllm.games.exploitability`); null: never.
            Small OpenSpiel games only (Kuhn, Leduc poker, matrix games, small repeated games).
        exploitability_samples: answers per information state that tabulate a ``generate`` learner's policy.
        policy_average: the weights of the measured policies in the average policy whose exploitability is logged
            beside the last one's (``<learner>/game/exploitability_average``): ``uniform`` (each the same, as
            fictitious play and CFR average) or ``linear`` (the k-th measured weighs k, as CFR+ averages: the early
            policies fade).
    """

    exploitability_every: int | None = None
    exploitability_samples: int = 64
    policy_average: str = "uniform"

    def __post_init__(self) -> None:
        if self.exploitability_every is not None and self.exploitability_every < 1:
            raise ValueError(
                "game.measurement.exploitability_every must be an integer >= 1 or null, got "
                f"{self.exploitability_every}"
            )
        if self.exploitability_samples < 1:
            raise ValueError(
                f"game.measurement.exploitability_samples must be an integer >= 1, got {self.exploitability_samples}"
            )
        choice("game.measurement", self, "policy_average", POLICY_AVERAGES)


_MOVED_KEYS = {
    **{key: f"opponents.{key}" for key in ("pool_size", "pool_every", "mcts_simulations", "cfr_iterations")},
    "best_response_every": "opponents.best_response_every",
    **{key: f"measurement.{key}" for key in ("exploitability_every", "exploitability_samples", "policy_average")},
    "action_normalization": "actions.normalization",
}


def sectioned(game: Mapping[str, Any]) -> dict[str, Any]:
    """A ``game`` mapping recorded before it had sections (``pool_size``, ``actions: score`` directly under it) in
    today's layout; one in today's layout as it is. A run's checkpoint keeps its config as it was written, and
    resuming it compares that config with today's."""
    upgraded = dict(game)
    if isinstance(upgraded.get("actions"), str):
        upgraded["actions"] = {ActionsConfig.SCALAR_FIELD: upgraded["actions"]}
    for old, new in _MOVED_KEYS.items():
        if old in upgraded:
            section, key = new.split(".")
            upgraded[section] = {**(upgraded.get(section) or {}), key: upgraded.pop(old)}
    return upgraded


@dataclass
class GameConfig:
    """A batched game (:class:`~marllm.envs.games.BatchedGameEnv`) in place of the text env.

    Attributes:
        name: the game: a PettingZoo classic env (``tictactoe_v3``, ``connect_four_v3``, ``rps_v2``, ...) or
            ``openspiel:<game string>`` (``openspiel:kuhn_poker``,
            ``openspiel:repeated_game(stage_game=matrix_pd(),num_repetitions=5)``; needs ``marllm[games]``).
        seats: who plays each seat, in the game's seat order: a learner id, or ``random``, ``minimax``
            (tic-tac-toe), ``mcts``, ``cfr``, ``best_response`` or ``snapshot_pool:<learner>``. The learners of the
            run are the learner ids named here, in order of first appearance; one id in every seat is self-play (one
            learner, updated once per iteration on the moves of every seat).
        batch_size: games per iteration.
        options: keyword arguments of the PettingZoo env function (``{max_cycles: 1}`` for ``rps_v2``); OpenSpiel
            games take theirs in the game string.
        templates: the prompt: a ``str.format`` template over the game fields (``game``, ``rules``, ``role``,
            ``player``, ``state``, ``moves``, ``move_names``, ``move_number``), or one per seat (a mapping seat ->
            template); null: the default prompt. ``generation.chat_template`` wraps it in the model's chat template.
        parser: how an answer names a move: ``first`` (the first legal move named, else the first listed number),
            ``last`` or ``exact``.
        illegal: what an answer naming no legal move does: ``forfeit`` (its seat loses that game) or ``random``
            (a random legal move is played for it); either way it counts in ``illegal_move_rate``.
        discount: γ in (0, 1]: a move is credited γ^k · its game's payoff, k the mover's later moves in the game.
        illegal_penalty: >= 0, subtracted from the trained reward of every illegal answer.
        role_baselines: SPIRAL's role-conditioned advantage estimation: the decay in [0, 1) of a running baseline
            of each seat's returns, subtracted from every learner's rewards before it sees them (SPIRAL: 0.95);
            null: rewards as the game pays them.
        max_moves: answers per game (every seat's) after which a game still on is ended as a draw (payoff 0 to
            every seat), with a warning and the metric ``game/capped_rate``; null: the game's own bound where it has
            one (an OpenSpiel game's maximum length), else 1000.
        actions: how a learner's answer becomes a move (:class:`ActionsConfig`).
        opponents: the fixed opponents' settings (:class:`OpponentsConfig`).
        measurement: what is measured of the learners' policies (:class:`MeasurementConfig`).
    """

    name: str
    seats: list[str]
    batch_size: int = 32
    options: dict[str, Any] | None = None
    templates: str | dict[str, str] | None = None
    parser: str = "first"
    illegal: str = "forfeit"
    discount: float = 1.0
    illegal_penalty: float = 0.0
    role_baselines: float | None = None
    max_moves: int | None = None
    actions: ActionsConfig = field(default_factory=ActionsConfig)
    opponents: OpponentsConfig = field(default_factory=OpponentsConfig)
    measurement: MeasurementConfig = field(default_factory=MeasurementConfig)
    info: GameInfo = field(init=False, repr=False, compare=False)
    """The game, described (:func:`~marllm.envs.games.catalog.describe_game`): its seats and kind."""
    MOVED_KEYS: ClassVar[dict[str, str]] = _MOVED_KEYS
    """Keys of the flat layout -> their place in a section (the loader refuses them with it)."""

    def __post_init__(self) -> None:
        sections = {"actions": ActionsConfig, "opponents": OpponentsConfig, "measurement": MeasurementConfig}
        for key, section in sections.items():
            if not isinstance(getattr(self, key), section):
                raise TypeError(f"game.{key} must be a {section.__name__}, got {getattr(self, key)!r}")
        if self.batch_size < 1:
            raise ValueError(f"game.batch_size must be an integer >= 1, got {self.batch_size}")
        choice("game", self, "parser", tuple(PARSERS))
        choice("game", self, "illegal", ILLEGAL_POLICIES)
        if self.max_moves is not None and self.max_moves < 1:
            raise ValueError(f"game.max_moves must be an integer >= 1 (answers per game) or null, got {self.max_moves}")
        if not 0 < self.discount <= 1:
            raise ValueError(f"game.discount must be a number in (0, 1], got {self.discount}")
        if not (self.illegal_penalty >= 0 and math.isfinite(self.illegal_penalty)):
            raise ValueError(f"game.illegal_penalty must be a finite number >= 0, got {self.illegal_penalty}")
        if self.role_baselines is not None and not 0 <= self.role_baselines < 1:
            raise ValueError(f"game.role_baselines must be a decay in [0, 1) (SPIRAL: 0.95) or null, got "
                             f"{self.role_baselines}")  # fmt: skip
        parsed = self.parsed_seats()
        try:
            self.info = describe_game(self.name, self.options)
        except (ValueError, ImportError) as error:
            raise ValueError(f"game.name: {error}") from None
        except TypeError as error:  # options the env function does not take
            raise ValueError(f"game.options: {self.name} does not take {self.options}: {error}") from None
        self._check_seats(parsed)
        self._check_exact(parsed)
        try:
            check_game_templates(self.templates, self.info.seats)
        except (ValueError, TypeError) as error:
            raise ValueError(f"game.templates: {error}") from None

    def check_actions(self, stop_at_eos: bool) -> None:
        """Refuse an action mode the run's learners cannot play: ``constrained`` and ``think`` without
        ``generation.stop_at_eos`` (a move ends with EOS), and any mode but ``generate`` with a snapshot pool seat
        (snapshots answer in free text)."""
        mode = self.actions.mode
        if mode == "generate":
            return
        if mode != "score" and not stop_at_eos:
            raise ValueError(
                f"game.actions.mode: {mode} ends each answer with EOS once a move is complete; set "
                "generation.stop_at_eos: true"
            )
        pools = [seat.spec for seat in self.parsed_seats() if seat.kind == "snapshot_pool"]
        if pools:
            raise ValueError(
                f"game.actions.mode: {mode}: the seat(s) {pools} answer in free text (a snapshot pool plays "
                "game.actions.mode: generate only); use another opponent or game.actions.mode: generate"
            )

    def _check_exact(self, parsed: list[Seat]) -> None:
        """``cfr`` and ``best_response`` seats and ``measurement.exploitability_every`` need a game whose
        information states enumerate; a ``best_response`` seat, one learner to answer."""
        users = [f"game.seats[{i}]: {seat.kind}" for i, seat in enumerate(parsed) if seat.kind in EXACT_OPPONENTS]
        users += ["game.measurement.exploitability_every"] if self.measurement.exploitability_every is not None else []
        if not users:
            return
        if any(seat.kind == "best_response" for seat in parsed) and len(self.learner_ids) != 1:
            raise ValueError(
                f"game.seats: best_response answers one learner's policy; the seats name {self.learner_ids}"
            )
        if self.info.openspiel is None:
            raise ValueError(
                f"{users[0]} needs an OpenSpiel game (openspiel:<game string>, e.g. openspiel:kuhn_poker) whose "
                f"information states can be enumerated; {self.name} is a PettingZoo game"
            )
        try:
            enumerate_info_states(self.info.openspiel)
        except NotEnumerableError as error:
            raise ValueError(f"{users[0]}: {error}") from None

    def parsed_seats(self) -> list[Seat]:
        """``seats``, read (:func:`parse_seat`)."""
        if not self.seats:
            raise ValueError("game.seats must list who plays each seat of the game, e.g. [llm, random]")
        return [parse_seat(spec, f"game.seats[{i}]") for i, spec in enumerate(self.seats)]

    @property
    def learner_ids(self) -> list[str]:
        """The learners the seats name, in order of first appearance."""
        return list(dict.fromkeys(seat.learner for seat in self.parsed_seats() if seat.kind == "learner"))

    def _check_seats(self, parsed: list[Seat]) -> None:
        seats = list(self.info.seats)
        if len(parsed) != len(seats):
            raise ValueError(
                f"game.seats lists {len(parsed)} player(s) {self.seats} for {self.name}, whose seats are {seats}: "
                "give one per seat, in that order"
            )
        learners = self.learner_ids
        if not learners:
            raise ValueError(f"game.seats {self.seats} names no learner: at least one seat must be a learner id")
        clash = sorted(set(learners) & (set(seats) | {s.player_id for s in parsed if s.kind != "learner"}))
        if clash:
            raise ValueError(f"game.seats: learner id(s) {clash} are also names of the game's seats or opponents")
        for i, seat in enumerate(parsed):
            where = f"game.seats[{i}]"
            if seat.kind == "snapshot_pool" and seat.learner not in learners:
                raise ValueError(
                    f"{where}: {seat.spec} takes snapshots of learner {seat.learner!r}, which sits in no seat; the "
                    f"learners are {learners}"
                )
            if seat.kind == "minimax" and self.name not in TIC_TAC_TOE:
                games = " or ".join(TIC_TAC_TOE)
                raise ValueError(f"{where}: minimax plays tic-tac-toe only ({games}), not {self.name}")
            if seat.kind == "mcts":
                if not self.info.sequential_perfect_information:
                    raise ValueError(
                        f"{where}: mcts searches the whole state of a turn-taking game of perfect information "
                        f"(an OpenSpiel one, tictactoe_v3 or connect_four_v3); {self.name} is not one"
                    )
                try:
                    require_openspiel()
                except ImportError as error:
                    raise ValueError(f"{where}: mcts is OpenSpiel's: {error}") from None
