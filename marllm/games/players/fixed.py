"""Players that do not learn: the Learner protocol with a no-op update, choosing among the legal moves the batched
game env puts in every observation (``legal_moves``, ``legal_actions``, ``history``).

They answer with a legal move's exact name, which every parser maps back to that move. ``update()`` learns nothing;
it reports the mean payoff the player was credited with since the last update (``task_reward``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from marllm.games.env.keys import HISTORY, LEGAL_ACTIONS, LEGAL_MOVES
from marllm.utils.generators import restore_generator

if TYPE_CHECKING:
    from marllm.games.opponents import SeatArguments


class FixedPlayer:
    """Base of the players that do not learn; subclasses implement :meth:`choose` (or :meth:`answer`).

    Args:
        name: the player's id (metric prefix, messages).
    """

    model: Any = None
    tokenizer: Any = None
    needs: ClassVar[tuple[str, ...]] = ()
    """What it needs of the game when a seat names its class by reference (names of
    :data:`marllm.games.opponents.NEEDS`, e.g. ``("tic_tac_toe",)``), checked with the config."""

    def __init__(self, name: str):
        self.name = name
        self._unrewarded = 0
        self._task_rewards: list[np.ndarray] = []

    @classmethod
    def from_seat(cls, seat: SeatArguments) -> FixedPlayer:
        """The player of a seat that names this class (``game.seats: [llm, my_opponent.py:MyPlayer]``, or a catalog
        entry, :mod:`marllm.games.opponents`): ``cls(seat.name, seed=seat.seed)``, or ``cls(seat.name)`` where the
        constructor takes no ``seed``. A subclass whose constructor takes other arguments overrides it."""
        if "seed" in inspect.signature(cls).parameters:
            return cls(seat.name, seed=seat.seed)  # type: ignore[call-arg]
        return cls(seat.name)

    def act(self, observation: Mapping[str, Sequence[Any]], role: str | None = None) -> tuple[str, ...]:
        """One answer per row of the observation; remembered as a move awaiting its reward."""
        answers = self.answer(observation)
        self._unrewarded += 1
        return answers

    def answer(self, observation: Mapping[str, Sequence[Any]]) -> tuple[str, ...]:
        """One answer per row: :meth:`choose` on each row's legal moves and history."""
        if LEGAL_MOVES not in observation:
            raise KeyError(
                f"player {self.name!r} chooses among legal moves: it needs an observation with {LEGAL_MOVES!r} (a "
                f"BatchedGameEnv's), got keys {sorted(observation)}"
            )
        if not all(observation[LEGAL_MOVES]):
            raise ValueError(
                f"player {self.name!r} chooses among legal moves, and the game asks it for free text (a turn whose "
                "view lists no legal move, GameView.free_text): seat a learner there, or a player that writes (to "
                "evaluate a model, marllm eval --opponent self plays it in every seat)"
            )
        rows = zip(observation[LEGAL_MOVES], observation[LEGAL_ACTIONS], observation[HISTORY], strict=True)
        return tuple(self.choose(names, actions, history) for names, actions, history in rows)

    def choose(self, names: Sequence[str], actions: Sequence[int], history: Sequence[int]) -> str:
        """The name of the move to play in one game, given its legal moves (names and action ids) and history."""
        raise NotImplementedError

    def finish(self, rewards: Sequence[float], task_rewards: Sequence[float] | None = None) -> None:
        """Take the rewards of the oldest unrewarded move (kept for the ``task_reward`` metric only)."""
        if not self._unrewarded:
            raise RuntimeError(f"player {self.name!r} got a reward but has no move waiting for one")
        self._unrewarded -= 1
        self._task_rewards.append(np.asarray(rewards if task_rewards is None else task_rewards, dtype=np.float64))

    def update(self) -> dict[str, float]:
        """Learn nothing; the mean credited payoff per move since the last update (none: an empty dict)."""
        if self._unrewarded:
            raise RuntimeError(f"player {self.name!r}: {self._unrewarded} move(s) never got their reward (finish())")
        rewards = np.concatenate(self._task_rewards) if self._task_rewards else np.empty(0)
        self._task_rewards = []
        return {"task_reward": float(rewards.mean())} if rewards.size else {}

    def activate(self) -> None:
        """Nothing to activate: the player has no weights."""

    def reference_model(self) -> contextlib.AbstractContextManager[Any]:
        """No model: yields None."""
        return contextlib.nullcontext(None)

    def state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """No tensors; its name and, for a player that draws its moves at random, its generator's state (so that a
        resumed run draws the same moves)."""
        meta: dict[str, Any] = {"name": self.name}
        rng = getattr(self, "_rng", None)
        if isinstance(rng, np.random.Generator):
            meta["rng"] = rng.bit_generator.state
        return {}, meta

    def load_state_dict(self, tensors: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
        """Restore its generator's state, if it has one (nothing else changes as it plays)."""
        rng = getattr(self, "_rng", None)
        if isinstance(rng, np.random.Generator) and "rng" in meta:
            restore_generator(rng, meta["rng"], f"player {self.name!r}")

    def save(self, directory: str | Path) -> None:
        """Write ``player.json`` (the player's name and kind): it has no policy to export."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        (path / "player.json").write_text(json.dumps({"name": self.name, "kind": type(self).__name__}) + "\n")


class RandomMover(FixedPlayer):
    """Plays a random legal move, uniformly or by fixed weights per move name (a biased opponent).

    Args:
        name: the player's id.
        seed: seeds its choices.
        weights: move name (any case) -> weight; legal moves it does not name get ``default_weight``. Where every
            legal move has weight 0, it plays uniformly.
        default_weight: the weight of moves ``weights`` does not name.
    """

    def __init__(
        self,
        name: str = "random",
        seed: int = 0,
        weights: Mapping[str, float] | None = None,
        default_weight: float = 1.0,
    ):
        super().__init__(name)
        self.weights = {k.strip().lower(): float(v) for k, v in (weights or {}).items()}
        if any(not np.isfinite(v) or v < 0 for v in self.weights.values()) or default_weight < 0:
            raise ValueError(f"move weights must be finite and >= 0, got {dict(weights or {})}, {default_weight}")
        self.default_weight = float(default_weight)
        self._rng = np.random.default_rng(seed)

    def choose(self, names: Sequence[str], actions: Sequence[int], history: Sequence[int]) -> str:
        weights = np.array([self.weights.get(n.strip().lower(), self.default_weight) for n in names])
        p = weights / weights.sum() if weights.sum() > 0 else None
        return names[int(self._rng.choice(len(names), p=p))]


_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


@functools.cache
def _negamax(board: tuple[int, ...]) -> int:
    """The value (+1 win, 0 draw, -1 loss) of a tic-tac-toe position for the player to move (marks 1 and 2)."""
    for a, b, c in _LINES:
        if board[a] and board[a] == board[b] == board[c]:
            return -1  # the previous mover completed a line
    empty = [i for i, mark in enumerate(board) if not mark]
    if not empty:
        return 0
    mark = 1 if len(empty) % 2 else 2
    return max(-_negamax(board[:i] + (mark,) + board[i + 1 :]) for i in empty)


class TicTacToeMinimax(FixedPlayer):
    """Perfect tic-tac-toe by minimax, from the game's history of action ids.

    Works with PettingZoo's ``tictactoe_v3`` (squares numbered down the columns) and OpenSpiel's ``tic_tac_toe``
    (across the rows) alike: the set of winning lines is the same under transposition.

    Args:
        name: the player's id.
        seed: None plays the lowest-numbered of the best moves; an int breaks ties at random.
    """

    def __init__(self, name: str = "minimax", seed: int | None = None):
        super().__init__(name)
        self._rng = None if seed is None else np.random.default_rng(seed)

    def choose(self, names: Sequence[str], actions: Sequence[int], history: Sequence[int]) -> str:
        board = [0] * 9
        for k, action in enumerate(history):
            board[action] = 1 + k % 2
        mark = 1 + len(history) % 2
        values = [-_negamax(tuple(board[:a] + [mark] + board[a + 1 :])) for a in actions]
        best = [k for k, v in enumerate(values) if v == max(values)]
        pick = best[0] if self._rng is None else int(self._rng.choice(best))
        return names[pick]
