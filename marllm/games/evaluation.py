"""Models at a game: win, draw, loss and illegal-move rates against fixed opponents, in each seat, with 95% intervals.

A model is the base model or a saved learner (``RUN_DIR/checkpoints/LEARNER``), as ``marllm eval`` loads them
(:func:`~marllm.evaluation.deployed.load_deployed_model`); it answers the config's game prompts as the run's learners
did (:meth:`~marllm.games.model_player.ModelPlayer.of_run`: the config's action mode, sampling and compute settings;
free text with each answer's budget drawn from ``[min_new_tokens, max_new_tokens]``, the distribution training
sampled). Each (model, opponent, seat) plays ``games`` games of the
config's game, parser and illegal-answer policy, dealt from the same seeds for every model (so models are compared on
the same deals). The opponents are those of :mod:`marllm.games.opponents` that watch no learner (``random``,
``minimax`` for tic-tac-toe, ``mcts``, ``cfr`` for small OpenSpiel games: CFR's average policy after
its settings' ``iterations``), an opponent class by reference, and ``self`` (the model in every
seat).

Rates are per game (win, draw, loss) or per answer (illegal moves), with Wilson score 95% intervals; the mean payoff
has a Student-t 95% interval over games (:mod:`marllm.utils.statistics`). Where the game's view names a cooperative
move (a symmetric social dilemma: the prisoner's dilemma's Cooperate, see
:meth:`~marllm.games.env.GameView.cooperative_move`), the cooperation rate is the fraction of the model's legal
answers that chose it. Answers within one game are not independent: the per-answer intervals are narrower than a
per-game analysis would give.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from marllm.config import TrainConfig
from marllm.evaluation.deployed import load_deployed_model
from marllm.games import opponents as catalog
from marllm.games.build import fixed_player, game_env
from marllm.games.env.factory import TIC_TAC_TOE
from marllm.games.env.keys import OUTCOMES, PAYOFFS
from marllm.games.model_player import ModelPlayer
from marllm.games.players.fixed import FixedPlayer
from marllm.games.settings import GameConfig
from marllm.loop import play_episode
from marllm.utils.registry import reference_problem
from marllm.utils.statistics import estimate

Z_95 = 1.959963984540054
"""The standard normal's 0.975 quantile."""

SELF = catalog.SELF
"""The opponent that is the model itself, in every other seat."""

OPPONENTS = (*catalog.FIXED_OPPONENTS, SELF)
"""The opponents :func:`evaluate_game` knows by name (besides opponent classes by reference)."""


@dataclass(frozen=True)
class Rate:
    """A proportion ``successes / n`` with its Wilson score 95% interval (None bounds when ``n`` is 0)."""

    rate: float | None
    low: float | None
    high: float | None
    n: int

    def as_dict(self, prefix: str) -> dict[str, float | int | None]:
        return {prefix: self.rate, f"{prefix}_low": self.low, f"{prefix}_high": self.high, f"{prefix}_n": self.n}

    def text(self) -> str:
        if self.rate is None:
            return "-"
        return f"{self.rate:.2f} [{self.low:.2f}, {self.high:.2f}]"


def wilson(successes: int, n: int, z: float = Z_95) -> Rate:
    """The Wilson score interval of a proportion: (p̂ + z²/2n ± z·√(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n)."""
    if n == 0:
        return Rate(None, None, None, 0)
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, n], got {successes} of {n}")
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact at the ends (no rounding error)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Rate(p, low, high, n)


@dataclass
class GameEvalRow:
    """One model against one opponent in one seat, over ``games`` games."""

    model: str
    opponent: str
    seat: str
    games: int
    win: Rate
    draw: Rate
    loss: Rate
    illegal: Rate
    """Over the model's answers (each answer is one move)."""
    payoff: dict[str, float | int | None]
    """The mean payoff per game with its t interval (:meth:`~marllm.utils.statistics.Estimate.as_dict`)."""
    cooperation: Rate | None
    """Over the model's legal answers, where the game has a cooperative move; else None."""

    def to_dict(self) -> dict[str, Any]:
        row: dict[str, Any] = {"model": self.model, "opponent": self.opponent, "seat": self.seat, "games": self.games}
        for name, rate in (("win_rate", self.win), ("draw_rate", self.draw), ("loss_rate", self.loss)):
            row.update(rate.as_dict(name))
        row.update(self.illegal.as_dict("illegal_move_rate"))
        row.update({f"payoff_{key}" if key != "mean" else "payoff": value for key, value in self.payoff.items()})
        row.update(self.cooperation.as_dict("cooperation_rate") if self.cooperation is not None else {})
        return row


