"""Checks of numeric and choice fields of the config dataclasses; errors name the field as ``section.name``."""

from __future__ import annotations

import math


def positive(section: str, obj: object, *names: str) -> None:
    """Each field of ``obj`` named must be a finite number > 0."""
    for name in names:
        value = getattr(obj, name)
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{section}.{name} must be a finite number > 0, got {value}")


def non_negative(section: str, obj: object, *names: str) -> None:
    """Each field of ``obj`` named must be a finite number >= 0."""
    for name in names:
        value = getattr(obj, name)
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"{section}.{name} must be a finite number >= 0, got {value}")


def in_unit_interval(section: str, obj: object, *names: str) -> None:
    """Each field of ``obj`` named must be in [0, 1]."""
    for name in names:
        value = getattr(obj, name)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{section}.{name} must be in [0, 1], got {value}")


def choice(section: str, obj: object, name: str, choices: tuple[str, ...]) -> None:
    """The field ``name`` of ``obj`` must be one of ``choices``."""
    value = getattr(obj, name)
    if value not in choices:
        raise ValueError(f"{section}.{name} must be one of {list(choices)}, got {value!r}")
