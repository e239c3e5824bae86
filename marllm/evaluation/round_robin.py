"""A round-robin between models and fixed players at a two-seat game, rated by Bradley–Terry on the Elo scale.

Every pair of participants plays ``games`` games with each of them in each seat (the same deals for every pair, as
:func:`~marllm.games.evaluation.evaluate_game` deals them), and :func:`~marllm.evaluation.ratings.bradley_terry`
rates them from the scores (win 1, draw ½, loss 0; a forfeit is a loss) with bootstrap 95% intervals, the first
participant rated 0. Participants are checkpoints (``base`` or ``RUN_DIR/checkpoints/LEARNER``) and the fixed
players ``random``, ``minimax`` (tic-tac-toe) and ``mcts``, which anchor the scale to something that does not learn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marllm.config import TrainConfig
from marllm.evaluation.deployed import load_deployed_model
from marllm.evaluation.ratings import Rating, bradley_terry
from marllm.games.evaluation import (
    SELF,
    GameEvalRow,
    check_opponents,
    play_matches,
    player_source,
)
from marllm.games.model_player import ModelPlayer


@dataclass
class RoundRobinResult:
    """The ratings of a round-robin, each pairing's score, and every (player, opponent, seat) row of rates."""

    game: str
    players: list[str]
    ratings: list[Rating]
    scores: dict[tuple[str, str], float]
    """The mean score of the first of a pair against the second over both seats (1 win, ½ draw, 0 loss)."""
    rows: list[GameEvalRow] = field(default_factory=list)

    def rating(self, player: str) -> Rating:
        for rating in self.ratings:
            if rating.player == player:
                return rating
        raise KeyError(f"no rating for {player!r}; the players are {self.players}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "game": self.game,
            "players": self.players,
            "ratings": [rating.as_dict() for rating in self.ratings],
            "scores": [{"player": a, "opponent": b, "score": score} for (a, b), score in self.scores.items()],
            "rows": [row.to_dict() for row in self.rows],
        }

    def to_markdown(self) -> str:
        """The ratings table, then the matrix of each row player's mean score against each column player."""
        lines = ["| player | Elo | 95% interval | games | score |", "|---|---|---|---|---|"]
        for r in sorted(self.ratings, key=lambda rating: -rating.elo):
            lines.append(f"| {r.player} | {r.elo:+.0f} | [{r.low:+.0f}, {r.high:+.0f}] | {r.games} | {r.score:.2f} |")
        lines += ["", "| score of row against column | " + " | ".join(self.players) + " |"]
        lines.append("|---|" + "---|" * len(self.players))
        for a in self.players:
            cells = ["-" if a == b else f"{self._score(a, b):.2f}" for b in self.players]
            lines.append(f"| {a} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def _score(self, a: str, b: str) -> float:
        return self.scores[(a, b)] if (a, b) in self.scores else 1.0 - self.scores[(b, a)]


def round_robin(
    config: TrainConfig,
    checkpoints: Sequence[str] = ("base",),
    fixed: Sequence[str] = (),
    games: int = 100,
    batch_size: int = 64,
    seed: int = 0,
    resamples: int = 1000,
) -> RoundRobinResult:
    """Play every pair of ``checkpoints`` and ``fixed`` players against each other and rate them.

    Args:
        config: a config with a ``game`` section of a two-seat game, and the model and generation settings.
        checkpoints: ``base`` or ``RUN_DIR/checkpoints/LEARNER`` directories (each loaded once).
        fixed: fixed players (``random``, ``minimax``, ``mcts``); not ``self``.
        games: games per pair and seat assignment (each pair plays ``2 × games``).
        batch_size: games played at once.
        seed: deals the games (the same for every pair) and seeds the players, the sampling and the bootstrap.
        resamples: bootstrap resamples for the rating intervals.

    Raises:
        ValueError: no game section, a game without exactly two seats, fewer than two participants, a repeated one,
            ``self`` or an unknown fixed player, or a count below 1.
    """
    game = config.game
    if game is None:
        raise ValueError("round_robin needs a config with a game section")
    config.check_game()  # its settings against the game, before anything loads
    seats = list(game.info.seats)
    if len(seats) != 2:
        raise ValueError(f"a round-robin rates players of a two-seat game; {game.name} has seats {seats}")
    if games < 1 or batch_size < 1:
        raise ValueError(f"games and batch_size must be >= 1, got {games} and {batch_size}")
    if SELF in fixed:
        raise ValueError("'self' is not a participant of a round-robin: every participant plays every other one")
    check_opponents(game, fixed)
    names = [str(c) for c in checkpoints] + list(fixed)
    if len(names) < 2 or len(set(names)) != len(names):
        raise ValueError(f"a round-robin needs at least two distinct participants, got {names}")
    sources = {}
    for checkpoint in checkpoints:
        model, label, tokenizer = load_deployed_model(config, checkpoint)
        model.eval()
        player = ModelPlayer.of_run(label, model, tokenizer, config)
        sources[str(checkpoint)] = player_source(game, label, player)
    for name in fixed:
        sources[name] = player_source(game, name)
    rows: list[GameEvalRow] = []
    results: dict[tuple[str, str], np.ndarray] = {}
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            scores = []
            for seat in seats:
                row, outcome = play_matches(
                    config, first, sources[first], second, sources[second], seat, games, batch_size, seed
                )
                rows.append(row)
                scores.append((outcome.astype(np.float64) + 1.0) / 2.0)
            results[(first, second)] = np.concatenate(scores)
    ratings = bradley_terry(names, results, resamples=resamples, seed=seed)
    mean_scores = {pair: float(np.mean(outcome)) for pair, outcome in results.items()}
    return RoundRobinResult(game.name, names, ratings, mean_scores, rows)
