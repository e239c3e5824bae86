"""The ``game`` section of a training config: a batched game in place of the text env, who sits in each seat, how a
learner's answer becomes a move, and what is measured of the learners' policies.

Each part owns its settings: a seat names its opponent with the opponent's settings (``seats: [llm, {cfr:
{iterations: 200}}]``, :mod:`marllm.games.opponents`), the action mode names its own (``actions: {score:
{normalization: word}}``, :mod:`marllm.algorithms.action_modes`), and the exploitability measured while training
holds its period and weighting (``exploitability: {every: 5, average: linear}``, null: not measured). A setting that
no part would read has nowhere to be written.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from marllm.algorithms import action_modes
from marllm.algorithms import action_registry as modes
from marllm.games.env.checks import ILLEGAL_POLICIES
from marllm.games.env.factory import GameInfo, describe_game
from marllm.games.env.prompts import HISTORIES, check_game_templates
from marllm.games.opponents import NAMED, ONLY, SMALL_GAME, Seat, check_needs
from marllm.utils.checks import choice
from marllm.utils.dataclass_tree import to_dict

__all__ = ["ActionsConfig", "ExploitabilityConfig", "GameConfig", "Seat"]

GAME_REPETITION_PENALTY = 1.0
"""``generation.repetition_penalty`` of a config with a ``game`` section that does not set it, in every action mode: a
game's prompt names its legal moves, so any penalty > 1 would fall on exactly the tokens a move is made of (under
``score`` no processor applies, whatever the setting)."""

POLICY_AVERAGES = ("uniform", "linear")
"""How the measured policies weigh in a run's average policy (``game.exploitability.average``)."""

DEFAULT_PARSER = action_modes.GenerateSettings.parser
"""The parser of a mode whose answers are a legal move's exact name, which every parser reads alike."""


@dataclass(frozen=True)
class ActionsConfig:
    """``game.actions``: how a learner's answer becomes a move, one mode and its own settings.

    Written as the mode's name (``actions: score``: its default settings) or the name and its settings (``actions:
    {score: {normalization: word}}``). The modes (:mod:`marllm.algorithms.action_modes`): ``generate`` (free text of
    up to ``max_new_tokens``, then its ``parser``: the model must learn the answer format, and may answer
    illegally); ``constrained`` (sampled token by token from the model's distribution restricted to continuations of
    the legal moves' names, then EOS: every answer is legal, and the token-level update re-applies the restriction,
    so its ratio is that of the distribution sampled); ``score`` (TWOSOME/GLAM: a categorical over the legal moves,
    each scored by the model's likelihood of its name after the prompt, normalised by its ``normalization``; one
    move is one action, with a value head on the prompt's last hidden state for ``ppo``); ``think`` (SPIRAL's
    reason, then act: free text of generation's budget, then ``\\nMove:`` and a ``constrained`` move, credited as one
    response); or a collector class by reference (``my_mode.py:MyCollector``, relative to the config's folder).
    ``marllm eval`` plays with the same mode. Every learner of ``agents.algorithm`` plays every mode; ``grpo`` and
    ``rloo`` are refused in a game.

    Attributes:
        mode: the mode's name or reference.
        settings: its ``Settings`` (None for a mode without settings).
    """

    mode: str = modes.DEFAULT_MODE
    settings: Any = None

    @classmethod
    def from_config(cls, value: Any, path: str) -> ActionsConfig:
        """Read ``actions`` as written: a mode's name, or ``{mode: {settings}}``."""
        if isinstance(value, ActionsConfig):
            return value
        if value is None or value == {}:
            value = modes.DEFAULT_MODE
        if isinstance(value, Mapping):
            if len(value) != 1:
                raise ValueError(f"{path}: one action mode and its settings, e.g. {{score: {{normalization: word}}}}, "
                                 f"got {dict(value)}")  # fmt: skip
            [(mode, given)] = value.items()
        else:
            mode, given = value, None
        if not isinstance(mode, str):
            raise ValueError(f"{path} must be {modes.ACTION_MODE_REGISTRY.valid()}, got {mode!r}")
        return cls(mode, modes.mode_settings(mode, given, path))

    def to_config(self) -> Any:
        """The section as a config writes it."""
        return self.mode if self.settings is None else {self.mode: to_dict(self.settings)}

    @property
    def facts(self) -> type[action_modes.ActionMode]:
        """The mode's facts (:func:`~marllm.algorithms.action_registry.action_mode`; a referenced collector, loaded)."""
        return modes.action_mode(self.mode)

    @property
    def options(self) -> dict[str, Any]:
        """The mode's settings as its collector takes them (``normalization`` for ``score``); the settings of every
        mode's tabulation and parsing are read where those happen."""
        return {key: value for key, value in vars(self.settings or object()).items() if key == "normalization"}

    @property
    def normalization(self) -> str | None:
        """``score``'s normalisation (None for another mode)."""
        return getattr(self.settings, "normalization", None)

    @property
    def parser(self) -> str:
        """How an answer names a move: ``generate``'s parser, else :data:`DEFAULT_PARSER`."""
        return getattr(self.settings, "parser", DEFAULT_PARSER)

    @property
    def exploitability_samples(self) -> int:
        """Answers per information state that tabulate a sampled policy: the mode's setting, else the default of
        :class:`~marllm.algorithms.action_modes.SampledPolicySettings` (a mode with exact move probabilities
        samples nothing)."""
        default = action_modes.SampledPolicySettings.exploitability_samples
        return getattr(self.settings, "exploitability_samples", default)


