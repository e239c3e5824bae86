"""The ``game`` section of a training config: a batched game in place of the text env, and who sits in each seat.

A seat is a learner id (a learner the run trains; the same id in every seat is self-play) or an opponent of the
catalog :mod:`marllm.games.opponents`: ``random``, ``minimax`` (tic-tac-toe), ``mcts`` (OpenSpiel's MCTS, on
turn-taking games of perfect information), ``cfr`` and ``best_response`` (on small OpenSpiel games: CFR's average
policy, an exact best response to the learner) or ``snapshot_pool:<learner>`` (the last ``pool_size`` frozen snapshots
of that learner, one drawn per iteration), or an opponent class by reference (``my_opponent.py:MyPlayer``). The game is
built once while the config is read, so a bad name, a seat count that does not fit or a missing optional package is an
error before anything loads.

The section has three of its own: ``game.actions`` (how a learner's answer becomes a move: a mode of the catalog
:mod:`marllm.algorithms.action_catalog`, or a collector class by reference), ``game.opponents`` (the settings of the
fixed opponents) and ``game.measurement`` (what is measured of the learners' policies). A key of the flat layout that
moved into one of them (``game.pool_size``, ``game.actions: score``) is refused with its new place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from marllm.algorithms import action_catalog as modes
from marllm.games.env.checks import ILLEGAL_POLICIES
from marllm.games.env.factory import GameInfo, describe_game
from marllm.games.env.parsers import PARSERS
from marllm.games.env.prompts import check_game_templates
from marllm.games.opponents import NAMED, ONLY, SMALL_GAME, Seat, check_needs, parse_seat
from marllm.utils.checks import choice

__all__ = ["ActionsConfig", "GameConfig", "MeasurementConfig", "OpponentsConfig", "Seat", "parse_seat"]

GAME_REPETITION_PENALTY = 1.0
"""``generation.repetition_penalty`` of a config with a ``game`` section that does not set it, in every action mode: a
game's prompt names its legal moves, so any penalty > 1 would fall on exactly the tokens a move is made of (under
``score`` no processor applies, whatever the setting)."""

POLICY_AVERAGES = ("uniform", "linear")
"""How the measured policies weigh in a run's average policy (``game.measurement.policy_average``)."""


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
            are sampled, as ``generate``'s); or a collector class by reference (``my_mode.py:MyCollector``,
            relative to the config's folder; :mod:`marllm.algorithms.action_catalog`). ``marllm eval`` plays with
            the same mode. Every learner of
            ``agents.algorithm`` plays every mode (:mod:`marllm.algorithms.actions`); ``grpo`` and ``rloo`` are
            refused in a game.
        normalization: ``score``'s normalisation of a move's log-likelihood: ``none`` (the sum over its tokens:
            favours short names), ``token`` (the mean per token, TWOSOME's token normalisation) or ``word`` (the sum
            divided by the name's words, TWOSOME's word normalisation). ``score`` only: another value than ``token``
            with another mode is refused; ``token`` itself is accepted with every mode, as the default cannot be told
            from a value left out and a run directory's ``config.yaml`` records every key.
    """

    mode: str = "generate"
    normalization: str = "token"
    SCALAR_FIELD: ClassVar[str] = "mode"
    """The field a scalar given for the whole section was meant for (the error names it)."""

    def __post_init__(self) -> None:
        if not (isinstance(self.mode, str) and (self.mode in modes.ACTION_MODES or modes.is_reference(self.mode))):
            raise ValueError(
                f"game.actions.mode must be one of {list(modes.ACTION_MODES)} or a collector class by reference "
                f"({modes.REFERENCE_FORMS}), got {self.mode!r}"
            )
        facts = self.facts
        takers = modes.modes_taking("normalization")
        values = {value: None for name in takers for value in modes.CATALOG[name].facts.options["normalization"]}
        choice("game.actions", self, "normalization", tuple(facts.options.get("normalization", values)))
        default = type(self).__dataclass_fields__["normalization"].default
        if "normalization" not in facts.options and self.normalization != default:
            # the default is accepted with every mode, as the dataclass cannot tell it from a value left out
            raise ValueError(
                f"game.actions.normalization: {self.normalization} applies to game.actions.mode: {' or '.join(takers)} "
                f"only (how it normalises a move's log-likelihood), and game.actions.mode is {self.mode}, which would "
                f"ignore it; leave game.actions.normalization out, or set game.actions.mode: {takers[0]}"
            )

    @property
    def facts(self) -> type[modes.ActionMode]:
        """The mode's facts (:func:`~marllm.algorithms.action_catalog.action_mode`; a referenced collector class,
        loaded)."""
        return modes.action_mode(self.mode)

    @property
    def options(self) -> dict[str, Any]:
        """The mode's own settings, as its collector takes them (``normalization`` for ``score``)."""
        return {key: getattr(self, key) for key in self.facts.options if hasattr(self, key)}


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
        exploitability_samples: answers per information state that tabulate a ``generate`` or ``think`` learner's
            policy, in training and by ``marllm eval --exploitability`` (``constrained`` and ``score`` learners are
            tabulated exactly and do not read it; it passes under them, so that one config switches mode by one
            override).
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


