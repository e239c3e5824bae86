"""The optimiser steps of a PPO update: which samples each step and mini-batch holds, and how a mini-batch's loss
gradient is accumulated (this rank's rows, the loss normaliser's share, the ratio guard, non-finite losses).

:class:`PPOSteps` runs the epochs of one update from explicit inputs: the settings, the optimiser and the parameters
it steps, the generator that shuffles the mini-batches, the learner's loss and sample masses as callables (a learner
builds one per update: :meth:`~marllm.algorithms.policy_gradient.PolicyGradientLearner._optimisation`). The step plan
(:func:`plan_steps`) is bookkeeping over indices; :meth:`PPOSteps.accumulate` runs a mini-batch's forward and backward.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
from tianshou.data import Batch

from marllm.algorithms.rollout import SEQUENCE_COLUMNS, UpdateBatch
from marllm.parallel.placement import Placement

if TYPE_CHECKING:
    from marllm.algorithms.ppo_config import PPOConfig

LossFunction = Callable[[Any, int], tuple[torch.Tensor, dict[str, float]]]
"""``loss(mini_batch, prompt_length) -> (loss, parts)``: a mini-batch's loss and its parts (``loss/policy``,
``ratio``, ``entropy``, …), as :meth:`~marllm.algorithms.policy_gradient.PolicyGradientLearner._loss` computes them."""


class NonFiniteLossError(FloatingPointError):
    """A PPO loss or gradient was NaN/inf; the optimiser step it belonged to was not applied."""


class _MiniBatch(NamedTuple):
    """One mini-batch of an optimiser step (see :func:`plan_steps`)."""

    epoch: int
    indices: np.ndarray  # (m,) its samples' indices in the global batch
    mine: np.ndarray  # this rank's samples among them (global indices)
    rows: np.ndarray  # the same samples as rows of this rank's local batch
    weight: float  # its loss's share of the step's accumulated gradient


@dataclass(eq=False, kw_only=True)
class PPOSteps:
    """The epochs of optimiser steps of one PPO update, from explicit inputs.

    Attributes:
        config: the PPO settings (epochs, mini-batches, micro-batches, ratio threshold, gradient clipping), settled
            for ``placement`` (:meth:`~marllm.algorithms.ppo_sections.ComputeConfig.settled`).
        optimizer: the optimiser it steps.
        parameters: the parameters ``optimizer`` holds (whose gradients it accumulates, clips and restores).
        loss: a mini-batch's loss and its parts (:data:`LossFunction`).
        sample_masses: each response's weight in a mini-batch loss's normaliser, (B, L) mask -> (B,).
        rng: shuffles each epoch's samples (:func:`plan_steps`).
        placement: where the models live across processes (the collectives of a data-parallel update).
        name: the learner's id, for the messages of :class:`NonFiniteLossError`.
        update: the learner's update count before this update, for the same messages.
    """

    config: PPOConfig
    optimizer: torch.optim.Optimizer
    parameters: list[torch.nn.Parameter]
    loss: LossFunction
    sample_masses: Callable[[torch.Tensor], torch.Tensor]
    rng: np.random.Generator
    placement: Placement = field(default_factory=Placement)
    name: str = ""
    update: int = 0
    _row_counts: torch.Tensor | None = field(default=None, init=False, repr=False)

    def run(self, data: UpdateBatch, losses: dict[str, list[float]]) -> None:
        """``ppo_epochs`` passes of optimiser steps over ``data.batch``, appending each mini-batch's loss parts to
        ``losses``. Raises :class:`NonFiniteLossError` before applying a step whose loss or gradient is not finite.

        Data-parallel, every rank walks the global batch in one process's order, computes the loss of its own rows
        of each mini-batch with the whole mini-batch's normaliser, and the gradients are summed over the ranks
        before each step: one process's step, up to float summation order.
        """
        placement = self.placement
        masses, self._row_counts = host_rows(data.batch, self.sample_masses)
        rows = np.arange(len(data)) if data.global_rows is None else data.global_rows  # this rank's global rows
        masses = placement.gather_rows(masses, rows)
        for step in self.plan(masses, rows):
            self.optimizer.zero_grad(set_to_none=True)
            applied = 0
            failure: str | None = None
            for minibatch in step:
                counted, problem = self.accumulate(minibatch, data, masses, losses)
                applied += counted
                if problem is not None:
                    failure = problem
                    if placement.world_size == 1:  # no other rank waits in this step's collectives
                        break
            if placement.any(failure is not None):
                failure = failure or f"learner {self.name!r}: non-finite PPO loss on another rank"
            if failure is not None:
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteLossError(failure)
            # Every mini-batch skipped: no step at all, so Adam's momentum does not move the weights either.
            if applied:
                placement.sum_gradients_(self.parameters)
                self._optimizer_step(step[0].epoch)
        # The next update's first step clears them anyway: freed now, a learner's gradients (one more copy of its
        # trainable weights) are not held through the other learners' rollouts and updates.
        self.optimizer.zero_grad(set_to_none=True)

    def plan(self, masses: torch.Tensor, global_rows: np.ndarray) -> Iterator[list[_MiniBatch]]:
        """The optimiser steps of the update (:func:`plan_steps` with these settings and generator)."""
        return plan_steps(masses, global_rows, self.config, self.rng)

    def accumulate(
        self, minibatch: _MiniBatch, data: UpdateBatch, masses: torch.Tensor, losses: dict[str, list[float]]
    ) -> tuple[bool, str | None]:
        """Add one mini-batch's weighted loss gradient (this rank's rows of it) to the step's gradient, unless the
        ratio threshold skips it; its loss parts are appended to ``losses``.

        Three concerns, one after the other: the passes that compute it (:class:`_Passes`: micro-batches, each
        weighted by its share of the mini-batch's mass, a non-finite loss stopping them), the ratio guard over the
        whole mini-batch (:meth:`_skips`), then the gradient kept or taken back. A rank that holds no row of it
        stands in (:meth:`_stand_in`).

        Returns whether the mini-batch counts towards the step and, if a loss is not finite, the failure to report.
        The collectives every rank makes per mini-batch run even after a failure, so that the ranks stay in step
        until they agree to fail.
        """
        counts = self._row_counts if self._row_counts is not None else host_rows(data.batch, self.sample_masses)[1]
        plan = passes(minibatch, data.batch, data.prompt_length, self.config.compute.micro_batch_size, counts[1])
        if not plan:  # this rank holds no row of the mini-batch
            return self._stand_in(data.batch, data.prompt_length), None
        computed = _Passes(plan, minibatch, masses, counts[0], self.placement.lockstep)
        computed.run(self.loss, self._gradients_before, lambda parts: self._nonfinite_loss(parts, minibatch.epoch))
        parts = computed.parts
        skipped = self._skips(parts.get("ratio", 0.0), computed.tokens)  # every rank decides alike, even on failure
        parts["skipped_minibatch_fraction"] = float(skipped)
        for key, value in parts.items():
            losses[key].append(value)
        if skipped:
            if not computed.deferred:
                self._restore_gradients(computed.before)
            return False, computed.failure
        computed.backward_pending()
        return True, computed.failure

    def _stand_in(self, b: Batch, prompt_length: int) -> bool:
        """A mini-batch this rank holds no row of: whether it counts towards the step. Where the placement runs the
        ranks in lockstep (FSDP needs every rank in every forward and backward, in the same order): a stand-in row's
        loss, times 0."""
        stand_in = self.loss(b[:1], prompt_length)[0] if self.placement.lockstep else None
        skipped = self._skips(0.0, 0.0)
        if stand_in is not None and not skipped:
            (stand_in * 0.0).backward()
        return not skipped

    def _skips(self, ratio: float, tokens: float) -> bool:
        """TRL's ratio_threshold: whether a mini-batch whose mean ratio π/π_old (over ``tokens`` of this rank's) has
        run away gives no gradient. Data-parallel, every rank decides on the global mean, in one all-reduce each."""
        threshold = self.config.guards.ratio_threshold
        if threshold is None:
            return False
        return self.placement.weighted_mean(ratio, tokens) > threshold

    def _nonfinite_loss(self, parts: dict[str, float], epoch: int) -> str:
        return (
            f"learner {self.name!r}: non-finite PPO loss {parts} in update {self.update}, epoch {epoch}; the "
            "optimiser step was not applied"
        )

    def _gradients_before(self) -> list[torch.Tensor | None] | None:
        """The step's gradients so far (None: none yet, the step's first mini-batch), to put back after a skip."""
        grads = [p.grad for p in self.parameters]
        if all(grad is None for grad in grads):
            return None
        return [None if grad is None else grad.detach().clone() for grad in grads]

    def _restore_gradients(self, before: list[torch.Tensor | None] | None) -> None:
        if before is None:
            self.optimizer.zero_grad(set_to_none=True)
            return
        for parameter, grad in zip(self.parameters, before, strict=True):
            parameter.grad = grad

    def _optimizer_step(self, epoch: int) -> None:
        norm = self.placement.gradient_norm(self.parameters, self.config.optimiser.max_grad_norm)
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(
                f"learner {self.name!r}: non-finite gradient norm in update {self.update}, epoch {epoch}; "
                "the optimiser step was not applied"
            )
        self.optimizer.step()


@dataclass(eq=False)
class _Passes:
    """The passes that compute one mini-batch (this rank's rows of it, :func:`passes`), and what they leave: the
    mini-batch's loss parts, its response tokens, the backward still to run, the gradients to put back if it is
    skipped, and a failure.

    Each pass's loss (a mean over its own tokens or responses) is weighted by its share of the mini-batch's mass, so
    that the passes sum to the mini-batch's loss; data-parallel, by its share of the *global* mini-batch's mass (the
    ranks' gradients are summed), while the recorded parts are this rank's means (the ranks' metrics are averaged).
    The ratio guard needs the whole mini-batch's ratio: one pass waits for it before its backward (``deferred``);
    several run their backwards as they go, to be taken back if the mini-batch is skipped. A non-finite loss stops
    the passes; in ``lockstep`` (FSDP's reduce-scatter needs every rank), its backward still runs.
    """

    plan: list[Pass]
    minibatch: _MiniBatch
    masses: torch.Tensor
    tokens_of_rows: torch.Tensor  # (B,) on the host: each local row's response tokens
    lockstep: bool  # every rank runs every backward (the placement's)
    parts: dict[str, float] = field(default_factory=dict)
    failure: str | None = None
    pending: tuple[torch.Tensor, float] | None = None
    before: list[torch.Tensor | None] | None = None

    def __post_init__(self) -> None:
        self.total = float(self.masses[self.minibatch.indices].sum()) or 1.0  # the global mini-batch's mass
        self.own_total = float(self.masses[self.minibatch.mine].sum()) or 1.0  # this rank's rows of it
        self.tokens = self._tokens(np.concatenate([one.rows for one in self.plan]))
        self.deferred = len(self.plan) == 1  # the ratio is known before the one pass's backward

    def run(
        self,
        loss: LossFunction,
        gradients_before: Callable[[], list[torch.Tensor | None] | None],
        nonfinite: Callable[[dict[str, float]], str],
    ) -> None:
        """Compute the passes in order (``loss`` of each), backward as they go unless ``deferred``; keep the
        gradients from before them (``gradients_before``) to take back, and ``nonfinite(parts)``'s message on a
        non-finite loss."""
        self.before = None if self.deferred else gradients_before()
        combined: dict[str, float] = defaultdict(float)
        for one in self.plan:
            value, parts = loss(one.batch, one.prompt_length)
            mass = float(self.masses[one.mine].sum())
            weight = self.minibatch.weight * (mass / self.total)
            finite = bool(torch.isfinite(value))
            if self.deferred or not finite:
                combined = defaultdict(float, parts)  # one pass's parts as they are (a failing pass's too)
            else:
                mass_share, token_share = mass / self.own_total, self._tokens(one.rows) / (self.tokens or 1.0)
                for key, part in parts.items():  # objective: by masses; rescore: by tokens
                    combined[key] += part * (token_share if key in _TOKEN_MEANS else mass_share)
            if not finite:
                self.failure = nonfinite(parts)
                self.pending = (value, weight) if self.lockstep else None
                break
            if self.deferred:
                self.pending = (value, weight)
            else:
                (value * weight).backward()
        self.parts = dict(combined)

    def _tokens(self, rows: np.ndarray) -> float:
        """The response tokens of these local rows (integers: exact in float32, summed in any order)."""
        return float(self.tokens_of_rows[torch.as_tensor(rows)].sum())

    def backward_pending(self) -> None:
        """The backward a deferred (or failed lockstep) pass still owes."""
        if self.pending is not None:
            value, weight = self.pending
            (value * weight).backward()


def plan_steps(
    masses: torch.Tensor, global_rows: np.ndarray, config: PPOConfig, rng: np.random.Generator
) -> Iterator[list[_MiniBatch]]:
    """The optimiser steps of an update, each as its mini-batches: ``config.batching.ppo_epochs`` passes over the
    (global) batch of ``len(masses)`` samples, each shuffled by ``rng``, of which this rank holds ``global_rows`` (its
    local rows' global indices, in local order). ``masses`` (N,): what each sample weighs in a loss normaliser.

    A mini-batch's weight is its loss's share of its step's accumulated gradient: under ``loss_reduction:
    minibatch_token_mean`` 1 / (the mini-batches the step really holds: ``gradient_accumulation_steps``, or fewer or
    more where ``last_minibatch: merge`` merged), so the step's loss is their mean; under ``step_token_mean`` the
    mini-batch's share of the step's mass, so every token (or response) of the step weighs the same.
    """
    batch_size = len(masses)
    local_of = np.full(batch_size, -1)
    local_of[global_rows] = np.arange(len(global_rows))
    merge = config.batching.last_minibatch == "merge"
    for epoch in range(config.batching.ppo_epochs):
        b_inds = rng.permutation(batch_size)
        for step_slice in split_points(batch_size, config.batching.backward_batch_size, merge):
            step_inds = b_inds[step_slice]
            mb_slices = split_points(len(step_inds), config.batching.mini_batch_size, merge)
            step = []
            for mb_slice in mb_slices:
                mb_inds = step_inds[mb_slice]
                mine = mb_inds[local_of[mb_inds] >= 0]
                if config.batching.loss_reduction == "step_token_mean":
                    weight = float(masses[mb_inds].sum()) / max(float(masses[step_inds].sum()), 1.0)
                else:
                    weight = 1.0 / len(mb_slices)
                step.append(_MiniBatch(epoch, mb_inds, mine, local_of[mine], weight))
            yield step


class Pass(NamedTuple):
    """One forward and backward of a mini-batch (see :func:`passes`)."""

    rows: np.ndarray  # its rows of this rank's local batch
    mine: np.ndarray  # the same samples' global indices
    batch: Any  # those rows' columns (trimmed of padding when cut into several passes)
    prompt_length: int


def passes(
    minibatch: _MiniBatch,
    b: Any,
    prompt_length: int,
    micro_batch_size: int | None,
    row_lengths: torch.Tensor | None = None,
) -> list[Pass]:
    """This rank's rows of a mini-batch as the passes that compute it: none if it holds no row; one of them all as
    they are when ``micro_batch_size`` is None; else sorted by length and cut into passes of ``micro_batch_size``
    rows, each trimmed of the padding its rows do not need (:func:`trim_padding`). ``row_lengths`` (B,): each local
    row's length (its attention mask's sum) on the host, as :func:`host_rows` gives it (None: read from ``b``)."""
    if not len(minibatch.rows):
        return []
    if micro_batch_size is None:
        return [Pass(minibatch.rows, minibatch.mine, b[minibatch.rows], prompt_length)]
    if row_lengths is None:
        row_lengths = b.attention_mask.sum(1).cpu()
    lengths = row_lengths[torch.as_tensor(minibatch.rows)].numpy()
    order = np.argsort(lengths, kind="stable")
    rows, mine = minibatch.rows[order], minibatch.mine[order]
    cut = []
    for start in range(0, len(rows), micro_batch_size):
        part = slice(start, start + micro_batch_size)
        trimmed, length = trim_padding(b[rows[part]], prompt_length)
        cut.append(Pass(rows[part], mine[part], trimmed, length))
    return cut


def host_rows(b: Any, sample_masses: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """What the step plan and the passes read of each row of ``b``, on the host in one device→host copy rather than
    some at each mini-batch: its mass in a loss normaliser (``sample_masses``), (B,), and its response tokens and its
    length (the attention mask's sum), (2, B); float32, each count exact."""
    host = torch.stack([sample_masses(b.mask).float(), b.mask.sum(1).float(), b.attention_mask.sum(1).float()]).cpu()
    return host[0], host[1:]


def split_points(count: int, size: int, merge_last: bool) -> list[slice]:
    """``count`` items in consecutive slices of ``size``: the last one shorter, or with ``merge_last`` the items
    left over merged into the one before (no slice shorter than ``size`` unless ``count`` is)."""
    starts = list(range(0, count, size))
    if merge_last and len(starts) > 1 and count - starts[-1] < size:
        starts.pop()
    return [slice(start, end) for start, end in zip(starts, [*starts[1:], count], strict=True)]


_TOKEN_MEANS = ("ratio", "entropy")  # the loss parts a collector's rescore averages over tokens (or moves), always


def trim_padding(mb: Any, prompt_length: int) -> tuple[Any, int]:
    """A mini-batch without the padding columns none of its rows needs, and its prompt length.

    The prompt columns left of every row's first real token and the response columns right of every row's last
    response token (``mask``) are dropped (of (B, L) columns and of (B, L, K) ones: constrained answers' ``allowed``);
    positions come from the attention mask, so each row's log-probs stay its own (up to float rounding in the shorter
    attention).
    """
    real = mb.attention_mask[:, :prompt_length].any(dim=0)  # (P,)
    response_length = mb.response.shape[1]
    used = mb.mask.any(dim=0)  # (L,)
    # The first real prompt column and one past the last used response column (P − 1 and 1 where there is none), in
    # one device→host copy; argmax gives the first of equal maxima.
    first = torch.where(real.any(), real.float().argmax(), prompt_length - 1)
    past_last = torch.where(used.any(), response_length - used.flip(0).float().argmax(), 1)
    lead, keep = torch.stack([first, past_last]).tolist()
    lead = min(lead, prompt_length - 1)  # keep one prompt column: the logits at P − 1 predict the first response token
    if lead == 0 and keep == response_length:
        return mb, prompt_length
    columns = {}
    for key, tensor in mb.items():
        if key in SEQUENCE_COLUMNS:
            columns[key] = tensor[:, lead : prompt_length + keep]
        elif isinstance(tensor, torch.Tensor) and tensor.dim() in (2, 3) and tensor.shape[1] == response_length:
            columns[key] = tensor[:, :keep]
        else:
            columns[key] = tensor
    return Batch(**columns), prompt_length - lead
