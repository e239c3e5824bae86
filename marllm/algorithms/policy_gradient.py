"""The clipped policy-gradient learner that PPO and the critic-free learners build on.

:class:`PolicyGradientLearner` owns what the family does alike: its collector (:mod:`marllm.algorithms.actions`), the
KL controller, the rollouts, the scores it trains on, an update's optimiser steps
(:class:`~marllm.algorithms.ppo_steps.PPOSteps`) and its checkpoints. A subclass is an algorithm: what an update
trains towards (:meth:`~PolicyGradientLearner._advantages`), a mini-batch's loss
(:meth:`~PolicyGradientLearner._objective`) and any critic (:meth:`~PolicyGradientLearner._critic`). An update reads
top to bottom: :meth:`PolicyGradientLearner.update` here, ``ppo_steps.py`` (epochs, mini-batches, steps), the
collector's ``rescore`` (``actions/``) and the subclass's objective (``core.py`` for PPO, ``critic_free.py``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tianshou.data import Batch
from tianshou.utils.statistics import RunningMeanStd
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from marllm.algorithms.actions import Collector, new_collector
from marllm.algorithms.algorithm_options import AlgorithmOptions
from marllm.algorithms.construction import construct
from marllm.algorithms.kl_controller import KLController, kl_controller_from
from marllm.algorithms.learner_arguments import (
    check_learner_arguments,
    check_learner_settings,
    new_optimizer,
    prepare_networks,
    set_learning_rate,
)
from marllm.algorithms.learner_checkpoint import LearnerCheckpoint
from marllm.algorithms.ppo_config import GenerationConfig, PPOConfig
from marllm.algorithms.ppo_steps import NonFiniteLossError, PPOSteps
from marllm.algorithms.rollout import (
    Rollout,
    UpdateBatch,
    UpdateStats,
    finish_rollout,
    merge_rollouts,
    transform_scores,
    update_stats,
)
from marllm.algorithms.seat_sequences import sequence_update_batch
from marllm.models.policy import ValueHead, context_length, ready_for_generation
from marllm.parallel.placement import Placement

__all__ = ["PolicyGradientLearner"]


class PolicyGradientLearner:
    """An independent learner of the clipped policy-gradient family: it acts for its agent, keeps its rollouts, and
    updates its own policy towards what its subclass's :meth:`_advantages` and :meth:`_objective` say.

    Args:
        name: the learner id (metric prefix).
        model: the trainable causal LM (``AutoModelForCausalLM``), or the peft model that carries ``adapter``.
        tokenizer: its tokenizer (left padding is set here).
        reference: the frozen π_0, possibly shared with other learners; None when ``adapter`` is set (the reference is
            then the shared base with adapters disabled).
        config: the ``ppo`` settings (None: :class:`PPOConfig`'s defaults).
        generation: sampling settings (None: :class:`GenerationConfig`'s defaults).
        seed: seeds the response-length sampler and the mini-batch shuffling.
        adapter: the LoRA adapter of ``model`` (a peft model shared by several learners) that this learner trains;
            None trains all of ``model``'s trainable parameters.
        kl_controller: the KL coefficient controller, any object with a ``value`` (η, read at the start of each
            batch's update and restored from checkpoints) and ``update(kl, n_steps)`` (called after each completed
            batch); see :class:`~marllm.algorithms.kl_controller.KLController`. The learner owns it and changes its
            state: give each learner its own. None builds it from ``config.kl`` (``kl_control``, ``init_kl_coef``,
            ``target_kl``, ``kl_horizon``), which is then not read for the KL coefficient.
        placement: where the models live across processes (:mod:`marllm.parallel.placement`; None: whole models on
            one process), which ``model`` and ``reference`` were prepared by. Data-parallel, the rollouts hold this
            rank's slice of each batch, and the learner computes over the global batch what one process computes
            over a batch; every rank must be given the same ``seed``.
        actions: how the learner acts (:mod:`marllm.algorithms.actions`): ``"generate"`` (free text),
            ``"constrained"`` (a game's legal move, token by token restricted to continuations of the names in
            ``observation["legal_moves"]``, then EOS), ``"think"`` (free text, then a constrained move) or ``"score"``
            (one legal move drawn from the softmax of the moves' likelihoods). The rollout and every update re-score
            actions the same way, so the log-probs, ratio, entropy and KL are those of the distribution played.
        normalization: ``score``'s normalisation of a move's log-likelihood (``"none"``, ``"token"``, ``"word"``;
            None: ``"token"``); refused with another mode.

    Everything after ``name`` is keyword-only. A subclass is an algorithm: it implements :meth:`_advantages`,
    :meth:`_advantage_stats` and :meth:`_objective`, and may add a critic (:meth:`_critic`), change each response's
    weight in a loss (:meth:`_sample_masses`), the KL the controller steers (:meth:`_controlled_kl`) or the scores it
    trains on (:meth:`_transform_scores`).
    """

    collector: Collector
    """What acts for this learner in its action mode: the acting methods delegate to it, and :meth:`_loss` is
    :meth:`_objective` of its ``rescore``."""

    def __init__(
        self,
        name: str,
        *,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        reference: PreTrainedModel | None,
        config: PPOConfig | None = None,
        generation: GenerationConfig | None = None,
        seed: int = 0,
        adapter: str | None = None,
        kl_controller: KLController | None = None,
        placement: Placement | None = None,
        actions: str = "generate",
        normalization: str | None = None,
    ):
        self.name = name
        self.model = model
        prepare_networks(model, reference, config)
        self.tokenizer = ready_for_generation(tokenizer, f"learner {name}")
        self.placement = placement if placement is not None else Placement()
        check_learner_arguments(
            name, reference=reference, adapter=adapter, kl_controller=kl_controller, placement=self.placement
        )
        self.reference = reference
        self.adapter = adapter
        config = config or PPOConfig()
        self.generation = generation or GenerationConfig()
        check_learner_settings(name, config, self.generation, self.tokenizer, actions, self.placement)
        # The settings the placement decides ("auto"), settled once: the update and the collector read them as given.
        self.config = dataclasses.replace(config, compute=config.compute.settled(self.placement))
        self.device = next(model.parameters()).device
        self.value_head = self._critic()
        # Dropout stays off in rollout and update alike, so the first ratio of a batch is exactly 1.
        self.model.eval()
        self.optimizer = new_optimizer(name, model, adapter, self.value_head, self.config, self.placement, seed)
        self.kl_controller = kl_controller if kl_controller is not None else kl_controller_from(self.config)
        self.placement.start_equal(self._trained_parameters())
        self.score_statistics = RunningMeanStd(mean=0.0, std=1.0, clip_max=None)
        self.context_length = context_length(model)
        self._rng = np.random.default_rng(seed)
        self.rollouts: list[Rollout] = []
        self.num_updates = 0
        self.collector = self._new_collector(actions, normalization)

    def _critic(self) -> ValueHead | None:
        """The critic trained beside the policy (after it in the optimiser; the collector records its values): none
        here, :class:`~marllm.algorithms.ppo.PPOLearner` adds a value head."""
        return None

    def _new_collector(self, actions: str, normalization: str | None) -> Collector:
        """The collector of ``actions`` (with ``score``'s ``normalization``) on this learner's parts."""
        return new_collector(
            actions,
            owner=f"learner {self.name!r}",
            options=None if normalization is None else {"normalization": normalization},
            name=self.name,
            model=self.model,
            tokenizer=self.tokenizer,
            reference=self.reference,
            adapter=self.adapter,
            compute=self.config.compute,
            kl_penalty=self.config.kl.kl_penalty,
            generation=self.generation,
            value_head=self.value_head,
            context_length=self.context_length,
            device=self.device,
            placement=self.placement,
            rng=self._rng,
        )

    @property
    def actions(self) -> str:
        """The learner's action mode (``game.actions``): its collector's."""
        return self.collector.actions

    @classmethod
    def from_options(cls, learner_id: str, algorithm: str, options: AlgorithmOptions, **learner_kwargs: Any) -> Any:
        """The catalog's learner (:mod:`marllm.algorithms.catalog`), checked against its constructor, then built."""
        modes = {"actions": options.actions, "normalization": options.action_normalization}
        return construct(cls, learner_id, **modes, **learner_kwargs)

    # ------------------------------------------------------------------------------------------------- acting
    def act(self, observation: Mapping[str, Sequence[Any]], role: str | None = None) -> tuple[str, ...]:
        """Answer each prompt of ``observation["prompt"]`` in the learner's action mode (a game's modes choose among
        ``observation["legal_moves"]``) and record the rollout for the update."""
        rollout = self.collector.collect(observation, role)
        self.rollouts.append(rollout)
        return rollout.responses

    def finish(self, rewards: Sequence[float] | np.ndarray, task_rewards: Sequence[float] | None = None) -> None:
        """Give the oldest unrewarded rollout its per-response rewards (the ones to train on); ``task_rewards`` (the
        agent's own task reward, possibly not the one it is trained on) is kept for the metrics only."""
        finish_rollout(self.rollouts, rewards, task_rewards, self.name)

    def respond(self, prompts: Sequence[str], max_new_tokens: int | None = None) -> tuple[str, ...]:
        """Sample responses without recording anything (evaluation; deploying the agent alone)."""
        return self.collector.respond(prompts, max_new_tokens)

    def move_probabilities(self, prompts: Sequence[str], legal_moves: Sequence[Sequence[str]]) -> list[list[float]]:
        """Each legal move's exact probability of each prompt, in the order of ``legal_moves`` (constrained or scored
        moves; see :meth:`~marllm.algorithms.actions.base.Collector.move_probabilities`)."""
        return self.collector.move_probabilities(prompts, legal_moves)

    def sample_length(self) -> int:
        """The per-batch response budget, uniform over [min_new_tokens, max_new_tokens]."""
        return self.collector.sample_length()

    def activate(self) -> None:
        """Make this learner's adapter the active one of a shared LoRA model (no-op for a full model)."""
        self.collector.activate()

    def reference_model(self) -> AbstractContextManager[PreTrainedModel]:
        """π_0: the separate frozen reference, or the shared base with every adapter disabled."""
        return self.collector.reference_model()

    # ------------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Everything that changes as this learner trains, as (tensors, JSON-able meta), for a checkpoint (see
        :meth:`LearnerCheckpoint.state_dict`); the tensors share memory with the live ones.

        Raises:
            RuntimeError: the learner holds a rollout it has not trained on yet (save between iterations).
        """
        return self._checkpoint().state_dict()

    def share_state(self) -> None:
        """On a rank that does not write, where the placement gathers states to save: take part in the gathers of
        the :meth:`state_dict` that rank 0 takes (for its checkpoint) at the same time, keeping nothing."""
        self._checkpoint().share_state()

    def load_state_dict(self, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned into a learner built like the one that saved it.

        Raises:
            CheckpointError: the state does not fit; it is checked before anything changes.
        """
        self.num_updates = self._checkpoint().load_state_dict(tensors, meta)

    def save(self, directory: str | Path) -> None:
        """Export the policy (Hugging Face format, with its tokenizer) and the training state to ``directory`` (see
        :meth:`LearnerCheckpoint.save`)."""
        self._checkpoint().save(directory)

    def load_state(self, directory: str | Path) -> None:
        """Restore the training state written by :meth:`save` (the policy loads via ``from_pretrained``).

        Raises:
            CheckpointError: the state is missing, refused, or does not fit this learner.
        """
        self.num_updates = self._checkpoint().load_state(directory)

    def _checkpoint(self) -> LearnerCheckpoint:
        """This learner's parts that a checkpoint saves and restores."""
        return LearnerCheckpoint(
            name=self.name,
            model=self.model,
            tokenizer=self.tokenizer,
            adapter=self.adapter,
            value_head=self.value_head,
            optimizer=self.optimizer,
            kl_controller=self.kl_controller,
            score_statistics=self.score_statistics,
            rng=self._rng,
            num_updates=self.num_updates,
            pending=len(self.rollouts),
            placement=self.placement,
        )

    # ----------------------------------------------------------------------------------------------- learning
    def update(self) -> dict[str, float]:
        """Train on every rewarded rollout, merged into one batch (:func:`merge_rollouts`), then forget them.
        Returns this learner's metrics (unprefixed): batch means over all of its responses of the iteration.

        With ``ppo.guards.on_nonfinite: skip`` a non-finite loss or gradient norm abandons the rest of the update (see
        :class:`PPOConfig`): the metrics then hold ``nonfinite_skipped = 1`` and :attr:`last_nonfinite` says why.
        """
        if not self.rollouts:
            raise RuntimeError(f"learner {self.name!r}: update() called with no rollout (act() was never called)")
        unfinished = [i for i, r in enumerate(self.rollouts) if not r.finished]
        if unfinished:
            raise RuntimeError(f"learner {self.name!r}: rollout(s) {unfinished} never got their reward (finish())")
        self.last_nonfinite: str | None = None
        # The iteration's turns are one update: one shuffle of all samples per epoch, one step of each statistic.
        if self.rollouts[0].seat_turns is not None:  # one token sequence per seat: a row per sequence
            rollout = self.collector.sequence_rollout(self.rollouts)
        else:
            rollout = merge_rollouts(self.rollouts, self.tokenizer.pad_token_id)
        self.config.batching.check_batch_size(len(rollout.responses) * self.placement.world_size)
        schedule = set_learning_rate(self.optimizer, self.config, self.num_updates)
        metrics = self._update_with(rollout).as_dict() | schedule
        self.rollouts = []
        self.num_updates += 1
        return dict(self.placement.mean_metrics(metrics))

    def _update_with(self, rollout: Rollout) -> UpdateStats:
        started = time.perf_counter()
        self.activate()
        score_statistics = copy.deepcopy(self.score_statistics)  # put back if a step is not finite
        data = self._preprocess(rollout)
        losses: dict[str, list[float]] = defaultdict(list)
        nonfinite: str | None = None
        try:
            self._optimisation(data.kl_coef).run(data, losses)
        except NonFiniteLossError as error:
            if self.config.guards.on_nonfinite == "raise":
                raise
            # The step was not applied and the rest of the update is abandoned; steps already applied stay.
            nonfinite = str(error)
            self.score_statistics = score_statistics
        self.last_nonfinite = nonfinite
        b = data.batch
        if nonfinite is None:
            # Ziegler et al.'s controller is fed the KL that the penalty actually uses, per sample of the batch (the
            # global batch: every rank's controller takes the same step).
            controlled = self._controlled_kl(b)
            kl_batch = self.placement.mean(controlled)
            self.kl_controller.update(kl_batch, len(data) * self.placement.world_size)
        skipped = nonfinite is not None if self.config.guards.on_nonfinite == "skip" else None
        return update_stats(rollout, data, losses, self._advantage_stats(b), started, skipped)

    @torch.no_grad()
    def _preprocess(self, rollout: Rollout) -> UpdateBatch:
        """What the epochs train on, from a rewarded rollout: the transformed scores, η, and the rollout's tensors
        with the :meth:`_advantages` columns, in a new :class:`UpdateBatch` (``rollout.tensors`` is not written to).

        Updates the running score statistics (``ppo.score_transform``), as each batch's scores are part of them.
        """
        kl_coef = float(self.kl_controller.value)
        if rollout.seat_turns is not None:
            return sequence_update_batch(rollout, self._transform_scores, self._advantages, kl_coef, self.placement)
        global_rows = self.placement.global_rows(rollout.segment_sizes)
        scores = self._transform_scores(rollout.received_rewards, global_rows)
        score_tensor = torch.as_tensor(scores, dtype=torch.float32, device=self.device)
        columns = self._advantages(rollout.tensors, score_tensor, kl_coef)
        return UpdateBatch(Batch(rollout.tensors, **columns), scores, kl_coef, rollout.prompt_length, global_rows)

    def _transform_scores(self, scores: np.ndarray, global_rows: np.ndarray) -> np.ndarray:
        """The scores (B,) an update trains on: ``ppo.score_transform`` of the rewards (global batch statistics)."""
        batch = self.placement.gather_rows(scores, global_rows)  # one process's order on every rank
        cfg = self.config
        return transform_scores(scores, batch, self.score_statistics, cfg.score_transform, cfg.score_clip)

    def _optimisation(self, kl_coef: float = 0.0) -> PPOSteps:
        """The optimiser steps of an update whose KL coefficient is ``kl_coef`` (η): this learner's settings,
        optimiser, loss, masses and generator."""
        return PPOSteps(
            config=self.config,
            optimizer=self.optimizer,
            parameters=self._trained_parameters(),
            loss=functools.partial(self._loss, kl_coef=kl_coef),
            sample_masses=self._sample_masses,
            rng=self._rng,
            placement=self.placement,
            name=self.name,
            update=self.num_updates,
        )

    def _loss(self, mb: Batch, prompt_length: int, kl_coef: float) -> tuple[torch.Tensor, dict[str, float]]:
        """A mini-batch's loss and its parts: :meth:`_objective` of the collector's re-scoring of its actions (the
        log-probs and values under the policy now), with the re-scoring's ``entropy`` and ``ratio``."""
        rescored = self.collector.rescore(mb, prompt_length)
        loss, parts = self._objective(mb, rescored.logprobs, rescored.values, kl_coef)
        return loss, parts | rescored.stats

    def _all_reduce(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """A sum over the ranks, for batch statistics (None where this process holds the whole batch)."""
        return self.placement.sum_over_ranks

    def _trained_parameters(self) -> list[torch.nn.Parameter]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    # ------------------------------------------------------------------------------------- what a subclass says
    def _advantages(self, b: Batch, scores: torch.Tensor, kl_coef: float) -> dict[str, torch.Tensor]:
        """The columns the update adds to the rollout's tensors ``b`` (which it does not change): ``advantages`` and
        ``returns`` (B, L), and whatever else the algorithm keeps, from the (transformed) scores (B,) and η."""
        raise NotImplementedError(f"{type(self).__name__} must say what an update trains towards (_advantages)")

    def _advantage_stats(self, b: Batch) -> dict[str, float]:
        """The reported statistics of the update's targets (``returns/mean``, …)."""
        raise NotImplementedError(f"{type(self).__name__} must report its targets' statistics (_advantage_stats)")

    def _objective(
        self, mb: Batch, logprobs: torch.Tensor, values: torch.Tensor | None, kl_coef: float
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of a mini-batch ``mb`` (its recorded actions, advantages and returns) and its parts, from the
        re-scored ``logprobs`` and ``values`` (None without a critic) and the update's η ``kl_coef``."""
        raise NotImplementedError(f"{type(self).__name__} must give a mini-batch's loss (_objective)")

    def _controlled_kl(self, b: Batch) -> float:
        """The batch's mean summed KL that the penalty uses, which the KL controller steers: the reward's."""
        return b.kl.sum(1).mean().item()

    def _sample_masses(self, mask: torch.Tensor) -> torch.Tensor:
        """Each response's weight in a mini-batch loss's normaliser, (B, L) -> (B,): its tokens (token means)."""
        return mask.sum(1)
