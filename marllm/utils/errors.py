"""The error types that more than one layer raises, kept here so that every layer can import them."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is missing, unknown, of the wrong type or inconsistent."""


class CheckpointError(ValueError):
    """A checkpoint is missing, damaged, or does not fit the objects it is loaded into; the message says which."""
