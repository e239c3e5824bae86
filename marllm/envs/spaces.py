"""Gymnasium spaces for batches of texts (or other entries): the observations and actions of text agents."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Space


class Rows(Space[tuple[Any, ...]]):
    """Up to ``max_rows`` entries of type ``item`` (exactly ``max_rows`` when ``exact``).

    The observation and action of a seat of a batched game: which games a seat moves in changes from move to move,
    so the number of rows does too. Text rows (``item=str``) are bounded by ``max_length`` characters each.
    ``sample(mask)`` returns one entry per nonzero entry of ``mask`` (the info's ``action_mask``), ``sample()`` (or
    any sample of an exact space) one per possible row.
    """

    # Random-text samples (for API tests and random agents): strings of 1 to ``_longest_sample`` of these characters.
    _sample_alphabet = np.array(list("abcdefghijklmnopqrstuvwxyz0123456789   "))
    _longest_sample = 12

    def __init__(
        self,
        max_rows: int,
        item: type | tuple[type, ...] = str,
        max_length: int = 1_000_000,
        exact: bool = False,
        seed: int | None = None,
    ):
        name = type(self).__name__
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"{name} size must be an int >= 1, got {max_rows!r}")
        if max_length < 1:
            raise ValueError(f"{name} max_length must be >= 1, got {max_length}")
        self.max_rows = max_rows
        self.item = item
        self.max_length = max_length
        self.exact = exact
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> tuple[Any, ...]:
        """Random rows: lower-case strings for text, empty entries otherwise."""
        count = self.max_rows if mask is None or self.exact else int(np.count_nonzero(mask))
        if self.item is not str:
            return tuple(() for _ in range(count))
        lengths = self.np_random.integers(1, min(self._longest_sample, self.max_length) + 1, size=count)
        return tuple("".join(self.np_random.choice(self._sample_alphabet, size=n)) for n in lengths)

    def contains(self, x: Any) -> bool:
        if not isinstance(x, Sequence) or isinstance(x, str) or len(x) > self.max_rows:
            return False
        if self.exact and len(x) != self.max_rows:
            return False
        if not all(isinstance(entry, self.item) for entry in x):
            return False
        return self.item is not str or all(len(entry) <= self.max_length for entry in x)

    def __repr__(self) -> str:
        kind = self.item.__name__ if isinstance(self.item, type) else "|".join(t.__name__ for t in self.item)
        return f"{type(self).__name__}({self.max_rows}, {kind}, max_length={self.max_length}, exact={self.exact})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Rows) and (other.max_rows, other.item, other.max_length, other.exact) == (
            self.max_rows,
            self.item,
            self.max_length,
            self.exact,
        )


class TextBatch(Rows):
    """A batch of ``batch_size`` strings, each at most ``max_length`` characters.

    ``gymnasium.spaces.Text`` restricts the character set, which real prompts and responses (any Unicode text) do not
    respect; this space only bounds the batch size and the length of each string.
    """

    _sample_alphabet = np.array(list("abcdefghijklmnopqrstuvwxyz     .,!?"))
    _longest_sample = 16

    def __init__(self, batch_size: int, max_length: int = 100_000, seed: int | None = None):
        super().__init__(batch_size, str, max_length, exact=True, seed=seed)

    @property
    def batch_size(self) -> int:
        """The number of strings in each batch."""
        return self.max_rows