@dataclass
class ExploitabilityConfig:
    """``game.exploitability``: the exploitability of each learner's tabulated policy, measured while it trains
    (:mod:`marllm.games.exploitability`; small OpenSpiel games only: Kuhn, Leduc poker, matrix games, small repeated
    games). A sampled mode's policy is tabulated from its ``exploitability_samples`` answers per information state.

    Attributes:
        every: every this many iterations, the metric ``<learner>/game/exploitability`` (and ``nash_conv``).
        average: the weights of the measured policies in the average policy whose exploitability is logged beside
            the last one's (``<learner>/game/exploitability_average``): ``uniform`` (each the same, as fictitious
            play and CFR average) or ``linear`` (the k-th measured weighs k, as CFR+ averages: the early ones fade).
    """

    every: int = 1
    average: str = "uniform"

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"game.exploitability.every must be an integer >= 1, got {self.every}")
        choice("game.exploitability", self, "average", POLICY_AVERAGES)


@dataclass
class GameConfig:
    """A batched game (:class:`~marllm.games.env.BatchedGameEnv`) in place of the text env.

    Attributes:
        name: the game: a PettingZoo classic env (``tictactoe_v3``, ``connect_four_v3``, ``rps_v2``, ...) or
            ``openspiel:<game string>`` (``openspiel:kuhn_poker``,
            ``openspiel:repeated_game(stage_game=matrix_pd(),num_repetitions=5)``; needs ``marllm[games]``), or a
            game of one's own by reference (``my_game.py:env``, relative to the config's folder: a factory of an AEC
            env, called with ``options``).
        seats: who plays each seat, in the game's seat order (:class:`~marllm.games.opponents.Seat`): a learner id,
            or an opponent (:mod:`marllm.games.opponents`) with its settings where it has any: ``random``,
            ``minimax`` (tic-tac-toe), ``mcts`` (``{mcts: {simulations: 100}}``), ``cfr`` (``{cfr: {iterations:
            100}}``), ``best_response`` (``{best_response: {every: 1}}``), ``{snapshot_pool: {learner: llm, size: 4,
            every: 1}}``, or a class by reference (``my_opponent.py:MyPlayer``, relative to the config's folder). The
            learners of the run are the learner ids named here, in order of first appearance; one id in every seat
            is self-play (one learner, updated once per iteration on the moves of every seat).
        batch_size: games per iteration.
        options: keyword arguments of the PettingZoo env function (``{max_cycles: 1}`` for ``rps_v2``); OpenSpiel
            games take theirs in the game string.
        templates: the prompt: a ``str.format`` template over the game fields (``game``, ``rules``, ``role``,
            ``player``, ``state``, ``moves``, ``move_names``, ``move_number``), or one per seat (a mapping seat ->
            template); null: the default prompt. ``generation.chat_template`` wraps it in the model's chat template.
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
        actions: how a learner's answer becomes a move, a mode and its settings (:class:`ActionsConfig`).
        history: how a learner reads a game: ``prompt`` (at each turn a prompt rendered from the whole game so far)
            or ``sequence`` (one token sequence per seat and game: its first prompt, then at each turn only what is
            new, after its answers as sampled; one forward per sequence in the update, GAE across its turns; ``ppo``
            and token-sampling modes only: see the games guide's cost model).
        exploitability: the exploitability measured while training (:class:`ExploitabilityConfig`); null: none.
    """

    name: str
    seats: list[Seat]
    batch_size: int = 32
    options: dict[str, Any] | None = None
    templates: str | dict[str, str] | None = None
    illegal: str = "forfeit"
    discount: float = 1.0
    illegal_penalty: float = 0.0
    role_baselines: float | None = None
    max_moves: int | None = None
    actions: ActionsConfig = field(default_factory=ActionsConfig)
    history: str = "prompt"
    exploitability: ExploitabilityConfig | None = None

    def __post_init__(self) -> None:
        """The section's own checks, none of which builds the game (:meth:`check_game` does, before a run loads)."""
        self.seats = [Seat.from_config(seat, f"game.seats[{i}]") for i, seat in enumerate(self.seats or [])]
        if not isinstance(self.actions, ActionsConfig):
            self.actions = ActionsConfig.from_config(self.actions, "game.actions")
        if self.batch_size < 1:
            raise ValueError(f"game.batch_size must be an integer >= 1, got {self.batch_size}")
        choice("game", self, "illegal", ILLEGAL_POLICIES)
        choice("game", self, "history", HISTORIES)
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
        self._check_learners(self.seats)

    @functools.cached_property
    def info(self) -> GameInfo:
        """The game, described (:func:`~marllm.games.env.factory.describe_game`: built once, its seats and kind
        read), on first use.

        Raises:
            ValueError: an unknown game, or options its env function does not take.
        """
        try:
            return describe_game(self.name, self.options)
        except (ValueError, ImportError) as error:
            raise ValueError(f"game.name: {error}") from None
        except TypeError as error:  # options the env function does not take
            raise ValueError(f"game.options: {self.name} does not take {self.options}: {error}") from None

    def check_game(self) -> None:
        """The checks that need the game itself: it exists with these options, the seats fit its seats, each
        opponent has what it needs of it (a small game's information states enumerated where one needs them), the
        templates name its fields. Run before a run, an evaluation or a plan loads anything; reading a config builds
        no game.

        Raises:
            ValueError: naming the key.
        """
        seats = list(self.info.seats)
        if len(self.seats) != len(seats):
            raise ValueError(
                f"game.seats lists {len(self.seats)} player(s) {[seat.spec for seat in self.seats]} for {self.name}, "
                f"whose seats are {seats}: give one per seat, in that order"
            )
        clash = sorted(set(self.learner_ids) & set(seats))
        if clash:
            raise ValueError(f"game.seats: learner id(s) {clash} are also names of the game's seats or opponents")
        for i, seat in enumerate(self.seats):
            if not seat.is_learner:
                needs = tuple(need for need in seat.opponent.needs if need != SMALL_GAME)
                check_needs(self, f"game.seats[{i}]: {seat.kind}", needs)
        self._check_exact(self.seats)
        try:
            check_game_templates(self.templates, self.info.seats)
        except (ValueError, TypeError) as error:
            raise ValueError(f"game.templates: {error}") from None

    @property
    def parser(self) -> str:
        """How an answer names a move (the action mode's; :attr:`ActionsConfig.parser`)."""
        return self.actions.parser

    def check_actions(self, stop_at_eos: bool) -> None:
        """Refuse an action mode the run's learners cannot play: one whose answers end with EOS (``constrained``,
        ``think``) without ``generation.stop_at_eos``, and one that an opponent watching a learner does not play (a
        snapshot pool's snapshots answer with ``generate``)."""
        mode = self.actions.mode
        if self.actions.facts.ends_with_eos and not stop_at_eos:
            raise ValueError(
                f"game.actions: {mode} ends each answer with EOS once a move is complete; set "
                "generation.stop_at_eos: true"
            )
        for seat in self.seats:
            plays = None if seat.is_learner else seat.opponent.plays_mode
            if plays is not None and plays != mode:
                others = [other.spec for other in self.seats if other.kind == seat.kind]
                raise ValueError(
                    f"game.actions: {mode}: the seat(s) {others} answer as their learner did in "
                    f"game.actions: {plays} (a {seat.kind.replace('_', ' ')} plays game.actions: {plays} "
                    f"only); use another opponent or game.actions: {plays}"
                )

    def _check_exact(self, parsed: list[Seat]) -> None:
        """The seats whose opponent needs a small game and ``exploitability`` need a game whose information states
        enumerate (checked once, naming the first)."""
        users = [f"game.seats[{i}]: {seat.kind}" for i, seat in enumerate(parsed) if SMALL_GAME in self._needs(seat)]
        users += ["game.exploitability"] if self.exploitability is not None else []
        if users:
            check_needs(self, users[0], (SMALL_GAME,))

    @staticmethod
    def _needs(seat: Seat) -> tuple[str, ...]:
        return () if seat.is_learner else seat.opponent.needs

    @property
    def learner_ids(self) -> list[str]:
        """The learners the seats name, in order of first appearance."""
        return list(dict.fromkeys(seat.learner for seat in self.seats if seat.is_learner))

    def _check_learners(self, parsed: list[Seat]) -> None:
        """Who plays: at least one learner, no learner named as an opponent, each opponent watching a seated
        learner."""
        learners = self.learner_ids
        if not learners:
            raise ValueError(
                f"game.seats {[seat.spec for seat in parsed]} names no learner: at least one seat must be a learner id"
            )
        clash = sorted(set(learners) & {s.player_id for s in parsed if not s.is_learner})
        if clash:
            raise ValueError(f"game.seats: learner id(s) {clash} are also names of the game's seats or opponents")
        specs: dict[str, set[str]] = {}
        for seat in parsed:
            if not seat.is_learner:
                specs.setdefault(seat.player_id, set()).add(json.dumps(seat.to_config(), sort_keys=True))
        shared = {player: sorted(named) for player, named in specs.items() if len(named) > 1}
        if shared:
            raise ValueError(
                f"game.seats: {shared} are different opponents (or one with different settings) whose players would "
                "share the id they are logged and seated by; give their classes different names, or the seats one "
                "opponent's settings"
            )
        for i, seat in enumerate(parsed):
            self._check_opponent(seat, f"game.seats[{i}]", learners)

    def _check_opponent(self, seat: Seat, where: str, learners: list[str]) -> None:
        """An opponent's seat: the learner it watches sits in a seat (or is the run's only one)."""
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
