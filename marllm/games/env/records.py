"""What a batched game env remembers of an episode: each game's moves and outcome, and each turn's rows."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from pettingzoo import AECEnv

from marllm.games.env.views import GameView, Move


@dataclass
class GameRecord:
    """One game of the batch: the moves applied, each seat's answers and illegal answers, and how it ended."""

    seats: list[str]
    moves: list[Move] = field(default_factory=list)
    answers: dict[str, int] = field(default_factory=dict)
    illegal: dict[str, int] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)
    """Per seat, how many of ``moves`` had been applied when it last answered (0 before its first answer)."""
    returns: dict[str, float] = field(default_factory=dict)
    """The game's step rewards summed per seat (what the generic view pays)."""
    payoffs: dict[str, float] | None = None
    """Each seat's final payoff, once the game is over."""
    forfeited_by: str | None = None
    capped: bool = False
    """Whether the game was ended as a draw at the env's move cap (``max_moves``), not by its own rules."""

    def __post_init__(self) -> None:
        for counts in (self.answers, self.illegal, self.seen, self.returns):
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


def count_cooperation(
    view: GameView, games: Sequence[AECEnv], records: Sequence[GameRecord], turns: Sequence[Turn], seat: str
) -> tuple[int, int] | None:
    """(cooperative, legal) of ``seat`` over a batch (:meth:`~marllm.games.env.BatchedGameEnv.cooperation_counts`):
    how many of its legal answers chose the view's cooperative move; None where the view names none."""
    cooperative = legal = 0
    named = False
    illegal_flags: list[list[bool]] = [[] for _ in records]
    for turn in turns:
        if turn.seat == seat:
            for game, was_illegal in zip(turn.games, turn.illegal, strict=True):
                illegal_flags[int(game)].append(bool(was_illegal))
    for b, (record, flags) in enumerate(zip(records, illegal_flags, strict=True)):
        target = view.cooperative_move(games[b], seat)
        if target is None:
            continue
        named = True
        moves = [move for move in record.moves if move.seat == seat]
        chosen = [move.action for move, was_illegal in zip(moves, flags, strict=False) if not was_illegal]
        legal += len(chosen)
        cooperative += sum(action == target for action in chosen)
    return (cooperative, legal) if named else None


def view_metrics(view: GameView, games: Sequence[AECEnv], seat: str, taken: Collection[str]) -> dict[str, float]:
    """The seat's measures of the view's own: each of :meth:`~marllm.games.env.GameView.metrics` averaged over the
    games that report it, and those of the whole batch (:meth:`~marllm.games.env.GameView.batch_metrics`).

    Raises:
        ValueError: the view reports a key among ``taken`` (the env's own metrics).
    """
    values: dict[str, list[float]] = {}
    for game in games:
        for key, value in view.metrics(game, seat).items():
            values.setdefault(key, []).append(float(value))
    measures = {key: float(np.mean(each)) for key, each in values.items()}
    whole = {key: float(value) for key, value in view.batch_metrics(games, seat).items()}
    clash = sorted((set(measures) | set(whole)) & set(taken)) or sorted(set(measures) & set(whole))
    if clash:
        raise ValueError(f"the game view's metrics {clash} are the env's own or reported twice; name them otherwise")
    return {**measures, **whole}


def describe_record(view: GameView, game: AECEnv, record: GameRecord, title: str) -> str:
    """A game's moves as text, one per line, after ``title`` and the game's name; then a forfeit and the payoffs."""
    lines = [f"{title}: {view.name(game)}", *(f"{move.seat}: {move.name}" for move in record.moves)]
    if record.forfeited_by:
        lines.append(f"{record.forfeited_by} forfeited (illegal answer)")
    if record.over:
        lines.append(f"payoffs: {record.payoffs}")
    return "\n".join(lines)
