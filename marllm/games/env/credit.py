"""Credit and metrics of a batch of finished games: pure functions over per-game payoffs and per-turn rows.

Every move is one sample of its seat's learner; its reward is the game's final payoff for the mover, discounted by
the mover's own moves still to come in that game, minus a penalty if the answer was illegal.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def outcomes(payoffs: np.ndarray, forfeited_by: np.ndarray) -> np.ndarray:
    """(B, N) int8: +1 where a seat's payoff beats every other seat's, -1 where another seat's beats it, else 0.

    ``forfeited_by`` (B,) is the index of the seat that forfeited each game (-1: none): it loses and every other seat
    wins, whatever the payoffs. With one seat, the payoff's sign is the outcome.
    """
    payoffs = np.asarray(payoffs, dtype=np.float64)  # (B, N)
    games, seats = payoffs.shape
    if seats == 1:
        result = np.sign(payoffs).astype(np.int8)
    else:
        result = np.zeros((games, seats), dtype=np.int8)
        for i in range(seats):
            best_other = np.delete(payoffs, i, axis=1).max(axis=1)  # (B,)
            result[:, i] = np.sign(payoffs[:, i] - best_other).astype(np.int8)
    for game, seat in enumerate(np.asarray(forfeited_by)):
        if seat >= 0:
            result[game] = 1
            result[game, seat] = -1
    return result


def turn_discounts(turn_games: Sequence[np.ndarray], discount: float = 1.0) -> list[np.ndarray]:
    """One seat's discount for each of its moves, turn by turn: γ^k, k the seat's moves after it in that game.

    Args:
        turn_games: per turn of the seat, the indices of the games it moved in.
        discount: γ.
    """
    size = 1 + max((int(np.max(games)) for games in turn_games if len(games)), default=-1)
    later = np.zeros(size, dtype=np.int64)  # per game, moves of the seat after the one being credited
    discounts: list[np.ndarray] = [np.empty(0)] * len(turn_games)
    for t in range(len(turn_games) - 1, -1, -1):
        games = np.asarray(turn_games[t], dtype=np.int64)
        discounts[t] = discount ** later[games].astype(np.float64)
        later[games] += 1
    return discounts


def turn_rewards(
    turn_games: Sequence[np.ndarray],
    turn_illegal: Sequence[np.ndarray],
    payoffs: np.ndarray,
    discount: float = 1.0,
    illegal_penalty: float = 0.0,
) -> list[np.ndarray]:
    """One seat's reward for each of its moves, turn by turn, each row as long as the turn's games.

    Args:
        turn_games: per turn of the seat, the indices of the games it moved in.
        turn_illegal: per turn, whether each of those answers was illegal.
        payoffs: (B,) the seat's final payoff in each game.
        discount: γ; a move followed by k more moves of the same seat in its game gets γ^k · payoff.
        illegal_penalty: subtracted from the reward of each illegal answer.
    """
    payoffs = np.asarray(payoffs, dtype=np.float64)
    return [
        payoffs[np.asarray(games, dtype=np.int64)] * discounts - illegal_penalty * np.asarray(illegal, dtype=np.float64)
        for games, illegal, discounts in zip(
            turn_games, turn_illegal, turn_discounts(turn_games, discount), strict=True
        )
    ]


def seat_metrics(
    payoffs: np.ndarray,
    outcome: np.ndarray,
    answers: np.ndarray,
    illegal: np.ndarray,
    game_lengths: np.ndarray,
    forfeits: np.ndarray,
    capped: np.ndarray | None = None,
) -> dict[str, float]:
    """One seat's episode metrics from (B,) per-game arrays: its payoff and outcome, its answers and illegal answers,
    the game's length in moves (all seats), whether the seat forfeited and whether the game was ended as a draw at
    the move cap (``capped_rate``, 0 when ``capped`` is None)."""
    answered = int(np.sum(answers))
    return {
        "payoff": float(np.mean(payoffs)),
        "win_rate": float(np.mean(outcome == 1)),
        "draw_rate": float(np.mean(outcome == 0)),
        "loss_rate": float(np.mean(outcome == -1)),
        # A seat that never moved has no illegal-move rate (NaN), not a perfect one.
        "illegal_move_rate": float(np.sum(illegal) / answered) if answered else float("nan"),
        "moves_per_game": float(np.mean(answers)),
        "game_length": float(np.mean(game_lengths)),
        "forfeit_rate": float(np.mean(forfeits)),
        "capped_rate": float(np.mean(capped)) if capped is not None else 0.0,
    }
