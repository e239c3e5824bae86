"""PPOLearner: one agent's token-level PPO with a KL penalty to a frozen reference.

tianshou's PPO policies treat one transition as one action with one reward; an LLM response is a sequence of token
actions with a per-token KL-penalised reward over a padded batch, so the loss is written here, as small functions in
:mod:`marllm.algorithms.core`. tianshou still serves the running score statistics and the rollout container
(:class:`tianshou.data.Batch`). As in tianshou's policies, an update is split in two: :meth:`PPOLearner._preprocess`
computes, without gradients, everything its epochs need from a rollout (scores, token rewards, advantages, returns),
and :mod:`marllm.algorithms.ppo_steps` runs the epochs on that. Acting is in :mod:`marllm.algorithms.rollout`,
saving and restoring in :mod:`marllm.algorithms.learner_checkpoint`.
"""

from __future__ import annotations

import copy
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tianshou.data import Batch
from tianshou.utils.statistics import RunningMeanStd
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from marllm.algorithms.core import (
    clipped_policy_loss,
    clipped_value_loss,
    explained_variance,
    floor_logprobs,
    gae,
    logprobs_and_entropy,
    masked_mean,
    masked_whiten,
    token_rewards,
)
from marllm.algorithms.kl_controller import KLController, kl_controller_from
from marllm.algorithms.learner_arguments import check_actions, check_full_precision, check_learner_arguments
from marllm.algorithms.learner_checkpoint import LearnerCheckpoint
from marllm.algorithms.ppo_config import GenerationConfig, PPOConfig
from marllm.algorithms.ppo_steps import NonFiniteLossError, PPOSteps
from marllm.algorithms.ppo_update import UpdateBatch, UpdateStats, transform_scores
from marllm.algorithms.registry import AlgorithmOptions, register_learner
from marllm.algorithms.rollout import Rollout, RolloutCollector, merge_rollouts
from marllm.models.activations import fuse_tanh_gelus, recompute_activations_in_backward
from marllm.models.devices import autocast_for
from marllm.models.generation import check_chat_template, logprob_logits
from marllm.models.lora import adapter_parameters
from marllm.models.move_tries import restrict_logits
from marllm.models.policy import ValueHead, context_length, ready_for_generation, response_forward
from marllm.parallel.distributed import DataParallel
from marllm.parallel.sharding import compute_dtype_of, is_sharded, shard_module

__all__ = ["LEARNER_ACTIONS", "NonFiniteLossError", "PPOLearner", "Rollout"]

LEARNER_ACTIONS = ("generate", "constrained")
"""How a token-level learner's answers are sampled (``game.actions``' token-level modes)."""


