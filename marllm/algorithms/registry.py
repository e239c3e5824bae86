"""Learner classes by algorithm name: a new algorithm is a class and one ``@register_learner`` line.

The names are those a config's ``agents.algorithm`` takes (:data:`~marllm.algorithms.critic_free_config.ALGORITHMS`
lists the built-in ones without importing torch). A builder takes the learner id, the algorithm name it was
registered under, the :class:`AlgorithmOptions` that only some algorithms read, and the options every learner takes
(model, tokenizer, reference, config, generation, seed, adapter, data_parallel) as keywords.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from marllm.algorithms.critic_free_config import CriticFreeConfig
from marllm.algorithms.learner import Learner

LearnerBuilder = Callable[..., Learner]
"""``builder(learner_id, algorithm, options: AlgorithmOptions, **learner_kwargs) -> Learner``."""

LEARNERS: dict[str, LearnerBuilder] = {}
"""Algorithm name -> learner builder; filled by :func:`register_learner`."""


@dataclass(frozen=True)
class AlgorithmOptions:
    """Each learner's algorithm, and what some algorithms need beyond every learner's options.

    Attributes:
        algorithm: the algorithm name of every learner, or learner id -> name (``ppo`` where not named); a name
            registered in :data:`LEARNERS` (``ppo``, ``grpo``, ``rloo``, ``reinforce_pp``, ...).
        critic_free: the critic-free learners' settings (None: their defaults).
        group_size: the env's group size, the answers to one query that GRPO and RLOO compare.
        actions: how a game's answers become moves: ``generate``, ``constrained`` or ``score`` (``score``: the
            algorithm's action-level learner, registered as ``<algorithm>:score``).
        action_normalization: how ``score`` normalises a move's log-likelihood: ``none`` (the sum over its
            tokens), ``token`` (the mean per token) or ``word`` (the sum divided by the move's words).
    """

    algorithm: str | Mapping[str, str] = "ppo"
    critic_free: CriticFreeConfig | None = None
    group_size: int = 1
    actions: str = "generate"
    action_normalization: str = "token"

    def algorithm_of(self, learner_id: str) -> str:
        """The algorithm name of ``learner_id``."""
        if isinstance(self.algorithm, str):
            return self.algorithm
        return self.algorithm.get(learner_id, "ppo")


def register_learner(*names: str) -> Callable[[LearnerBuilder], LearnerBuilder]:
    """Register a learner builder under one or more algorithm names (a name registered twice is an error)."""

    def register(builder: LearnerBuilder) -> LearnerBuilder:
        for name in names:
            if name in LEARNERS:
                raise ValueError(f"algorithm {name!r} is registered already ({LEARNERS[name]})")
            LEARNERS[name] = builder
        return builder

    return register


def build_learner(algorithm: str, learner_id: str, options: AlgorithmOptions, **learner_kwargs: Any) -> Learner:
    """The learner ``learner_id`` of ``algorithm``; an unknown name lists the registered ones.

    An algorithm whose action-level learner differs from its token-level one registers it as
    ``<algorithm>:<actions>`` (``ppo:score``); that builder is used when ``options.actions`` names it.
    """
    _load_builtin_learners()
    if algorithm not in LEARNERS:
        raise ValueError(f"learner {learner_id!r}: unknown algorithm {algorithm!r}; registered: {sorted(LEARNERS)}")
    moded = f"{algorithm}:{options.actions}"
    if options.actions == "score" and moded not in LEARNERS:
        scored = sorted(name.split(":")[0] for name in LEARNERS if name.endswith(":score"))
        raise ValueError(f"learner {learner_id!r}: {algorithm} has no learner for score actions; algorithms: {scored}")
    builder = LEARNERS.get(moded, LEARNERS[algorithm])
    return builder(learner_id, algorithm, options, **learner_kwargs)


def _load_builtin_learners() -> None:
    # Importing the learner modules registers them; done on first use so that this module stays free of torch.
    from marllm.algorithms import action_ppo, critic_free_learner, ppo  # noqa: F401
