"""Saving and restoring numpy random generators, as the stateful parts of a checkpoint do."""

from __future__ import annotations

from typing import Any

import numpy as np

from marllm.utils.errors import CheckpointError


def restore_generator(generator: np.random.Generator, state: dict[str, Any], what: str) -> None:
    """Set a numpy Generator to a saved ``bit_generator.state``."""
    try:
        generator.bit_generator.state = state
    except (TypeError, ValueError, KeyError) as error:
        raise CheckpointError(f"the {what}'s random generator state does not fit: {error}") from error
