"""The interface the training loop is written against: what any learner of an agent must do."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Learner(Protocol):
    """A learner plays one agent at a time: it answers the env's prompts, is told each answer's reward, and learns.

    :func:`marllm.loop.run_iteration` calls, per iteration, :meth:`act` whenever its agent is to move (once per
    turn), :meth:`finish` once per :meth:`act` with that rollout's rewards (oldest rollout first), then
    :meth:`update` once. :class:`~marllm.algorithms.ppo.PPOLearner` and
    :class:`~marllm.algorithms.critic_free_learner.CriticFreeLearner` implement it; so can any class with these
    members (a structural type: nothing to inherit).
    """

    name: str
    model: Any
    tokenizer: Any

    def act(self, observation: Mapping[str, Sequence[str]], role: str | None = None) -> tuple[str, ...]:
        """One response per prompt of ``observation["prompt"]``, kept as a rollout awaiting its rewards."""
        ...

    def finish(self, rewards: Sequence[float], task_rewards: Sequence[float] | None = None) -> None:
        """The rewards to train on (and the task's own rewards, for metrics) of the oldest unrewarded rollout."""
        ...

    def update(self) -> dict[str, float]:
        """Learn from every rewarded rollout, forget them, and return this learner's metrics (unprefixed)."""
        ...

    def activate(self) -> None:
        """Make this learner's weights the active ones of a model shared with other learners (LoRA adapters)."""
        ...

    def reference_model(self) -> AbstractContextManager[Any]:
        """The frozen initial model π_0, for evaluation beside the trained one."""
        ...

    def state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Everything that changes as it trains, as (tensors, JSON-able meta), for a training-state checkpoint."""
        ...

    def load_state_dict(self, tensors: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        ...

    def save(self, directory: str | Path) -> None:
        """Export the policy in Hugging Face format (with its tokenizer) and the training state to ``directory``."""
        ...
