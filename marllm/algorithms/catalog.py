"""The algorithms a config can name (``agents.algorithm``), in one list, without importing torch.

Each name maps to the learner class that builds it, as a reference (``module:Class``) that is imported only when a
learner is built, so that the config checks read this list as the learners' builder does. A config can also name a
learner class by reference, as it names a task: ``agents.algorithm: my_learner.py:MyLearner`` (a file relative to
the config's folder) or ``package.module:MyLearner``. Adding an algorithm is then one file.

A referenced class is built by its ``from_options(learner_id, algorithm, options, **learner_kwargs)`` classmethod
(:meth:`PolicyGradientLearner.from_options <marllm.algorithms.policy_gradient.PolicyGradientLearner.from_options>`,
which every learner of the policy-gradient family inherits, and which passes ``actions`` and ``normalization`` on: a
subclass whose constructor takes other arguments overrides it); a function with that signature is called as it is. A
subclass of :class:`~marllm.algorithms.critic_free_learner.CriticFreeLearner` says which advantage it computes by its
``variant``.
``learner_kwargs`` are every learner's arguments (:class:`~marllm.algorithms.learner_arguments.LearnerArguments`),
``options`` an :class:`AlgorithmOptions`, and ``algorithm`` the name or reference the config gave.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marllm.algorithms.algorithm_options import AlgorithmOptions
from marllm.algorithms.construction import check_buildable
from marllm.algorithms.critic_free_config import COMPARES_GROUPS
from marllm.utils.imports import is_file_reference, load_reference, split_reference


@dataclass(frozen=True)
class Algorithm:
    """One entry of :data:`CATALOG`.

    Attributes:
        builder: ``module:Class`` of the learner class (or builder function) that builds it.
        summary: what it is, in a line.
        compares_groups: whether its advantage compares the answers to one query, so that it needs
            ``env.group_size`` >= 2 (and cannot train on a game's moves, which come in no such groups).
    """

    builder: str
    summary: str
    compares_groups: bool = False


_CRITIC_FREE = "marllm.algorithms.critic_free_learner:CriticFreeLearner"

CATALOG: dict[str, Algorithm] = {
    "ppo": Algorithm(
        "marllm.algorithms.ppo:PPOLearner", "PPO with a value head and a KL-penalised token reward (CORY's learner)"
    ),
    "grpo": Algorithm(
        _CRITIC_FREE, "GRPO: each answer against the other answers to its query", "grpo" in COMPARES_GROUPS
    ),
    "rloo": Algorithm(
        _CRITIC_FREE, "RLOO: each answer against the mean of the others to its query", "rloo" in COMPARES_GROUPS
    ),
    "reinforce_pp": Algorithm(_CRITIC_FREE, "REINFORCE++: KL-penalised returns normalised over the batch"),
}
"""Algorithm name -> :class:`Algorithm`: the names a config's ``agents.algorithm`` takes (besides references)."""

ALGORITHMS = tuple(CATALOG)
"""The built-in algorithm names."""

__all__ = ["ALGORITHMS", "CATALOG", "Algorithm", "AlgorithmOptions", "build_learner", "check_algorithm"]


def is_reference(algorithm: str) -> bool:
    """Whether ``algorithm`` names a learner class by reference (``module:Class``) rather than by catalog name."""
    return ":" in algorithm


def check_algorithm(algorithm: Any, owner: str) -> None:
    """Refuse an ``algorithm`` that is neither a catalog name nor a well-formed reference (naming both forms), and a
    file reference whose file does not exist.

    A reference's module is imported when the learner is built, not here (the config stays free of torch).
    """
    if isinstance(algorithm, str) and is_reference(algorithm):
        module, _ = split_reference(algorithm)
        if is_file_reference(algorithm) and not Path(module).expanduser().is_file():
            raise ValueError(f"{owner}: {algorithm!r} names the file {module}, which does not exist")
        return
    if algorithm not in CATALOG:
        raise ValueError(
            f"{owner}: unknown algorithm {algorithm!r}; one of {list(CATALOG)}, or a learner class by reference "
            "(package.module:Class, or file.py:Class relative to the config's folder)"
        )


def compares_groups(algorithm: str) -> bool:
    """Whether a catalog ``algorithm`` compares the answers to one query. False for a reference: the config cannot
    know without importing it, so a referenced learner that compares groups checks ``group_size`` itself when it is
    built (as :class:`~marllm.algorithms.critic_free_learner.CriticFreeLearner` does)."""
    entry = CATALOG.get(algorithm)
    return entry is not None and entry.compares_groups


def build_learner(algorithm: str, learner_id: str, options: AlgorithmOptions, **learner_kwargs: Any) -> Any:
    """The learner ``learner_id`` of ``algorithm`` (a catalog name or a reference), built by its class's
    ``from_options`` (see the module docstring).

    Raises:
        ValueError: an unknown name, a reference that does not load (its module's own error quoted), or one that
            names neither a class with ``from_options`` nor a function.
    """
    owner = f"learner {learner_id!r}"
    check_algorithm(algorithm, owner)
    reference = algorithm if is_reference(algorithm) else CATALOG[algorithm].builder
    target = load_reference(reference)
    builder = getattr(target, "from_options", None) if isinstance(target, type) else target
    if not callable(builder):
        raise ValueError(
            f"{owner}: {reference} is a {type(target).__name__} without from_options; name a learner class with a "
            "from_options(learner_id, algorithm, options, **learner_kwargs) classmethod (every "
            "PolicyGradientLearner subclass has one) or a function with that signature"
        )
    check_buildable(builder, (learner_id, algorithm, options), learner_kwargs, owner, reference)
    return builder(learner_id, algorithm, options, **learner_kwargs)
