"""The optimiser steps of a PPO update: which samples each step and mini-batch holds, and how a mini-batch's loss
gradient is accumulated (this rank's rows, the loss normaliser's share, the ratio guard, non-finite losses).

:class:`PPOSteps` is a part of :class:`~marllm.algorithms.ppo.PPOLearner` (as rollouts and checkpoints are): the
step plan (:meth:`PPOSteps._step_plan`) is pure bookkeeping over indices; :meth:`PPOSteps._accumulate` runs one
mini-batch's forward and backward through the learner's ``_loss``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from marllm.algorithms.ppo_update import UpdateBatch
from marllm.parallel.sharding import full_tensor

if TYPE_CHECKING:
    from marllm.algorithms.ppo_config import PPOConfig
    from marllm.parallel.distributed import DataParallel


class NonFiniteLossError(FloatingPointError):
    """A PPO loss or gradient was NaN/inf; the optimiser step it belonged to was not applied."""


class _MiniBatch(NamedTuple):
    """One mini-batch of an optimiser step (see :meth:`PPOLearner._step_plan`)."""

    epoch: int
    indices: np.ndarray  # (m,) its samples' indices in the global batch
    mine: np.ndarray  # this rank's samples among them (global indices)
    rows: np.ndarray  # the same samples as rows of this rank's local batch
    weight: float  # its loss's share of the step's accumulated gradient


class PPOSteps:
    """The epochs of optimiser steps of :class:`~marllm.algorithms.ppo.PPOLearner` (a part of it, not used alone)."""

    config: PPOConfig
    data_parallel: DataParallel | None
    sharded: bool
    optimizer: torch.optim.Optimizer
    name: str
    num_updates: int
    _rng: np.random.Generator
    _loss: Any
    _trained_parameters: Any

    def _ppo_steps(self, data: UpdateBatch, losses: dict[str, list[float]]) -> None:
        """``ppo_epochs`` passes of optimiser steps over ``data.batch``, appending each mini-batch's loss parts to
        ``losses``. Raises :class:`NonFiniteLossError` before applying a step whose loss or gradient is not finite.

        Data-parallel, every rank walks the global batch in one process's order, computes the loss of its own rows
        of each mini-batch with the whole mini-batch's normaliser, and the gradients are summed over the ranks
        before each step: one process's step, up to float summation order.
        """
        dp = self.data_parallel
        masses = self._sample_masses(data.batch.mask).float().cpu()  # what each sample weighs in a loss normaliser
        rows = np.arange(len(data)) if data.global_rows is None else data.global_rows  # this rank's global rows
        if dp is not None:
            masses = dp.gather_rows(masses, rows)
        for step in self._step_plan(masses, rows):
            self.optimizer.zero_grad(set_to_none=True)
            applied = 0
            failure: str | None = None
            for minibatch in step:
                counted, problem = self._accumulate(minibatch, data, masses, losses)
                applied += counted
                if problem is not None:
                    failure = problem
                    if dp is None:
                        break
            if dp is not None and dp.any(failure is not None):
                failure = failure or f"learner {self.name!r}: non-finite PPO loss on another rank"
            if failure is not None:
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteLossError(failure)
            # Every mini-batch skipped: no step at all, so Adam's momentum does not move the weights either.
            if applied:
                if dp is not None and not self.sharded:  # FSDP has summed a sharded model's gradients
                    dp.sum_gradients_(self._trained_parameters())
                self._optimizer_step(step[0].epoch)

    def _step_plan(self, masses: torch.Tensor, global_rows: np.ndarray) -> Iterator[list[_MiniBatch]]:
        """The optimiser steps of an update, each as its mini-batches: ``ppo_epochs`` shuffled passes over the
        (global) batch of ``len(masses)`` samples, of which this rank holds ``global_rows`` (its local rows' global
        indices, in local order)."""
        cfg = self.config
        batch_size = len(masses)
        local_of = np.full(batch_size, -1)
        local_of[global_rows] = np.arange(len(global_rows))
        for epoch in range(cfg.ppo_epochs):
            b_inds = self._rng.permutation(batch_size)
            for start in range(0, batch_size, cfg.backward_batch_size):
                step_inds = b_inds[start : start + cfg.backward_batch_size]
                step = []
                for mb_start in range(0, len(step_inds), cfg.mini_batch_size):
                    mb_inds = step_inds[mb_start : mb_start + cfg.mini_batch_size]
                    mine = mb_inds[local_of[mb_inds] >= 0]
                    weight = self._minibatch_weight(masses[mb_inds], masses[step_inds])
                    step.append(_MiniBatch(epoch, mb_inds, mine, local_of[mine], weight))
                yield step

    def _accumulate(
        self, minibatch: _MiniBatch, data: UpdateBatch, masses: torch.Tensor, losses: dict[str, list[float]]
    ) -> tuple[bool, str | None]:
        """Add one mini-batch's weighted loss gradient (this rank's rows of it) to the step's gradient.

        Returns whether it counts towards the step (not skipped by the ratio threshold) and, if its loss is not
        finite, the failure to report (no backward then, except sharded: FSDP needs every rank's backward).
        """
        cfg, dp = self.config, self.data_parallel
        b, prompt_length = data.batch, data.prompt_length
        parts: dict[str, float] = {}
        if len(minibatch.rows):
            mb = b[minibatch.rows]
            loss, parts = self._loss(mb, prompt_length)
        elif self.sharded:  # FSDP needs every rank in every forward and backward: a stand-in row
            loss, _ = self._loss(b[:1], prompt_length)
        ratio = parts.get("ratio", 0.0)
        if dp is not None and cfg.ratio_threshold is not None:
            ratio = dp.weighted_mean(ratio, float(mb.mask.sum()) if parts else 0.0)
        # TRL's ratio_threshold: a mini-batch whose mean ratio π/π_old has run away gives no gradient.
        skipped = cfg.ratio_threshold is not None and ratio > cfg.ratio_threshold
        if parts:
            parts["skipped_minibatch_fraction"] = float(skipped)
            for key, value in parts.items():
                losses[key].append(value)
        if skipped:
            return False, None
        if not parts and not self.sharded:
            return True, None
        failure = None
        if parts and not torch.isfinite(loss):
            failure = (
                f"learner {self.name!r}: non-finite PPO loss {parts} in update {self.num_updates}, "
                f"epoch {minibatch.epoch}; the optimiser step was not applied"
            )
            if dp is None or not self.sharded:  # sharded, the backward runs all the same (FSDP's reduce-scatter)
                return True, failure
        weight = minibatch.weight
        if dp is not None:  # this rank's share of the mini-batch's loss normaliser (0 for a stand-in)
            weight *= float(masses[minibatch.mine].sum()) / (float(masses[minibatch.indices].sum()) or 1.0)
        (loss * weight).backward()
        return True, failure

    def _sample_masses(self, mask: torch.Tensor) -> torch.Tensor:
        """Each response's weight in a mini-batch loss's normaliser, (B, L) -> (B,): its tokens (token means)."""
        return mask.sum(1)

    def _minibatch_weight(self, minibatch_masses: torch.Tensor, step_masses: torch.Tensor) -> float:
        """The weight of a mini-batch's loss in its optimiser step's accumulated gradient, from the
        :meth:`_sample_masses` of the mini-batch's and the step's responses."""
        if self.config.loss_reduction == "step_token_mean":
            # The loss is a mean over this mini-batch; weighted by the mini-batch's share of the step's tokens (or,
            # for a mean over responses, of its responses), the accumulated loss is that mean over the whole step.
            return float(minibatch_masses.sum()) / max(float(step_masses.sum()), 1.0)
        return 1.0 / self.config.gradient_accumulation_steps

    def _optimizer_step(self, epoch: int) -> None:
        parameters = self._trained_parameters()
        if self.config.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(parameters, self.config.max_grad_norm)
        elif self.sharded:
            norm = torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])
        else:
            grads = [p.grad.norm() for p in parameters if p.grad is not None]
            norm = torch.linalg.vector_norm(torch.stack(grads)) if grads else torch.tensor(0.0)
        norm = full_tensor(norm)  # over sharded gradients, a DTensor: the global norm once made whole
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(
                f"learner {self.name!r}: non-finite gradient norm in update {self.num_updates}, epoch {epoch}; "
                "the optimiser step was not applied"
            )
        self.optimizer.step()
