"""A call checked against the callee's declared signature before it is made: an extension named by reference (a
learner class, its builder function) whose signature cannot take the arguments its kind passes is refused by name,
before anything runs, and an error raised inside it stays its own."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["unbound_reason"]


def unbound_reason(target: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Why ``target(*args, **kwargs)`` would not bind to ``target``'s declared signature (Python's own words), or
    None where it binds. A callable without an introspectable signature (a builtin) counts as binding."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*args, **kwargs)
    except TypeError as error:
        return str(error)
    return None
