"""Building a learner class or builder named by reference, checked against its declared signature before the call
(:func:`check_buildable`): one that cannot take the catalog's arguments is refused by name, before anything runs, and
an error raised inside one that can stays its own. Kept apart from the catalog, which names the learner modules that
use it."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["check_buildable", "class_reference", "construct"]


def check_buildable(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], owner: str, reference: str) -> None:
    """Refuse, before the call, a learner class or builder whose declared signature does not take the catalog's
    arguments.

    Raises:
        ValueError: naming the reference, Python's reason and the signatures the catalog calls.
    """
    reason = _unbound_reason(target, args, kwargs)
    if reason is None:
        return
    raise ValueError(
        f"{owner}: {reference} cannot be built with the catalog's arguments ({reason}); a learner class takes "
        "PolicyGradientLearner's arguments (name, *, model, tokenizer, reference, config, generation, seed, adapter, "
        "kl_controller, placement, actions, normalization) or overrides from_options to take its own, and a "
        "builder function takes (learner_id, algorithm, options, **learner_kwargs)"
    )


def _unbound_reason(target: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
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


def construct(cls: type, learner_id: str, **arguments: Any) -> Any:
    """``cls(learner_id, **arguments)``, the constructor a ``from_options`` calls, checked first (see
    :func:`check_buildable`)."""
    check_buildable(cls, (learner_id,), arguments, f"learner {learner_id!r}", class_reference(cls))
    return cls(learner_id, **arguments)


def class_reference(cls: type) -> str:
    """``cls`` as a reference a config could give: ``file.py:Class`` for a class loaded from a file by reference,
    ``module:Class`` otherwise."""
    module = inspect.getmodule(cls)
    name = getattr(module, "__name__", cls.__module__)
    path = getattr(module, "__file__", None)
    where = path if name.startswith("marllm_user_") and path else name
    return f"{where}:{cls.__qualname__}"
