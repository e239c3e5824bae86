"""What a batched game env remembers of an episode: each game's moves and outcome, and each turn's rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from marllm.envs.games.views import Move


@dataclass
class GameRecord:
    """One game of the batch: the moves applied, each seat's answers and illegal answers, and how it ended."""

    seats: list[str]
    moves: list[Move] = field(default_factory=list)
    answers: dict[str, int] = field(default_factory=dict)
    illegal: dict[str, int] = field(default_factory=dict)
    returns: dict[str, float] = field(default_factory=dict)
    """The game's step rewards summed per seat (what the generic view pays)."""
    payoffs: dict[str, float] | None = None
    """Each seat's final payoff, once the game is over."""
    forfeited_by: str | None = None

    def __post_init__(self) -> None:
        for counts in (self.answers, self.illegal, self.returns):
            for seat in self.seats:
                counts.setdefault(seat, 0)

    @property
    def over(self) -> bool:
        """Whether the game has ended (its payoffs are known)."""
        return self.payoffs is not None

    @property
    def length(self) -> int:
        """Answers given in this game, by every seat (a forfeiting answer included)."""
        return sum(self.answers.values())


class Turn(NamedTuple):
    """One move of the batched env: the seat, the games it moved in, and which of its answers were illegal."""

    seat: str
    games: np.ndarray  # (rows,) int64
    illegal: np.ndarray  # (rows,) bool
