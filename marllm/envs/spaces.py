"""Gymnasium space for a batch of texts: the observation and action of a text agent."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Space

_SAMPLE_ALPHABET = np.array(list("abcdefghijklmnopqrstuvwxyz     .,!?"))


class TextBatch(Space[tuple[str, ...]]):
    """A batch of ``batch_size`` strings, each at most ``max_length`` characters.

    ``gymnasium.spaces.Text`` restricts the character set, which real prompts and responses (any Unicode text) do not
    respect; this space only bounds the batch size and the length of each string.
    """

    def __init__(self, batch_size: int, max_length: int = 100_000, seed: int | None = None):
        if batch_size < 1:
            raise ValueError(f"TextBatch batch_size must be >= 1, got {batch_size}")
        if max_length < 1:
            raise ValueError(f"TextBatch max_length must be >= 1, got {max_length}")
        self.batch_size = batch_size
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> tuple[str, ...]:
        """Random lower-case strings of 1 to 16 characters (for API tests and random agents)."""
        lengths = self.np_random.integers(1, min(16, self.max_length) + 1, size=self.batch_size)
        return tuple("".join(self.np_random.choice(_SAMPLE_ALPHABET, size=n)) for n in lengths)

    def contains(self, x: Any) -> bool:
        return (
            isinstance(x, Sequence)
            and not isinstance(x, str)
            and len(x) == self.batch_size
            and all(isinstance(s, str) and len(s) <= self.max_length for s in x)
        )

    def __repr__(self) -> str:
        return f"TextBatch({self.batch_size}, max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, TextBatch)
            and other.batch_size == self.batch_size
            and other.max_length == self.max_length
        )
