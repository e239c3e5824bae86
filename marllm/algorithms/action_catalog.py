"""The action modes a config can name (``game.actions.mode``), in one list, without importing torch.

Each name maps to its collector class (:mod:`marllm.algorithms.actions`) as a reference (``module:Class``), imported
only when a learner or a player is built, and to its facts (:mod:`marllm.algorithms.action_modes`): a torch-free class
whose class attributes say what the config checks, the run's measures and a learner's checks read of the mode (its
options, what its KL is, whether its answers end with EOS, whether it has exact move probabilities). Each built-in
collector class inherits its mode's facts, so ``ScoreCollector.options`` is the ``score`` entry's.

A config can also name a collector class by reference, as it names a learner: ``game.actions.mode:
my_mode.py:MyCollector`` (a file relative to the config's folder) or ``package.module:MyCollector``. Its facts are its
own class attributes (a subclass of :class:`~marllm.algorithms.actions.base.Collector` inherits the defaults of
:class:`~marllm.algorithms.action_modes.ActionMode`), read by loading it when the config is checked. Adding an action
mode is then one file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marllm.algorithms.action_modes import ActionMode, ConstrainedMode, GenerateMode, ScoreMode, ThinkMode
from marllm.utils.imports import load_reference


@dataclass(frozen=True)
class Entry:
    """One entry of :data:`CATALOG`.

    Attributes:
        collector: ``module:Class`` of the mode's collector class.
        facts: its facts, torch-free (the collector class inherits them).
    """

    collector: str
    facts: type[ActionMode]


CATALOG: dict[str, Entry] = {
    "generate": Entry("marllm.algorithms.actions.tokens:TokenCollector", GenerateMode),
    "constrained": Entry("marllm.algorithms.actions.constrained:ConstrainedCollector", ConstrainedMode),
    "score": Entry("marllm.algorithms.actions.score:ScoreCollector", ScoreMode),
    "think": Entry("marllm.algorithms.actions.think:ThinkCollector", ThinkMode),
}
"""Action mode name -> :class:`Entry`: the names ``game.actions.mode`` takes (besides references)."""

ACTION_MODES = tuple(CATALOG)
"""The built-in action mode names."""

DEFAULT_MODE = "generate"
"""The mode of a text task, and of a game whose config names none."""

REFERENCE_FORMS = "package.module:Class, or file.py:Class relative to the config's folder"


def is_reference(mode: str) -> bool:
    """Whether ``mode`` names a collector class by reference (``module:Class``) rather than by catalog name."""
    return ":" in mode


def collector_class(mode: str, owner: str) -> type[Any]:
    """The collector class of ``mode`` (a catalog name or a reference), imported (``owner`` names it in errors).

    Raises:
        ValueError: an unknown name, a reference that does not load, or one that names no collector class.
    """
    if not is_reference(mode):
        if mode not in CATALOG:
            raise ValueError(
                f"{owner}: actions must be one of {list(CATALOG)}, got {mode!r}, or a collector class by reference "
                f"({REFERENCE_FORMS})"
            )
        return load_reference(CATALOG[mode].collector)
    try:
        target = load_reference(mode)
    except ValueError as error:
        raise ValueError(f"{owner}: actions {mode!r}: {error}") from None
    if not (isinstance(target, type) and issubclass(target, ActionMode) and hasattr(target, "actions")):
        raise ValueError(
            f"{owner}: actions {mode!r} is {target!r}, not a collector class (a subclass of "
            "marllm.algorithms.actions.Collector with an 'actions' name)"
        )
    return target


def action_mode(mode: str, owner: str = "game.actions.mode") -> type[ActionMode]:
    """The facts of ``mode``: a built-in's torch-free :class:`ActionMode`, or a referenced collector class itself
    (loaded).

    Raises:
        ValueError: as :func:`collector_class`.
    """
    entry = CATALOG.get(mode)
    return entry.facts if entry is not None else collector_class(mode, owner)


def modes_taking(option: str) -> list[str]:
    """The built-in modes whose :attr:`~ActionMode.options` include ``option``."""
    return [name for name, entry in CATALOG.items() if option in entry.facts.options]
