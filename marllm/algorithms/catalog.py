"""The algorithms a config can name (``agents.algorithm``): :data:`ALGORITHM_REGISTRY`, torch-free.

Each built-in is an :class:`Algorithm` registered by name, whose ``implementation`` is its learner class, imported
only when a learner is built. A config can also name a learner class by reference, as it names a task:
``agents.algorithm: my_learner.py:MyLearner`` (a file relative to the config's folder) or ``package.module:MyLearner``
(:mod:`marllm.utils.registry`). Adding an algorithm is then one file.

A learner class is built by its ``from_options(learner_id, algorithm, options, **learner_kwargs)`` classmethod
(:meth:`PolicyGradientLearner.from_options <marllm.algorithms.policy_gradient.PolicyGradientLearner.from_options>`,
which every learner of the policy-gradient family inherits, and which passes ``actions`` and ``normalization`` on: a
subclass whose constructor takes other arguments overrides it); a function with that signature is called as it is,
both checked against their declared signature first. A subclass of
:class:`~marllm.algorithms.critic_free_learner.CriticFreeLearner` says which advantage it computes by its ``variant``.
``learner_kwargs`` are every learner's arguments (:class:`~marllm.algorithms.learner_arguments.LearnerArguments`),
``options`` an :class:`AlgorithmOptions`, and ``algorithm`` the name or reference the config gave.
"""

from __future__ import annotations

from typing import Any, ClassVar

from marllm.algorithms.algorithm_options import AlgorithmOptions
from marllm.algorithms.construction import check_buildable
from marllm.utils.registry import Extension, Registry


class Algorithm(Extension):
    """An algorithm's facts.

    Attributes:
        compares_groups: whether its advantage compares the answers to one query, so that it needs
            ``env.group_size`` >= 2 (and cannot train on a game's moves, which come in no such groups). The config
            does not import a referenced learner class: one that compares groups checks ``group_size`` itself when
            built.
    """

    compares_groups: ClassVar[bool] = False


ALGORITHM_REGISTRY: Registry[type[Algorithm]] = Registry("algorithm", Algorithm, "my_learner.py:MyLearner")
"""Algorithm name -> :class:`Algorithm`: the names ``agents.algorithm`` takes (besides references)."""

_CRITIC_FREE = "marllm.algorithms.critic_free_learner:CriticFreeLearner"


@ALGORITHM_REGISTRY.register("ppo")
class PPO(Algorithm):
    implementation = "marllm.algorithms.ppo:PPOLearner"
    summary = "PPO with a value head and a KL-penalised token reward (CORY's learner)"


@ALGORITHM_REGISTRY.register("grpo")
class GRPO(Algorithm):
    implementation = _CRITIC_FREE
    summary = "GRPO: each answer against the other answers to its query"
    compares_groups = True


@ALGORITHM_REGISTRY.register("rloo")
class RLOO(Algorithm):
    implementation = _CRITIC_FREE
    summary = "RLOO: each answer against the mean of the others to its query"
    compares_groups = True


@ALGORITHM_REGISTRY.register("reinforce_pp")
class ReinforcePP(Algorithm):
    implementation = _CRITIC_FREE
    summary = "REINFORCE++: KL-penalised returns normalised over the batch"


ALGORITHMS = tuple(ALGORITHM_REGISTRY)
"""The built-in algorithm names."""

__all__ = ["ALGORITHMS", "ALGORITHM_REGISTRY", "Algorithm", "AlgorithmOptions", "build_learner", "check_algorithm"]


def check_algorithm(algorithm: Any, owner: str) -> None:
    """Refuse an ``algorithm`` that is neither a built-in name nor a reference that could load, without importing
    it (the config stays free of torch)."""
    ALGORITHM_REGISTRY.check(algorithm, owner)


def compares_groups(algorithm: str) -> bool:
    """Whether a built-in ``algorithm`` compares the answers to one query. False for a reference: the config does
    not import it, so a referenced learner that compares groups checks ``group_size`` itself when it is built (as
    :class:`~marllm.algorithms.critic_free_learner.CriticFreeLearner` does)."""
    return algorithm in ALGORITHM_REGISTRY and ALGORITHM_REGISTRY.builtins()[algorithm].compares_groups


def build_learner(algorithm: str, learner_id: str, options: AlgorithmOptions, **learner_kwargs: Any) -> Any:
    """The learner ``learner_id`` of ``algorithm`` (a built-in name or a reference), built by its class's
    ``from_options`` (see the module docstring).

    Raises:
        ValueError: an unknown name, a reference that does not load (its module's own error quoted), or one that
            names neither a class with ``from_options`` nor a function, or whose signature cannot take the call.
    """
    owner = f"learner {learner_id!r}"
    target = ALGORITHM_REGISTRY.implementation(algorithm, owner)
    reference = ALGORITHM_REGISTRY.entry(algorithm, owner).implementation
    builder = getattr(target, "from_options", None) if isinstance(target, type) else target
    if not callable(builder):
        raise ValueError(
            f"{owner}: {reference} is a {type(target).__name__} without from_options; name a learner class with a "
            "from_options(learner_id, algorithm, options, **learner_kwargs) classmethod (every "
            "PolicyGradientLearner subclass has one) or a function with that signature"
        )
    check_buildable(builder, (learner_id, algorithm, options), learner_kwargs, owner, reference)
    return builder(learner_id, algorithm, options, **learner_kwargs)
