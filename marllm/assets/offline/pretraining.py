"""The pretraining loop of the offline base model: AdamW with linear warmup and cosine decay over packed blocks.

:func:`pretrain` runs ``recipe.max_steps`` optimiser steps on mini-batches of token blocks, shuffled epoch by epoch,
with gradient clipping and weight decay on matrices only. On a small shared machine a :class:`ThreadTuner` picks,
stretch by stretch, the faster of one and several intra-op threads.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import GPT2LMHeadModel, get_cosine_with_min_lr_schedule_with_warmup

from marllm.assets.offline.base_model_recipe import BaseModelRecipe

__all__ = ["ThreadTuner", "available_cores", "pretrain"]


def _decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        # matrices decay; biases, LayerNorm gains and the position table do not
        (decay if param.ndim >= 2 and "wpe" not in name else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class ThreadTuner:
    """Runs each stretch of ``period`` steps with the faster of 1 and ``max_threads`` intra-op threads.

    On a small shared machine, ``max_threads`` threads that busy-wait for a core another process holds can run
    several times slower than one thread, so each stretch opens with ``trial_steps`` timed steps per setting
    and keeps the faster for the rest of it. The very first step (allocation, warm-up) is not timed.
    """

    def __init__(self, max_threads: int, period: int = 40, trial_steps: int = 2) -> None:
        self.options = sorted({1, max(1, max_threads)}, reverse=True)
        self.period, self.trial_steps = period, trial_steps
        self.chosen = self.options[0]
        self._times: dict[int, list[float]] = {}
        self.history: list[int] = []

    def threads_for(self, step: int) -> int:
        """The thread count to use for ``step`` (0-based)."""
        if step == 0 or len(self.options) == 1:
            return self.chosen
        phase = (step - 1) % self.period
        trial = phase // self.trial_steps
        if phase == 0:
            self._times = {}
        if trial < len(self.options):
            return self.options[trial]
        if phase == self.trial_steps * len(self.options):
            self.chosen = min(self._times, key=lambda option: sum(self._times[option]))
            self.history.append(self.chosen)
        return self.chosen

    def record(self, step: int, threads: int, seconds: float) -> None:
        """Report how long ``step`` took with ``threads`` threads."""
        if step > 0 and (step - 1) % self.period < self.trial_steps * len(self.options):
            self._times.setdefault(threads, []).append(seconds)


def pretrain(model: GPT2LMHeadModel, blocks: torch.Tensor, recipe: BaseModelRecipe, progress: bool = True,
             on_step: Callable[[int, float], None] | None = None, max_threads: int | None = None) -> dict[str, Any]:
    """Train ``model`` for ``recipe.max_steps`` AdamW steps on mini-batches of ``blocks`` (epoch-wise shuffled).

    ``max_threads`` (default: the cores this process may use) bounds torch's intra-op threads; a
    :class:`ThreadTuner` picks 1 or ``max_threads`` as contention changes, and torch's setting is restored after.
    Returns the losses (first, last-10 mean), tokens seen, wall time, tokens per second and thread choices.
    """
    optimizer = torch.optim.AdamW(
        _decay_groups(model, recipe.weight_decay), lr=recipe.learning_rate, betas=(0.9, 0.95), eps=1e-8
    )
    schedule = get_cosine_with_min_lr_schedule_with_warmup(
        optimizer, recipe.warmup_steps, recipe.max_steps, min_lr_rate=recipe.min_lr_ratio
    )
    generator = torch.Generator().manual_seed(recipe.seed)
    order = torch.randperm(len(blocks), generator=generator)
    cursor = 0
    losses: list[float] = []
    tuner = ThreadTuner(max_threads or available_cores())
    previous_threads = torch.get_num_threads()
    model.train()
    start = time.perf_counter()
    bar = tqdm(range(recipe.max_steps), desc="pretraining", unit="step", disable=not progress, leave=False)
    try:
        for step in bar:
            if cursor + recipe.batch_size > len(order):
                order, cursor = torch.randperm(len(blocks), generator=generator), 0
            batch = blocks[order[cursor : cursor + min(recipe.batch_size, len(order))]]  # (B, T)
            cursor += recipe.batch_size
            threads = tuner.threads_for(step)
            torch.set_num_threads(threads)
            step_start = time.perf_counter()
            losses.append(_train_step(model, batch, optimizer, schedule, recipe.grad_clip))
            tuner.record(step, threads, time.perf_counter() - step_start)
            if not math.isfinite(losses[-1]):
                raise FloatingPointError(f"pretraining loss became {losses[-1]} at step {step}; lower learning_rate")
            bar.set_postfix(loss=f"{losses[-1]:.3f}", threads=threads)
            if on_step is not None:
                on_step(step, losses[-1])
    finally:
        torch.set_num_threads(previous_threads)
    wall = time.perf_counter() - start
    model.eval()
    tokens = recipe.max_steps * recipe.batch_size * blocks.shape[1]
    return {
        "first_loss": losses[0],
        "final_loss": float(np.mean(losses[-10:])),
        "tokens_seen": tokens,
        "train_wall_s": wall,
        "tokens_per_s": tokens / wall,
        "thread_choices": tuner.history,
    }


def _train_step(model: GPT2LMHeadModel, batch: torch.Tensor, optimizer: torch.optim.Optimizer,
                schedule: torch.optim.lr_scheduler.LRScheduler, grad_clip: float) -> float:
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)