@dataclass
class GameEvalResult:
    """Every (model, opponent, seat) row of an evaluation of ``game``."""

    game: str
    seats: list[str]
    rows: list[GameEvalRow] = field(default_factory=list)
    actions: str = "generate"
    """How the models' answers became moves (``game.actions``)."""

    def row(self, model: str, opponent: str, seat: str) -> GameEvalRow:
        for row in self.rows:
            if (row.model, row.opponent, row.seat) == (model, opponent, seat):
                return row
        raise KeyError(f"no row for model {model!r}, opponent {opponent!r}, seat {seat!r}")

    def to_dict(self) -> dict[str, Any]:
        rows = [row.to_dict() for row in self.rows]
        return {"game": self.game, "seats": self.seats, "actions": self.actions, "rows": rows}

    def to_markdown(self) -> str:
        """One table: a row per model, opponent and seat; rates with their 95% intervals."""
        cooperation = any(row.cooperation is not None for row in self.rows)
        header = ["model", "opponent", "seat", "games", "win", "draw", "loss", "illegal moves", "payoff"]
        header += ["cooperation"] if cooperation else []
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row in self.rows:
            payoff = row.payoff
            interval = f" [{payoff['ci_low']:.2f}, {payoff['ci_high']:.2f}]" if payoff["ci_low"] is not None else ""
            cells = [row.model, row.opponent, row.seat, str(row.games), row.win.text(), row.draw.text()]
            cells += [row.loss.text(), row.illegal.text(), f"{payoff['mean']:.2f}{interval}"]
            if cooperation:
                cells.append(row.cooperation.text() if row.cooperation is not None else "-")
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)


def default_opponents(game: GameConfig) -> list[str]:
    """``random``, ``minimax`` for tic-tac-toe, and ``self`` for a game with a cooperative move (a social
    dilemma, where how a model plays itself is the question)."""
    opponents = ["random"] + (["minimax"] if game.name in TIC_TAC_TOE else [])
    return opponents + ([SELF] if _has_cooperative_move(game) else [])


def _has_cooperative_move(game: GameConfig) -> bool:
    environment = game_env(game, 1)
    environment.reset(seed=0)
    first = environment.possible_agents[0]
    try:
        return environment.view.cooperative_move(environment.games[0], first) is not None
    finally:
        environment.close()


def check_opponents(game: GameConfig, opponents: Sequence[str]) -> None:
    """Raise ``ValueError`` naming an opponent that is unknown or does not play ``game`` (what its entry of
    :mod:`marllm.games.opponents` needs)."""
    for name in opponents:
        if name == SELF:
            continue
        reference = catalog.OPPONENT_REGISTRY.is_reference(name) and reference_problem(name) is None
        known = name in catalog.FIXED_OPPONENTS or reference
        if not known or catalog.opponent(name).learner is not None:
            raise ValueError(f"unknown opponent {name!r}; the opponents are {list(OPPONENTS)} or a class by reference")
        catalog.check_needs(game, name, catalog.opponent(name).needs)


