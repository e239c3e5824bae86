"""Bradley–Terry ratings of players from the results of their games, on the Elo scale, with bootstrap intervals.

The Bradley–Terry model gives player ``i`` a strength θ_i and makes ``i``'s expected score against ``j`` σ(θ_i − θ_j)
(σ the logistic function). A game scores 1 for a win, ½ for a draw and 0 for a loss (draws as half a win each, as
Elo's expected score counts them). The ratings maximise the likelihood of the observed scores, with ``prior_draws``
virtual draws between every pair of players that met: without them a player that won every game would have an
infinite rating, and with one draw per pair the estimate is finite and moves little once a pair has played tens of
games (BayesElo's prior draws do the same). Ratings are reported on the Elo scale — 400 / ln 10 per unit of θ, so
that 400 points are 10:1 odds — relative to an anchor player rated 0.

The 95% intervals come from a bootstrap over games: every pairing's games are resampled with replacement, the
ratings refitted, and the 2.5% and 97.5% quantiles of each rating kept. Each interval is the anchor-relative rating's,
so the anchor's own interval is [0, 0].
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

ELO_PER_UNIT = 400.0 / math.log(10.0)
"""Elo points per unit of the Bradley–Terry strength θ (natural log odds)."""


@dataclass(frozen=True)
class Rating:
    """One player's Elo rating (relative to the anchor), its bootstrap 95% interval, games played and mean score."""

    player: str
    elo: float
    low: float
    high: float
    games: int
    score: float

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "player": self.player,
            "elo": self.elo,
            "elo_low": self.low,
            "elo_high": self.high,
            "games": self.games,
            "score": self.score,
        }


def _pair_totals(
    players: Sequence[str], results: Mapping[tuple[str, str], np.ndarray], prior_draws: float
) -> tuple[np.ndarray, np.ndarray]:
    """(N, N) games played and score won by row against column, the prior draws included."""
    index = {player: i for i, player in enumerate(players)}
    games = np.zeros((len(players), len(players)))
    scores = np.zeros((len(players), len(players)))
    for (first, second), outcome in results.items():
        i, j = index[first], index[second]
        n, won = float(len(outcome)), float(np.sum(outcome))
        games[i, j] += n
        games[j, i] += n
        scores[i, j] += won
        scores[j, i] += n - won
    met = games > 0
    games[met] += prior_draws
    scores[met] += prior_draws / 2
    return games, scores


def _fit(games: np.ndarray, scores: np.ndarray, anchor: int, tolerance: float = 1e-10) -> np.ndarray:
    """The maximum-likelihood θ (N,) with θ[anchor] = 0, by Newton's method on the concave log-likelihood.

    Raises ``ValueError`` when it does not converge: without prior draws, a player (or a group of players) that won
    or lost every game against the others has no finite maximum-likelihood rating.
    """
    n = len(games)
    free = [i for i in range(n) if i != anchor]
    theta = np.zeros(n)
    for _ in range(100):
        expected = 1.0 / (1.0 + np.exp(theta[None, :] - theta[:, None]))  # σ(θ_i − θ_j)
        gradient = (scores - games * expected).sum(axis=1)
        weights = games * expected * (1.0 - expected)
        hessian = np.diag(weights.sum(axis=1)) - weights  # the negative Hessian: a graph Laplacian
        step = np.linalg.solve(hessian[np.ix_(free, free)], gradient[free])
        theta[free] += step
        if np.max(np.abs(step)) < tolerance:
            return theta
    raise ValueError(
        "the Bradley-Terry ratings diverge: a player won or lost every game it played (in the data or a bootstrap "
        "resample of it); give prior_draws > 0"
    )


def _connected(games: np.ndarray) -> bool:
    reached, frontier = {0}, [0]
    while frontier:
        i = frontier.pop()
        for j in np.flatnonzero(games[i] > 0):
            if int(j) not in reached:
                reached.add(int(j))
                frontier.append(int(j))
    return len(reached) == len(games)


def bradley_terry(
    players: Sequence[str],
    results: Mapping[tuple[str, str], Sequence[float] | np.ndarray],
    anchor: str | None = None,
    prior_draws: float = 1.0,
    resamples: int = 1000,
    seed: int = 0,
) -> list[Rating]:
    """Elo-scale Bradley–Terry ratings of ``players`` from their games' scores, with bootstrap 95% intervals.

    Args:
        players: every player, in the order of the result (at least two).
        results: for a pair ``(a, b)``, the score of ``a`` in each game they played (1 win, 0.5 draw, 0 loss);
            each pair once, in either order.
        anchor: the player rated 0 (default: the first).
        prior_draws: virtual draws added between every pair that played (keeps an unbeaten player's rating finite).
        resamples: bootstrap resamples of each pairing's games (0: no interval, the bounds equal the rating).
        seed: seeds the bootstrap.

    Raises:
        ValueError: fewer than two players, an unknown or repeated player, a score outside [0, 1], a pair without
            games, or players not all connected by games (their ratings would not be comparable).
    """
    players = list(players)
    if len(players) < 2 or len(set(players)) != len(players):
        raise ValueError(f"bradley_terry needs at least two distinct players, got {players}")
    anchor = players[0] if anchor is None else anchor
    if anchor not in players:
        raise ValueError(f"the anchor {anchor!r} is not one of the players {players}")
    if prior_draws < 0:
        raise ValueError(f"prior_draws must be >= 0, got {prior_draws}")
    outcomes: dict[tuple[str, str], np.ndarray] = {}
    for (first, second), scores in results.items():
        if first not in players or second not in players or first == second:
            raise ValueError(f"a result names the pair ({first!r}, {second!r}); the players are {players}")
        if (second, first) in outcomes:
            raise ValueError(f"the pair ({first!r}, {second!r}) is given twice (once in each order)")
        outcome = np.asarray(scores, dtype=np.float64).reshape(-1)
        if len(outcome) == 0:
            raise ValueError(f"the pair ({first!r}, {second!r}) has no games")
        if not np.all((outcome >= 0) & (outcome <= 1)):  # NaN fails both comparisons
            raise ValueError(f"scores must be in [0, 1] (1 win, 0.5 draw, 0 loss); ({first!r}, {second!r}) has others")
        outcomes[(first, second)] = outcome
    games, scores = _pair_totals(players, outcomes, prior_draws)
    if not _connected(games):
        raise ValueError(f"every player must be linked to the others by games played; the results are {list(outcomes)}")
    position = players.index(anchor)
    theta = _fit(games, scores, position)
    draws = np.empty((resamples, len(players)))
    rng = np.random.default_rng(seed)
    for r in range(resamples):
        resampled = {pair: rng.choice(outcome, size=len(outcome)) for pair, outcome in outcomes.items()}
        draws[r] = _fit(*_pair_totals(players, resampled, prior_draws), position)
    low, high = (np.quantile(draws, (0.025, 0.975), axis=0) if resamples else (theta, theta))
    played, won = _pair_totals(players, outcomes, 0.0)
    return [
        Rating(
            player,
            float(ELO_PER_UNIT * theta[i]),
            float(ELO_PER_UNIT * low[i]),
            float(ELO_PER_UNIT * high[i]),
            int(played[i].sum()),
            float(won[i].sum() / played[i].sum()),
        )
        for i, player in enumerate(players)
    ]
