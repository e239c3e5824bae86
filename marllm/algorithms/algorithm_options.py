"""What the algorithm catalog hands a learner's builder beyond every learner's arguments (:class:`AlgorithmOptions`),
torch-free and below both the catalog and the learners it names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from marllm.algorithms.critic_free_config import CriticFreeConfig


@dataclass(frozen=True)
class AlgorithmOptions:
    """Each learner's algorithm, and what some algorithms need beyond every learner's arguments.

    Attributes:
        algorithm: the algorithm of every learner, or learner id -> algorithm (``ppo`` where not named): a name of
            :data:`~marllm.algorithms.catalog.ALGORITHM_REGISTRY` or a reference to a learner class (see
            :mod:`marllm.algorithms.catalog`).
        critic_free: the critic-free learners' settings (None: their defaults).
        group_size: the env's group size, the answers to one query that GRPO and RLOO compare.
        actions: how a learner acts (:mod:`marllm.algorithms.actions`): ``generate``, ``constrained``, ``think``
            or ``score``.
        action_normalization: how ``score`` normalises a move's log-likelihood: ``none`` (the sum over its
            tokens), ``token`` (the mean per token) or ``word`` (the sum divided by the move's words); None: the
            mode's default. Refused with another mode.
    """

    algorithm: str | Mapping[str, str] = "ppo"
    critic_free: CriticFreeConfig | None = None
    group_size: int = 1
    actions: str = "generate"
    action_normalization: str | None = None

    def algorithm_of(self, learner_id: str) -> str:
        """The algorithm of ``learner_id``."""
        if isinstance(self.algorithm, str):
            return self.algorithm
        return self.algorithm.get(learner_id, "ppo")
