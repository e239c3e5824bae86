"""What every action mode's collector shares: the learner's parts, acting through its adapter, its reference, and the
interface a learner calls (:meth:`Collector.collect` while acting, :meth:`Collector.rescore` in each mini-batch's
loss)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from marllm.algorithms.action_modes import ActionMode
from marllm.algorithms.rollout import Rollout

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from marllm.algorithms.ppo_config import ComputeConfig, GenerationConfig
    from marllm.models.policy import ValueHead
    from marllm.parallel.placement import Placement


class Rescored(NamedTuple):
    """A mini-batch re-scored under the policy being updated: what an algorithm's objective takes.

    Attributes:
        logprobs: log π(action) of each recorded action, differentiable: (b, L) over response tokens, or (b, 1) for
            one scored move per row.
        values: the value head's V at the same positions, or None without a value head.
        stats: monitors of the mini-batch (no gradient): the policy's mean ``entropy`` and the mean ``ratio``
            π/π_old of the recorded actions.
    """

    logprobs: torch.Tensor
    values: torch.Tensor | None
    stats: dict[str, float]


@dataclass(eq=False, kw_only=True)
class Collector(ActionMode):
    """The acting half of a learner for one action mode (a subclass per mode, :mod:`marllm.algorithms.actions`),
    whose class attributes are the mode's facts (:class:`~marllm.algorithms.action_modes.ActionMode`).

    :meth:`collect` plays one batch and records it as a :class:`~marllm.algorithms.rollout.Rollout` (the
    log-probs of what was played under the policy and under π_0, the value estimates and the KL); :meth:`rescore`
    gives the same quantities of a mini-batch under the policy being updated, the same way, so that a learner's first
    ratio is 1 whatever the mode. :meth:`respond` answers without recording, :meth:`move_probabilities` gives the
    exact probability of every legal move where the mode has one.

    Attributes:
        name: the learner's id, for messages.
        model: the policy (or the peft model that carries ``adapter``).
        tokenizer: its tokenizer, left-padding.
        reference: the frozen π_0; None: ``model``'s base with every adapter disabled.
        adapter: the learner's LoRA adapter of ``model``, or None.
        compute: how the forwards are computed (``ppo.compute``, settled for ``placement``: autocast, forward batch
            size, logits chunks, rollout from generate).
        kl_penalty: the per-token KL the rollout records (``ppo.kl.kl_penalty``: ``"k1"`` or ``"full"``).
        generation: the sampling settings.
        value_head: the value head (V_old of the rollout), or None.
        context_length: the model's context window.
        device: the policy's device.
        placement: where ``model`` lives across processes; its ``generating`` block is entered around sampling.
        rng: draws each batch's response budget (:meth:`sample_length`).
        player: how messages name a collector that plays for a player, not a learner (:attr:`owner`); None: the
            learner ``name``.
    """

    name: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    reference: PreTrainedModel | None
    adapter: str | None
    compute: ComputeConfig
    kl_penalty: str
    generation: GenerationConfig
    value_head: ValueHead | None
    context_length: int | None
    device: torch.device
    placement: Placement
    rng: np.random.Generator
    player: str | None = None

    def collect(self, observation: Mapping[str, Sequence[Any]], role: str | None = None) -> Rollout:
        """Play one answer per prompt of ``observation["prompt"]``, as a rollout awaiting its rewards."""
        raise NotImplementedError

    def rescore(self, mb: Any, prompt_length: int) -> Rescored:
        """The recorded actions of mini-batch ``mb`` (columns of a rollout this collector recorded, with prompts of
        ``prompt_length``) under the policy now, with gradients: see :class:`Rescored`."""
        raise NotImplementedError

    def respond(self, prompts: Sequence[str], max_new_tokens: int | None = None) -> tuple[str, ...]:
        """Answers without recording anything (evaluation; deploying the agent alone)."""
        raise NotImplementedError

    def play(self, observation: Mapping[str, Sequence[Any]], role: str | None = None) -> tuple[str, ...]:
        """One answer per prompt of ``observation["prompt"]`` in the mode, recording nothing: how a model plays
        outside training (evaluation, the tabulation of its strategy by sampling, a best response's target). Free
        text draws each answer's budget (:func:`~marllm.algorithms.actions.tokens.answers_by_budget`); ``role``: the
        seat played, whose sequence a game played as one token sequence per seat goes on from."""
        raise NotImplementedError

    def move_probabilities(self, prompts: Sequence[str], legal_moves: Sequence[Sequence[str]]) -> list[list[float]]:
        """The exact probability of each legal move of each prompt, in the order of ``legal_moves``.

        Raises:
            ValueError: the mode has none (its answers' move probabilities can only be estimated by sampling).
        """
        raise ValueError(
            f"{self.owner}: exact move probabilities need constrained or score actions, not "
            f"{self.actions} (estimate them from sampled answers instead)"
        )

    def legal_moves(self, observation: Mapping[str, Sequence[Any]]) -> list[list[str]]:
        """Each row's legal moves' names.

        Raises:
            ValueError: ``observation`` has none (a text task's).
        """
        if "legal_moves" not in observation:
            raise ValueError(
                f"{self.owner} answers with {self.actions} actions, which need the game's legal moves "
                "(observation['legal_moves']); a text task has none: use game.actions: generate"
            )
        return [list(names) for names in observation["legal_moves"]]

    def sample_length(self) -> int:
        """The per-batch response budget, uniform over [min_new_tokens, max_new_tokens]."""
        return int(self.rng.integers(self.generation.min_new_tokens, self.generation.max_new_tokens + 1))

    def activate(self) -> None:
        """Make the learner's adapter the active one of a shared LoRA model (no-op for a full model)."""
        if self.adapter is not None:
            self.model.set_adapter(self.adapter)

    @contextlib.contextmanager
    def reference_model(self) -> Iterator[PreTrainedModel]:
        """π_0: the separate frozen reference, or the shared base with every adapter disabled."""
        if self.reference is not None:
            yield self.reference
        else:
            with self.model.disable_adapter():
                yield self.model

    @property
    def owner(self) -> str:
        """How messages name the learner (or the player)."""
        return f"learner {self.name!r}" if self.player is None else self.player