@dataclass
class GameConfig:
    """A batched game (:class:`~marllm.games.env.BatchedGameEnv`) in place of the text env.

    Attributes:
        name: the game: a PettingZoo classic env (``tictactoe_v3``, ``connect_four_v3``, ``rps_v2``, ...) or
            ``openspiel:<game string>`` (``openspiel:kuhn_poker``,
            ``openspiel:repeated_game(stage_game=matrix_pd(),num_repetitions=5)``; needs ``marllm[games]``), or a
            game of one's own by reference (``my_game.py:env``, relative to the config's folder: a factory of an AEC
            env, called with ``options``).
        seats: who plays each seat, in the game's seat order: a learner id, or an opponent
            (:mod:`marllm.games.opponents`): ``random``, ``minimax`` (tic-tac-toe), ``mcts``, ``cfr``,
            ``best_response``, ``snapshot_pool:<learner>`` or a class by reference (``my_opponent.py:MyPlayer``,
            relative to the config's folder). The learners of the
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
    """The game, described (:func:`~marllm.games.env.factory.describe_game`): its seats and kind."""
    seat_values: tuple[Seat, ...] = field(init=False, repr=False, compare=False)
    """``seats``, each read once into a typed :class:`Seat` (:func:`parse_seat`) when the config is made."""

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
        if not self.seats:
            raise ValueError("game.seats must list who plays each seat of the game, e.g. [llm, random]")
        self.seat_values = tuple(parse_seat(spec, f"game.seats[{i}]") for i, spec in enumerate(self.seats))
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
        """Refuse an action mode the run's learners cannot play: one whose answers end with EOS (``constrained``,
        ``think``) without ``generation.stop_at_eos``, and one that an opponent watching a learner does not play (a
        snapshot pool's snapshots answer with ``generate``)."""
        mode = self.actions.mode
        if self.actions.facts.ends_with_eos and not stop_at_eos:
            raise ValueError(
                f"game.actions.mode: {mode} ends each answer with EOS once a move is complete; set "
                "generation.stop_at_eos: true"
            )
        for seat in self.parsed_seats():
            plays = None if seat.is_learner else seat.opponent.plays_mode
            if plays is not None and plays != mode:
                others = [other.spec for other in self.parsed_seats() if other.kind == seat.kind]
                raise ValueError(
                    f"game.actions.mode: {mode}: the seat(s) {others} answer as their learner did in "
                    f"game.actions.mode: {plays} (a {seat.kind.replace('_', ' ')} plays game.actions.mode: {plays} "
                    f"only); use another opponent or game.actions.mode: {plays}"
                )

    def _check_exact(self, parsed: list[Seat]) -> None:
        """The seats whose opponent needs a small game and ``measurement.exploitability_every`` need a game whose
        information states enumerate (checked once, naming the first)."""
        users = [f"game.seats[{i}]: {seat.kind}" for i, seat in enumerate(parsed) if SMALL_GAME in self._needs(seat)]
        users += ["game.measurement.exploitability_every"] if self.measurement.exploitability_every is not None else []
        if users:
            check_needs(self, users[0], (SMALL_GAME,))

    @staticmethod
    def _needs(seat: Seat) -> tuple[str, ...]:
        return () if seat.is_learner else seat.opponent.needs

    def parsed_seats(self) -> list[Seat]:
        """``seats`` as typed values, read once when the config was made (:attr:`seat_values`)."""
        return list(self.seat_values)

    @property
    def learner_ids(self) -> list[str]:
        """The learners the seats name, in order of first appearance."""
        return list(dict.fromkeys(seat.learner for seat in self.parsed_seats() if seat.is_learner))

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
        clash = sorted(set(learners) & (set(seats) | {s.player_id for s in parsed if not s.is_learner}))
        if clash:
            raise ValueError(f"game.seats: learner id(s) {clash} are also names of the game's seats or opponents")
        specs: dict[str, set[str]] = {}
        for seat in parsed:
            if not seat.is_learner:
                specs.setdefault(seat.player_id, set()).add(seat.spec)
        shared = {player: sorted(named) for player, named in specs.items() if len(named) > 1}
        if shared:
            raise ValueError(
                f"game.seats: {shared} are different opponents whose players would share the id they are logged and "
                "seated by; give their classes different names"
            )
        for i, seat in enumerate(parsed):
            self._check_opponent(seat, f"game.seats[{i}]", learners)

    def _check_opponent(self, seat: Seat, where: str, learners: list[str]) -> None:
        """An opponent's seat: the learner it watches sits in a seat (or is the run's only one), and the game has
        what it needs (but a small game, which :meth:`_check_exact` checks once)."""
        if seat.is_learner:
            return
        try:
            entry = seat.opponent
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
        assert entry is not None
        if entry.learner == NAMED and seat.learner not in learners:
            raise ValueError(
                f"{where}: {seat.spec} {entry.watching} learner {seat.learner!r}, which sits in no seat; the "
                f"learners are {learners}"
            )
        if entry.learner == ONLY and len(learners) != 1:
            raise ValueError(
                f"game.seats: {seat.kind} {entry.watching} one learner's policy; the seats name {learners}"
            )
        check_needs(self, f"{where}: {seat.kind}", tuple(need for need in entry.needs if need != SMALL_GAME))