def evaluate_game(
    config: TrainConfig,
    checkpoints: Sequence[str] = ("base",),
    opponents: Sequence[str] | None = None,
    games: int = 100,
    batch_size: int = 64,
    seed: int = 0,
) -> GameEvalResult:
    """Each model of ``checkpoints`` against each opponent, in each seat of the config's game.

    Args:
        config: a config with a ``game`` section (its game, options, templates, parser, illegal-answer policy), model
            and generation settings.
        checkpoints: ``base`` or ``RUN_DIR/checkpoints/LEARNER`` directories.
        opponents: from :data:`OPPONENTS`; None: :func:`default_opponents`.
        games: games per model, opponent and seat.
        batch_size: games played at once (one batched generation per move).
        seed: deals the games (the same for every model) and seeds the opponents and the sampling.

    Returns:
        A row per model, opponent and seat (for ``self``, the model's results in each seat against itself).

    Raises:
        ValueError: the config has no game section, an opponent does not play the game, or a count is below 1.
    """
    game = config.game
    if game is None:
        raise ValueError("evaluate_game needs a config with a game section")
    config.check_game()  # its settings against the game, before anything loads
    if games < 1 or batch_size < 1:
        raise ValueError(f"games and batch_size must be >= 1, got {games} and {batch_size}")
    opponents = list(default_opponents(game) if opponents is None else opponents)
    check_opponents(game, opponents)
    seats = list(game.info.seats)
    result = GameEvalResult(game.name, seats, actions=game.actions.mode)
    for checkpoint in checkpoints:
        model, label, tokenizer = load_deployed_model(config, checkpoint)
        model.eval()
        player = ModelPlayer.of_run(label, model, tokenizer, config)
        for opponent in opponents:
            for seat in seats:
                result.rows.append(_play(config, player, opponent, seat, games, batch_size, seed))
        del model
    return result


PlayerSource = Callable[[int], FixedPlayer]
"""Gives the player of a batch of games from that batch's seed: a fresh seeded fixed opponent, or a model's player."""


def player_source(game: GameConfig, name: str, player: ModelPlayer | None = None) -> PlayerSource:
    """The player named ``name``: ``player`` (a model, the same object for every batch) or a fixed opponent."""
    if player is not None:
        return lambda seed: player
    return lambda seed: fixed_player(game, name, name, seed)


def _play(
    config: TrainConfig, player: ModelPlayer, opponent: str, seat: str, games: int, batch_size: int, seed: int
) -> GameEvalRow:
    """``games`` games of ``player`` in ``seat`` against ``opponent`` in the others."""
    game = config.game
    assert game is not None
    other = player_source(game, opponent, player if opponent == SELF else None)
    return play_matches(config, player.name, lambda s: player, opponent, other, seat, games, batch_size, seed)[0]


def play_matches(
    config: TrainConfig,
    name: str,
    source: PlayerSource,
    opponent: str,
    opponent_source: PlayerSource,
    seat: str,
    games: int,
    batch_size: int,
    seed: int,
) -> tuple[GameEvalRow, np.ndarray]:
    """``games`` games of player ``name`` in ``seat`` against ``opponent`` in the others: the row of rates and each
    game's outcome for ``name`` (1 win, 0 draw, −1 loss)."""
    game = config.game
    assert game is not None
    torch.manual_seed(seed)
    payoffs, outcomes, answers, illegal, cooperative, legal = [], [], 0, 0, 0, 0
    has_cooperation = False
    for start in range(0, games, batch_size):
        count = min(batch_size, games - start)
        environment = game_env(game, count, seed + start)
        player, other = source(seed + start), opponent_source(seed + start)
        players = {s: (player if s == seat else other) for s in environment.possible_agents}
        episode = play_episode(environment, players, seed=seed + start)
        payoffs.append(np.asarray(episode.final_infos[seat][PAYOFFS], dtype=np.float64))
        outcomes.append(np.asarray(episode.final_infos[seat][OUTCOMES]))
        answers += sum(record.answers[seat] for record in environment.records)
        illegal += sum(record.illegal[seat] for record in environment.records)
        counts = environment.cooperation_counts(seat)
        if counts is not None:
            has_cooperation = True
            cooperative, legal = cooperative + counts[0], legal + counts[1]
        for fixed in {id(p): p for p in players.values()}.values():
            fixed.update()  # drop the rewards it was credited (fixed players keep them for a metric)
        environment.close()
    outcome = np.concatenate(outcomes)
    row = GameEvalRow(
        model=name,
        opponent=opponent,
        seat=seat,
        games=len(outcome),
        win=wilson(int(np.sum(outcome == 1)), len(outcome)),
        draw=wilson(int(np.sum(outcome == 0)), len(outcome)),
        loss=wilson(int(np.sum(outcome == -1)), len(outcome)),
        illegal=wilson(illegal, answers),
        payoff=estimate(np.concatenate(payoffs)).as_dict(),
        cooperation=wilson(cooperative, legal) if has_cooperation else None,
    )
    return row, outcome
