"""Gymnasium space for the rows of one move: a variable number (at most the batch size) of per-game entries."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Space

_SAMPLE_ALPHABET = np.array(list("abcdefghijklmnopqrstuvwxyz0123456789   "))


class Rows(Space[tuple[Any, ...]]):
    """Up to ``max_rows`` entries of type ``item`` (one per game in which a seat moves now).

    The observation and action of a seat of a batched game: which games a seat moves in changes from move to move,
    so the number of rows does too. Text rows (``item=str``) are bounded by ``max_length`` characters each.
    ``sample(mask)`` returns one entry per nonzero entry of ``mask`` (the info's ``action_mask``), ``sample()`` one
    per possible row.
    """

    def __init__(self, max_rows: int, item: type | tuple[type, ...] = str, max_length: int = 1_000_000, seed=None):
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"Rows max_rows must be an int >= 1, got {max_rows!r}")
        self.max_rows = max_rows
        self.item = item
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> tuple[Any, ...]:
        """Random rows: lower-case strings of 1 to 12 characters for text, empty entries otherwise."""
        count = self.max_rows if mask is None else int(np.count_nonzero(mask))
        if self.item is not str:
            return tuple(() for _ in range(count))
        lengths = self.np_random.integers(1, min(12, self.max_length) + 1, size=count)
        return tuple("".join(self.np_random.choice(_SAMPLE_ALPHABET, size=n)) for n in lengths)

    def contains(self, x: Any) -> bool:
        if not isinstance(x, Sequence) or isinstance(x, str) or len(x) > self.max_rows:
            return False
        if not all(isinstance(entry, self.item) for entry in x):
            return False
        return self.item is not str or all(len(entry) <= self.max_length for entry in x)

    def __repr__(self) -> str:
        kind = self.item.__name__ if isinstance(self.item, type) else "|".join(t.__name__ for t in self.item)
        return f"Rows({self.max_rows}, {kind})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Rows) and (other.max_rows, other.item, other.max_length) == (
            self.max_rows,
            self.item,
            self.max_length,
        )
