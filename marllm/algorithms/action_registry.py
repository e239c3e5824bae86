"""The action modes a config can name (``game.actions``): :data:`ACTION_MODE_REGISTRY`, torch-free.

Each built-in mode's facts are its :class:`~marllm.algorithms.action_modes.ActionMode` class, registered here with its
collector class as ``implementation`` (kept apart from the facts, which every collector class inherits, so that no
module names by string a module that imports it). A collector class of one's own is named by reference
(``my_mode.py:MyCollector``), its facts its own class attributes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from marllm.algorithms.action_modes import ActionMode, ConstrainedMode, GenerateMode, ScoreMode, ThinkMode
from marllm.utils.dataclass_tree import build
from marllm.utils.registry import Registry

DEFAULT_MODE = "generate"
"""The mode of a text task, and of a game whose config names none."""

ROUTED_SETTINGS = frozenset({"parser", "exploitability_samples", "normalization"})
"""The mode settings the run applies: the env's parser, the tabulation's samples, and ``normalization`` (passed to the
collector)."""

ACTION_MODE_REGISTRY: Registry[type[ActionMode]] = Registry("action mode", ActionMode, "my_mode.py:MyCollector")
"""Action mode name -> :class:`~marllm.algorithms.action_modes.ActionMode`: the names ``game.actions`` takes."""

ACTION_MODE_REGISTRY.register("generate")(GenerateMode)
GenerateMode.implementation = "marllm.algorithms.actions.tokens:TokenCollector"
ACTION_MODE_REGISTRY.register("constrained")(ConstrainedMode)
ConstrainedMode.implementation = "marllm.algorithms.actions.constrained:ConstrainedCollector"
ACTION_MODE_REGISTRY.register("think")(ThinkMode)
ThinkMode.implementation = "marllm.algorithms.actions.think:ThinkCollector"
ACTION_MODE_REGISTRY.register("score")(ScoreMode)
ScoreMode.implementation = "marllm.algorithms.actions.score:ScoreCollector"


ACTION_MODES = tuple(ACTION_MODE_REGISTRY)
"""The built-in action mode names."""


def action_mode(mode: str, owner: str = "game.actions") -> type[ActionMode]:
    """The facts of ``mode``: a built-in's torch-free :class:`ActionMode`, or a referenced collector class (loaded).

    Raises:
        ValueError: an unknown name, a reference that does not load, or one that names no collector class.
    """
    facts = ACTION_MODE_REGISTRY.entry(mode, owner)
    if ACTION_MODE_REGISTRY.is_reference(mode):
        target = ACTION_MODE_REGISTRY.implementation(mode, owner)
        fits = isinstance(target, type) and issubclass(target, ActionMode) and hasattr(target, "actions")
    else:
        fits = True
    if not fits:
        raise ValueError(
            f"{owner}: {mode!r} is not a collector class (a subclass of marllm.algorithms.actions.Collector with an "
            "'actions' name)"
        )
    # The run hands a collector the settings of the built-in modes (a parser, a tabulation's samples, score's
    # normalisation) and no others: a referenced mode's Settings of fields of its own would be read and not applied,
    # so they are refused here, where the mode is read, until the learners carry a mode's whole settings.
    own = set(getattr(facts.Settings, "__dataclass_fields__", {})) - ROUTED_SETTINGS
    if own:
        raise ValueError(
            f"{owner}: {mode!r} declares settings {sorted(own)}, which marllm does not hand a collector (it hands "
            f"{sorted(ROUTED_SETTINGS)}); give the collector a constructor default instead"
        )
    return facts


def collector_class(mode: str, owner: str) -> type[Any]:
    """The collector class of ``mode`` (a built-in name or a reference), imported (``owner`` names it in errors)."""
    action_mode(mode, owner)
    return ACTION_MODE_REGISTRY.implementation(mode, owner)


def mode_settings(mode: str, settings: Mapping[str, Any] | None = None, owner: str = "game.actions") -> Any:
    """The settings of ``mode`` (its ``Settings`` made from ``settings``), or None for a mode without settings.

    Raises:
        ValueError: settings given to a mode that has none.
    """
    cls = action_mode(mode, owner).Settings
    if cls is None:
        if settings:
            raise ValueError(f"{owner}: {mode} has no settings, got {dict(settings)}")
        return None
    return build(cls, dict(settings or {}), f"{owner}.{mode}")
