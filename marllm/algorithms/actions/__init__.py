"""How a learner acts: one collector per action mode, each playing a batch (``collect``) and re-scoring a
mini-batch of it under the updated policy (``rescore``) the same way, so that any learner trains with any mode.

=============== ========================================================== ==========================================
``actions``     what an answer is                                          collector
=============== ========================================================== ==========================================
``generate``    free text, every token an action                           :class:`~.tokens.TokenCollector`
``constrained`` a legal move's name, token by token restricted to them     :class:`~.constrained.ConstrainedCollector`
``think``       free text, then a constrained move                         :class:`~.think.ThinkCollector`
``score``       one legal move drawn from the softmax of their likelihoods :class:`~.score.ScoreCollector`
=============== ========================================================== ==========================================

The names, and each mode's facts (its options, what its KL is, whether its answers end with EOS, whether it has exact
move probabilities), are in the torch-free registry :mod:`marllm.algorithms.action_modes`, which a config reads; a
collector class of one's own is named by reference there. A learner owns one collector (:func:`new_collector`) and
its loss of a mini-batch is its objective of what :meth:`~.base.Collector.rescore` returns. A model outside training
plays through one too (:meth:`~.base.Collector.play`; :class:`~marllm.games.model_player.ModelPlayer`), so each mode
samples in one place.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from marllm.algorithms.action_registry import ACTION_MODE_REGISTRY, collector_class
from marllm.algorithms.actions.base import Collector, Rescored
from marllm.algorithms.actions.constrained import ConstrainedCollector
from marllm.algorithms.actions.score import ScoreCollector
from marllm.algorithms.actions.think import ThinkCollector
from marllm.algorithms.actions.tokens import TokenCollector

__all__ = [
    "COLLECTORS",
    "Collector",
    "ConstrainedCollector",
    "Rescored",
    "ScoreCollector",
    "ThinkCollector",
    "TokenCollector",
    "new_collector",
]

COLLECTORS: dict[str, type[Collector]] = {name: collector_class(name, "actions") for name in ACTION_MODE_REGISTRY}
"""Built-in action mode name (``game.actions``) -> its collector class."""


def new_collector(actions: str, *, owner: str, options: dict[str, Any] | None = None, **parts: Any) -> Collector:
    """The collector of ``actions`` (a catalog name or a collector class by reference,
    :mod:`~marllm.algorithms.action_modes`) on a learner's ``parts`` (:class:`~.base.Collector`'s attributes), with
    the mode's own ``options`` (``normalization`` for ``score``).

    Raises:
        ValueError: an unknown mode, or an option the mode does not take (naming the modes that do).
    """
    cls = collector_class(actions, owner)
    shared = {f.name for f in fields(Collector)}
    own = {f.name for f in fields(cls)} - shared
    for option in options or {}:
        if option not in own:
            takers = [name for name, mode in COLLECTORS.items() if option in {f.name for f in fields(mode)} - shared]
            raise ValueError(f"{owner}: {option} applies to actions {takers} only, not {actions!r}")
    return cls(**parts, **(options or {}))