class PPOLearner(RolloutCollector, LearnerCheckpoint, PPOSteps):
    """An independent PPO learner: it generates for its agent, keeps its rollout, and updates its own policy.

    Args:
        name: the learner id (metric prefix).
        model: the trainable causal LM (``AutoModelForCausalLM``), or the peft model that carries ``adapter``.
        tokenizer: its tokenizer (left padding is set here).
        reference: the frozen π_0, possibly shared with other learners; None when ``adapter`` is set (the reference is
            then the shared base with adapters disabled).
        config: PPO hyperparameters (None: :class:`PPOConfig`'s defaults).
        generation: sampling settings (None: :class:`GenerationConfig`'s defaults).
        seed: seeds the response-length sampler and the mini-batch shuffling.
        adapter: the LoRA adapter of ``model`` (a peft model shared by several learners) that this learner trains;
            None trains all of ``model``'s trainable parameters.
        kl_controller: the KL coefficient controller, any object with a ``value`` (η, read at the start of each
            batch's update and restored from checkpoints) and ``update(kl, n_steps)`` (called after each completed
            batch); see :class:`~marllm.algorithms.kl_controller.KLController`. The learner owns it and changes its
            state: give each learner its own. None builds it from ``config`` (``kl_control``, ``init_kl_coef``,
            ``target_kl``, ``kl_horizon``), which is then not read for the KL coefficient.
        data_parallel: this process's rank of a data-parallel run (:mod:`marllm.parallel.distributed`), whose
            rollouts hold its slice of each batch; None for one process. Starting from rank 0's parameters, it
            computes over the global batch what PPO computes over a batch. Every rank must be given the same ``seed``.
        actions: how an answer is sampled: ``"generate"`` (free text) or ``"constrained"`` (a game's legal move,
            token by token restricted to continuations of the names in ``observation["legal_moves"]``, then EOS).
            Constrained answers keep the restriction of every token (``allowed``), and every forward that computes
            log-probs re-applies it, so the log-probs, ratio, entropy and KL are those of the distribution sampled.

    Everything after ``name`` is keyword-only. Subclasses change the algorithm through :meth:`_advantages` (what the
    update trains towards) and :meth:`_objective` (the loss of a mini-batch); ``uses_critic = False`` drops the
    value head.
    """

    uses_critic: bool = True
    supported_actions: tuple[str, ...] = LEARNER_ACTIONS
    """The ``actions`` this class plays (an action-level subclass plays ``score``)."""

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
        data_parallel: DataParallel | None = None,
        actions: str = "generate",
    ):
        self.name = name
        self.model = model
        self.actions = actions
        if config is not None and config.fused_kernels:
            for network in (model, reference):
                if network is not None:
                    fuse_tanh_gelus(network)
        recompute_activations_in_backward(model)  # bit-identical, with a fraction of the activations' memory
        self.tokenizer = ready_for_generation(tokenizer, f"learner {name}")
        self.sharded = is_sharded(model)
        check_learner_arguments(
            name,
            reference=reference,
            adapter=adapter,
            kl_controller=kl_controller,
            sharded=self.sharded,
            data_parallel=data_parallel,
        )
        self.reference = reference
        self.adapter = adapter
        self.config = config or PPOConfig()
        whole_model_only = self.config.whole_model_settings() if self.sharded else []
        if whole_model_only:
            raise ValueError(
                f"learner {name!r}: {'; '.join(whole_model_only)}: leave these at their defaults for a sharded model"
            )
        self.generation = generation or GenerationConfig()
        check_chat_template(self.tokenizer, self.generation.chat_template, f"learner {name!r}")
        check_actions(self, name, actions, self.tokenizer, self.generation)
        self.device = next(model.parameters()).device
        self.value_head = ValueHead(model.config.hidden_size).to(self.device) if self.uses_critic else None
        if self.sharded and self.value_head is not None:
            # Sharded like the policy, so that every trained parameter is a DTensor whose gradient FSDP reduces.
            shard_module(self.value_head, data_parallel, compute_dtype_of(model))
        # Dropout stays off in rollout and update alike, so the first PPO ratio of a batch is exactly 1.
        self.model.eval()
        if adapter is not None:
            trainable = adapter_parameters(model, adapter)
        else:
            trainable = [p for p in model.parameters() if p.requires_grad]
        check_full_precision(name, trainable, adapter)
        self.optimizer = torch.optim.Adam(
            trainable + (list(self.value_head.parameters()) if self.value_head is not None else []),
            lr=self.config.learning_rate,
            eps=self.config.adam_eps,
            fused=True if self.config.fused_kernels and not self.sharded else None,
        )
        self.kl_controller = kl_controller if kl_controller is not None else kl_controller_from(self.config)
        self.data_parallel = data_parallel
        if data_parallel is not None and not self.sharded:  # shard_module started sharded ones from rank 0's
            data_parallel.broadcast_(self._trained_parameters())
        self.score_statistics = RunningMeanStd(mean=0.0, std=1.0, clip_max=None)
        self.context_length = context_length(model)
        self._rng = np.random.default_rng(seed)
        self.rollouts: list[Rollout] = []
        self.num_updates = 0

    # ----------------------------------------------------------------------------------------------- learning
    def update(self) -> dict[str, float]:
        """Run PPO on every rewarded rollout, merged into one batch (:func:`merge_rollouts`), then forget them.
        Returns this learner's metrics (unprefixed): batch means over all of its responses of the iteration.

        With ``ppo.on_nonfinite: skip`` a non-finite loss or gradient norm abandons the rest of the update (see
        :class:`PPOConfig`): the metrics then hold ``nonfinite_skipped = 1`` and :attr:`last_nonfinite` says why.
        """
        if not self.rollouts:
            raise RuntimeError(f"learner {self.name!r}: update() called with no rollout (act() was never called)")
        unfinished = [i for i, r in enumerate(self.rollouts) if not r.finished]
        if unfinished:
            raise RuntimeError(f"learner {self.name!r}: rollout(s) {unfinished} never got their reward (finish())")
        self.last_nonfinite: str | None = None
        # A learner's turns of the iteration are one update: each epoch shuffles all of its samples, and whitening,
        # the score statistics and the KL controller take one step per iteration, however many turns it played.
        rollout = merge_rollouts(self.rollouts, self.tokenizer.pad_token_id)
        self.config.check_batch_size(len(rollout.responses) * self._world_size)
        metrics = self._update_with(rollout).as_dict()
        self.rollouts = []
        self.num_updates += 1
        return metrics if self.data_parallel is None else self.data_parallel.mean_metrics(metrics)

    @property
    def _world_size(self) -> int:
        return 1 if self.data_parallel is None else self.data_parallel.world_size

    def _all_reduce(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        return None if self.data_parallel is None else self.data_parallel.all_reduce_sum  # batch statistics' sum

    def _trained_parameters(self) -> list[torch.nn.Parameter]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _update_with(self, rollout: Rollout) -> UpdateStats:
        started = time.perf_counter()
        self.activate()
        cfg = self.config
        score_statistics = copy.deepcopy(self.score_statistics)  # put back if a step is not finite
        data = self._preprocess(rollout)
        losses: dict[str, list[float]] = defaultdict(list)
        nonfinite: str | None = None
        try:
            self._ppo_steps(data, losses)
        except NonFiniteLossError as error:
            if cfg.on_nonfinite == "raise":
                raise
            # The step was not applied and the rest of the update is abandoned; steps already applied stay.
            nonfinite = str(error)
            self.score_statistics = score_statistics
        self.last_nonfinite = nonfinite

        b = data.batch
        mask = b.mask
        kl_full_sum = (b.kl_full * mask).sum(1).mean().item()
        kl_penalty_sum = b.kl.sum(1).mean().item()
        if nonfinite is None:
            # Ziegler et al.'s controller is fed the KL that the penalty actually uses, per sample of the batch (the
            # global batch: every rank's controller takes the same step).
            controlled = self._controlled_kl(b)
            kl_batch = controlled if self.data_parallel is None else self.data_parallel.mean(controlled)
            self.kl_controller.update(kl_batch, len(data) * self._world_size)
        return UpdateStats(
            task_reward=float(np.mean(rollout.task_rewards)),
            received_reward=float(np.mean(rollout.received_rewards)),
            score=float(np.mean(data.scores)),
            kl=kl_full_sum,
            kl_penalty=kl_penalty_sum,
            kl_coef=data.kl_coef,
            response_length=mask.sum(1).mean().item(),
            advantage_stats=self._advantage_stats(b),
            generation_s=rollout.timings["generation_s"],
            forward_s=rollout.timings["forward_s"],
            update_s=time.perf_counter() - started,
            losses={key: float(np.mean(values)) for key, values in losses.items()},
            nonfinite_skipped=nonfinite is not None if cfg.on_nonfinite == "skip" else None,
        )

    @torch.no_grad()
    def _preprocess(self, rollout: Rollout) -> UpdateBatch:
        """What the epochs train on, from a rewarded rollout: the transformed scores, η, and the rollout's tensors
        with the advantage hook's columns, in a new :class:`UpdateBatch` (``rollout.tensors`` is not written to).

        Updates the running score statistics (``ppo.score_transform``), as each batch's scores are part of them.
        """
        kl_coef = float(self.kl_controller.value)
        dp = self.data_parallel
        global_rows = None if dp is None else dp.global_rows(rollout.segment_sizes)
        scores = self._transform_scores(rollout.received_rewards, global_rows)
        score_tensor = torch.as_tensor(scores, dtype=torch.float32, device=self.device)
        columns = self._advantages(rollout.tensors, score_tensor, kl_coef)
        return UpdateBatch(Batch(rollout.tensors, **columns), scores, kl_coef, rollout.prompt_length, global_rows)

    def _transform_scores(self, scores: np.ndarray, global_rows: np.ndarray | None = None) -> np.ndarray:
        # The statistics take the global batch, in one process's order, so that every rank keeps the same.
        dp = self.data_parallel
        batch = scores if dp is None else dp.gather_rows(scores, global_rows)
        cfg = self.config
        return transform_scores(scores, batch, self.score_statistics, cfg.score_transform, cfg.score_clip)

    def _advantages(self, b: Batch, scores: torch.Tensor, kl_coef: float) -> dict[str, torch.Tensor]:
        """The columns the update adds to the rollout's tensors ``b`` (which it does not change): ``advantages`` and
        ``returns`` (B, L), and whatever else the algorithm keeps, from the (transformed) scores (B,) and η.

        PPO: token ``rewards`` (the score at the last response token, −η·KL at every token), GAE against the value
        head (Schulman et al., 2016) and, if ``whiten_advantages``, whitening over the batch's response tokens.
        """
        cfg = self.config
        rewards = token_rewards(scores, b.kl, b.mask, kl_coef)
        advantages, returns = gae(rewards, b.values, b.mask, cfg.gamma, cfg.lam)
        if cfg.whiten_advantages:
            advantages = masked_whiten(advantages, b.mask, all_reduce=self._all_reduce())
        return {"rewards": rewards, "advantages": advantages, "returns": returns}

    def _controlled_kl(self, b: Batch) -> float:
        """The batch's mean summed KL that the penalty uses, which the KL controller steers: the reward's."""
        return b.kl.sum(1).mean().item()

    def _advantage_stats(self, b: Batch) -> dict[str, float]:
        return {
            "returns/mean": masked_mean(b.returns, b.mask).item(),
            "values/mean": masked_mean(b.values, b.mask).item(),
            "explained_variance": explained_variance(b.values, b.returns, b.mask),
        }

    def _loss(self, mb: Batch, prompt_length: int) -> tuple[torch.Tensor, dict[str, float]]:
        with autocast_for(self.model, self.config.autocast_dtype):  # the forward only: the backward follows its dtypes
            logits, values = response_forward(
                self.model, mb.input_ids, mb.attention_mask, prompt_length, self.value_head
            )
        if "allowed" in mb:  # constrained answers: the restriction they were sampled under, re-applied
            logits = restrict_logits(logits, mb.allowed, inplace=True)
        # The LM head's backward does not read its output: the gradient can take the logits' place.
        sequences = (mb.input_ids, mb.attention_mask, prompt_length)
        logits = logprob_logits(logits, *sequences, self.generation, self.tokenizer.eos_token_id, overwrite_logits=True)
        # One pass over the logits for both. Nothing but the log-probs' backward reads the logits after this, so it
        # writes their gradient over them: one (b, L, V) buffer for the forward and the backward.
        logprobs, token_entropy = logprobs_and_entropy(logits, mb.response, overwrite_logits=True)
        del logits
        # With logprobs_from="sampling" a token the updated policy's top-k/top-p no longer keeps has log-prob −inf.
        logprobs = floor_logprobs(logprobs)
        loss, parts = self._objective(mb, logprobs, values)
        with torch.no_grad():
            parts["entropy"] = masked_mean(token_entropy, mb.mask).item()
            parts["ratio"] = masked_mean(torch.exp(logprobs - mb.logprobs), mb.mask).item()
        return loss, parts

    def _objective(
        self, mb: Batch, logprobs: torch.Tensor, values: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """PPO's loss of a mini-batch: the clipped surrogate plus ``vf_coef`` × the clipped value loss."""
        cfg = self.config
        pg_loss, clipfrac, approx_kl = clipped_policy_loss(
            logprobs, mb.logprobs, mb.advantages, mb.mask, cfg.clip_range
        )
        assert values is not None  # uses_critic
        v_loss, v_clipfrac = clipped_value_loss(values.float(), mb.values, mb.returns, mb.mask, cfg.clip_range_value)
        loss = pg_loss + cfg.vf_coef * v_loss
        parts = {
            "loss/policy": pg_loss.item(),
            "loss/value": v_loss.item(),
            "loss/total": loss.item(),
            "clipfrac": clipfrac.item(),
            "value_clipfrac": v_clipfrac.item(),
            "approx_kl": approx_kl.item(),
        }
        return loss, parts


@register_learner("ppo")
def _ppo_learner(learner_id: str, algorithm: str, options: AlgorithmOptions, **learner_kwargs: Any) -> PPOLearner:
    return PPOLearner(learner_id, actions=options.actions, **learner_kwargs)
