"""The sections of the ``ppo`` settings (:class:`~marllm.algorithms.ppo_config.PPOConfig`): the optimiser, the
batching, the KL control, the compute and the guards, each validated when built."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from marllm.utils.checks import choice, non_negative, positive

if TYPE_CHECKING:
    from marllm.parallel.placement import Placement

__all__ = [
    "AUTO_MICRO_BATCH_SIZE",
    "BatchingConfig",
    "ComputeConfig",
    "GuardsConfig",
    "KLConfig",
    "OptimiserConfig",
]

AUTO_MICRO_BATCH_SIZE = 32
"""Rows per pass of ``ppo.compute.micro_batch_size: auto`` on a whole model: on the shared CORY workload (mini-batches
of 256) passes of 32 gave the shortest iterations and about a third less peak memory than whole mini-batches."""


@dataclass
class OptimiserConfig:
    """The optimiser (the ``ppo.optimiser`` section): Adam's step and the gradient's clip.

    Attributes:
        learning_rate: Adam step size. Larger moves the policy (and the KL) faster per batch.
        anneal_updates: the learning rate falls linearly from ``learning_rate`` to 0 over this many updates of a
            learner: its k-th update (from 0) steps with ``learning_rate · (1 − k / anneal_updates)``, and with 0
            past them. A learner updates once per iteration, so the run's ``iterations`` anneal over the run (CleanRL's
            ``anneal_lr``): late updates move the policy less, which damps self-play's cycling around an equilibrium.
            Null: constant. The learners then log their ``learning_rate``.
        adam_eps: Adam's ε.
        max_grad_norm: clip the global gradient norm (None: no clipping, as in the paper's setup).
    """

    learning_rate: float = 1.41e-5
    anneal_updates: int | None = None
    adam_eps: float = 1e-8
    max_grad_norm: float | None = None

    def __post_init__(self) -> None:
        positive("ppo.optimiser", self, "learning_rate", "adam_eps")
        for name in ("max_grad_norm", "anneal_updates"):
            if getattr(self, name) is not None:
                positive("ppo.optimiser", self, name)

    def learning_rate_at(self, update: int) -> float:
        """The learning rate of a learner's ``update``-th update (from 0): ``learning_rate``, annealed linearly to 0
        over ``anneal_updates`` updates where that is set."""
        if self.anneal_updates is None:
            return self.learning_rate
        return self.learning_rate * max(0.0, 1.0 - update / self.anneal_updates)


@dataclass
class BatchingConfig:
    """How an update cuts its batch (the ``ppo.batching`` section): epochs, mini-batches and optimiser steps.

    Attributes:
        ppo_epochs: passes over each batch; more reuses data more but drifts further from the rollout policy.
        mini_batch_size: samples per loss (and per forward/backward pass, unless ``ppo.compute.micro_batch_size``
            splits it).
        gradient_accumulation_steps: mini-batches whose gradients are summed before one optimiser step, so one step
            covers ``mini_batch_size × gradient_accumulation_steps`` samples (the paper's GSM8K run: 2 × 16 = 32).
        last_minibatch: a batch that ``mini_batch_size × gradient_accumulation_steps`` does not divide: ``"whole"``
            refuses it (every optimiser step whole, as TRL and CleanRL require); ``"merge"`` lets each epoch's last
            optimiser step take the samples left over, and a step's last mini-batch the rows left over in it (as
            tianshou's ``Batch.split(..., merge_last=True)``), so that no step or mini-batch is smaller than asked; a
            batch smaller than one step is one step. For batches whose size varies (a game's moves).
        loss_reduction: how the per-token losses (policy and value alike) of one optimiser step are averaged.
            ``"minibatch_token_mean"`` (the paper's code and TRL): a token mean per mini-batch, and the mean of those
            over the step's mini-batches; with accumulation a token of a short mini-batch then weighs more than one of
            a long mini-batch (for GSM8K's 2 × 16, up to 25× between a short and a long mini-batch).
            ``"step_token_mean"``: every response token of the step weighs the same, as if the step were one
            mini-batch (each mini-batch's token sum over the step's token count).
    """

    ppo_epochs: int = 4
    mini_batch_size: int = 256
    gradient_accumulation_steps: int = 1
    last_minibatch: Literal["whole", "merge"] = "whole"
    loss_reduction: Literal["minibatch_token_mean", "step_token_mean"] = "minibatch_token_mean"

    def __post_init__(self) -> None:
        positive("ppo.batching", self, "mini_batch_size", "gradient_accumulation_steps", "ppo_epochs")
        choice("ppo.batching", self, "loss_reduction", ("minibatch_token_mean", "step_token_mean"))
        choice("ppo.batching", self, "last_minibatch", ("whole", "merge"))

    @property
    def backward_batch_size(self) -> int:
        """Samples per optimiser step."""
        return self.mini_batch_size * self.gradient_accumulation_steps

    def check_batch_size(self, batch_size: int) -> None:
        """A batch must split into whole optimiser steps (unless ``last_minibatch`` is ``"merge"``)."""
        if self.last_minibatch == "whole" and batch_size % self.backward_batch_size:
            raise ValueError(
                f"batch size {batch_size} is not divisible by ppo.batching.mini_batch_size × "
                f"ppo.batching.gradient_accumulation_steps = {self.mini_batch_size} × "
                f"{self.gradient_accumulation_steps} = {self.backward_batch_size} (or set "
                "ppo.batching.last_minibatch: merge, which merges the samples left over into the last step)"
            )


@dataclass
class KLConfig:
    """The KL to the reference in the reward, and its coefficient η (the ``ppo.kl`` section).

    Attributes:
        kl_penalty: per-token KL in the reward: ``"k1"`` = log π(a) − log π_0(a) of the sampled token (unbiased,
            one gather), ``"full"`` = exact KL over the whole vocabulary (lower variance, same forward passes).
        kl_control: ``"adaptive"`` (Ziegler et al. proportional controller) or ``"fixed"``.
        init_kl_coef: η at the start.
        target_kl: KL (summed over a response) the adaptive controller steers to.
        kl_horizon: the adaptive controller's horizon in samples.
    """

    kl_penalty: Literal["k1", "full"] = "k1"
    kl_control: Literal["adaptive", "fixed"] = "adaptive"
    init_kl_coef: float = 0.3
    target_kl: float = 6.0
    kl_horizon: int = 10_000

    def __post_init__(self) -> None:
        non_negative("ppo.kl", self, "init_kl_coef")
        choice("ppo.kl", self, "kl_penalty", ("k1", "full"))
        choice("ppo.kl", self, "kl_control", ("adaptive", "fixed"))
        if self.kl_control == "adaptive":
            positive("ppo.kl", self, "target_kl", "kl_horizon")


@dataclass
class ComputeConfig:
    """How the update is computed (the ``ppo.compute`` section).

    **The cost of the update, not its maths** (each the same update up to float rounding, and on by default): every
    setting but ``autocast_dtype``, which is **mixed precision** (changes the maths, off by default).

    Attributes:
        forward_batch_size: rows per forward pass when scoring a rollout (None: the whole batch at once).
        micro_batch_size: rows per forward/backward pass of a mini-batch. The mini-batch's rows are sorted by length
            and cut into micro-batches, each without the padding its rows do not need; each pass's loss is weighted
            by its share of the mini-batch's tokens (or responses), so the gradient is the whole mini-batch's up to the
            order of float sums, with the activations of ``micro_batch_size`` rows alive instead of
            ``ppo.batching.mini_batch_size``, and fewer padded tokens computed (also when a mini-batch is no larger
            than a pass: a learner's merged turns or game moves are padded to its longest, and each pass drops what its
            rows do not need). ``"auto"`` (default): passes of :data:`AUTO_MICRO_BATCH_SIZE` rows for a whole model,
            the whole mini-batch in one pass with ``model.fsdp`` (which needs every rank in every pass). None:
            the whole mini-batch in one pass, untrimmed (the path before micro-batches, kept for runs that must
            reproduce earlier figures bit for bit). An int: passes of that many rows (not with ``model.fsdp``).
        fused_kernels: compute with torch's fused kernels where they change only the rounding: GPT-2's
            ``gelu_new`` (and transformers' other composite tanh-approximated GELUs) as ``F.gelu(x,
            approximate="tanh")`` in the policy and its reference, one pass instead of eight
            (:func:`~marllm.models.activations.fuse_tanh_gelus`), and Adam as ``fused=True``, one kernel per
            parameter instead of six (not with ``model.fsdp``). The same functions, rounded differently in the last
            float bits. On by default; false reproduces earlier figures bit for bit.
        rollout_from_generate: take the rollout's log-probs and values (π_old and V_old) from ``generate``'s own
            forwards, which computed every response token's logits and the hidden state the LM head read while
            sampling it, instead of a second forward of the policy over prompt and response. The same numbers up to
            float rounding (the KV cache splits the sums differently: within ~1e-6 on the logits of a float32 GPT-2),
            for one policy forward fewer per rollout; the batch's logits are then alive at once, whatever
            ``forward_batch_size``. ``"auto"`` (default): on for a whole model, off with ``model.fsdp`` (an FSDP
            ``generate`` keeps stepping ranks that are done); true is refused with ``model.fsdp``; false reproduces
            earlier figures bit for bit.
        gradient_checkpointing: recompute the policy's transformer layers in the backward (transformers' own
            checkpointing, non-reentrant) instead of keeping their activations: an update pass keeps each layer's
            input alive rather than all of its activations, for about one more forward of the policy per pass. The same
            gradients: a test finds the weights after an update bit-identical on the CPU. Generation and the rollout's
            forwards (no gradients) are unchanged, and so is a pass that runs on a shared prompt prefix's key/value
            cache (it keeps its activations). Off by default (it costs time); refused for a model class without
            transformers' ``supports_gradient_checkpointing`` and with ``model.fsdp``.
        logits_chunk_rows: apply the LM head to an update pass's hidden states this many rows at a time, each chunk's
            logits recomputed in the backward (:mod:`marllm.models.chunked_head`), instead of projecting the whole
            pass onto the vocabulary at once: the update's vocabulary-wide memory falls from (pass rows × response
            tokens × vocabulary) to this many rows' worth, for one more LM-head product per chunk. With a 151,936-token
            vocabulary that is most of an update's transient memory. The same log-probs up to the rounding of a matrix
            product over fewer rows. None (default): the whole pass at once. Refused with ``model.fsdp``, and for a
            model that changes its logits after its head (soft-capping, scaling).
        autocast_dtype: ``"bfloat16"`` computes the policy's and the reference's forwards (generation, rollout and
            update; the backward follows the forward's dtypes) under ``torch.autocast`` in bfloat16: matrix products
            in bfloat16 with float32 accumulation, while the weights, gradients and Adam's state stay in
            ``model.dtype``, and log-probs, KL and losses are computed in float32 from the bfloat16 logits. Mixed
            precision, not a rounding detail: the logits carry bfloat16's ~3 significant digits, and the first PPO
            ratio of an update is 1 only up to that noise. Faster where the hardware multiplies bfloat16 faster
            (GPUs, and CPUs with AVX-512 BF16 or AMX). None (default): everything in ``model.dtype``. Not with
            ``model.fsdp``, whose ``model.fsdp_compute_dtype`` does this for FSDP models.
    """

    forward_batch_size: int | None = None
    micro_batch_size: int | Literal["auto"] | None = "auto"
    fused_kernels: bool = True
    rollout_from_generate: bool | Literal["auto"] = "auto"
    gradient_checkpointing: bool = False
    logits_chunk_rows: int | None = None
    # Mixed precision (changes the maths):
    autocast_dtype: Literal["bfloat16"] | None = None

    def __post_init__(self) -> None:
        if self.autocast_dtype is not None and self.autocast_dtype != "bfloat16":
            raise ValueError(
                f"ppo.compute.autocast_dtype must be 'bfloat16' or null, got {self.autocast_dtype!r} (float16 would "
                "need loss scaling, which marllm does not do)"
            )
        for name in ("forward_batch_size", "logits_chunk_rows"):
            if getattr(self, name) is not None:
                positive("ppo.compute", self, name)
        if self.micro_batch_size not in ("auto", None):
            positive("ppo.compute", self, "micro_batch_size")
        if not isinstance(self.gradient_checkpointing, bool):
            raise ValueError(
                f"ppo.compute.gradient_checkpointing must be true or false, got {self.gradient_checkpointing!r}"
            )
        if self.rollout_from_generate != "auto" and not isinstance(self.rollout_from_generate, bool):
            raise ValueError(
                f"ppo.compute.rollout_from_generate must be true, false or 'auto', got {self.rollout_from_generate!r}"
            )

    def settled(self, placement: Placement | type[Placement]) -> ComputeConfig:
        """These settings with ``micro_batch_size`` and ``rollout_from_generate`` concrete: ``"auto"`` resolved by
        ``placement`` (:meth:`~marllm.parallel.placement.Placement.rows_per_pass`,
        :meth:`~marllm.parallel.placement.Placement.rollout_from_generate`), once, when a learner is built."""
        return dataclasses.replace(
            self,
            micro_batch_size=placement.rows_per_pass(self.micro_batch_size, AUTO_MICRO_BATCH_SIZE),
            rollout_from_generate=placement.rollout_from_generate(self.rollout_from_generate),
        )

    def whole_model_settings(self) -> list[str]:
        """The settings made here that need whole models on each process (``model.fsdp`` shards them), each with
        why."""
        reasons = []
        if isinstance(self.micro_batch_size, int):
            reasons.append(
                "ppo.compute.micro_batch_size splits a mini-batch into passes of its own, and model.fsdp needs every "
                "rank in every pass"
            )
        if self.autocast_dtype is not None:
            reasons.append(
                "ppo.compute.autocast_dtype is mixed precision for whole models; FSDP models compute in "
                "model.fsdp_compute_dtype instead"
            )
        if self.logits_chunk_rows is not None:
            reasons.append(
                "ppo.compute.logits_chunk_rows applies the LM head outside the model, which model.fsdp shards"
            )
        if self.gradient_checkpointing:
            reasons.append("ppo.compute.gradient_checkpointing is not wired into model.fsdp's layers")
        if self.rollout_from_generate is True:
            reasons.append(
                "ppo.compute.rollout_from_generate takes one logit per sampled token from generate, and an FSDP "
                "generate keeps stepping ranks that are done"
            )
        return reasons


@dataclass
class GuardsConfig:
    """What an update does when the policy blows up (the ``ppo.guards`` section).

    Attributes:
        ratio_threshold: skip a mini-batch (no gradient from it) whose mean probability ratio π/π_old over its
            response tokens exceeds this, as TRL does (its default, 10, is kept: the paper's code ran on TRL). The
            ratio starts at 1 in each batch, so this only fires when the policy has blown up. None: never skip.
        on_nonfinite: what a NaN/inf loss or gradient norm does. ``"raise"``: the update stops with
            ``NonFiniteLossError`` (the run fails; its last checkpoint stays). ``"skip"``: the optimiser step it
            belongs to is not applied and the rest of this learner's update for this batch is abandoned; optimiser
            steps already applied earlier in the same update (earlier mini-batch steps or epochs, all on finite
            losses) stay, while the KL controller and the running score statistics are left as they were before the
            update. The learner's metrics then carry ``nonfinite_skipped = 1``.
        max_consecutive_skips: with ``on_nonfinite: skip``, how many updates in a row one learner may skip in a
            training run (:func:`marllm.run.train.train`); the next skip stops the run with an error. No checkpoint is
            written while skips follow one another, so the last one is from before the first skip.
    """

    ratio_threshold: float | None = 10.0
    on_nonfinite: Literal["raise", "skip"] = "raise"
    max_consecutive_skips: int = 3

    def __post_init__(self) -> None:
        choice("ppo.guards", self, "on_nonfinite", ("raise", "skip"))
        if isinstance(self.max_consecutive_skips, bool) or not (
            isinstance(self.max_consecutive_skips, int) and self.max_consecutive_skips >= 0
        ):
            raise ValueError(
                f"ppo.guards.max_consecutive_skips must be an integer >= 0, got {self.max_consecutive_skips!r}"
            )
        if self.ratio_threshold is not None and not (self.ratio_threshold > 1 and math.isfinite(self.ratio_threshold)):
            raise ValueError(
                f"ppo.guards.ratio_threshold must be a number > 1 or null (the mean ratio is 1 before an update), got "
                f"{self.ratio_threshold}"
            )
