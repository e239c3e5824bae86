"""The pretraining loop of the offline base model: AdamW with linear warmup and cosine decay over packed blocks.

:func:`pretrain` runs ``recipe.max_steps`` optimiser steps on mini-batches of token blocks, shuffled epoch by epoch,
with gradient clipping and weight decay on matrices only, on a fixed number of intra-op threads
(:data:`PRETRAINING_THREADS`): a float sum split over another number of threads rounds differently, so a count taken
from the machine's cores, or picked by timing as contention changes, would make the base's bytes depend on the machine
and its load.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import GPT2LMHeadModel

from marllm.assets.offline.base_model_recipe import BaseModelRecipe

__all__ = ["PRETRAINING_THREADS", "pretrain", "pretraining_threads"]

PRETRAINING_THREADS = 2
"""torch's intra-op threads while the offline assets are built: always this many, so that their weights are the same
bytes on every machine with the same CPU instruction set, whatever its core count or load. Two, not one: on the 2-core
machines the recipe is sized for, 2.0–2.5 steps a second against 1.5 on one thread (about 15 minutes instead of 22);
beside a busy process it is slower, never different."""


def _decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        # matrices decay; biases, LayerNorm gains and the position table do not
        (decay if param.ndim >= 2 and "wpe" not in name else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


@contextlib.contextmanager
def pretraining_threads() -> Iterator[None]:
    """Run the body on :data:`PRETRAINING_THREADS` intra-op threads, torch's setting restored after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(PRETRAINING_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def pretrain(model: GPT2LMHeadModel, blocks: torch.Tensor, recipe: BaseModelRecipe, progress: bool = True,
             on_step: Callable[[int, float], None] | None = None) -> dict[str, Any]:
    """Train ``model`` for ``recipe.max_steps`` AdamW steps on mini-batches of ``blocks`` (epoch-wise shuffled).

    Runs on :data:`PRETRAINING_THREADS` intra-op threads (torch's setting restored after). Returns the losses (first,
    last-10 mean), tokens seen, wall time and tokens per second.
    """
    optimizer = torch.optim.AdamW(
        _decay_groups(model, recipe.weight_decay), lr=recipe.learning_rate, betas=(0.9, 0.95), eps=1e-8
    )
    # here: transformers' schedules import peft, which a run that neither pretrains nor trains LoRA never needs
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    schedule = get_cosine_with_min_lr_schedule_with_warmup(
        optimizer, recipe.warmup_steps, recipe.max_steps, min_lr_rate=recipe.min_lr_ratio
    )
    generator = torch.Generator().manual_seed(recipe.seed)
    order = torch.randperm(len(blocks), generator=generator)
    cursor = 0
    losses: list[float] = []
    model.train()
    start = time.perf_counter()
    bar = tqdm(range(recipe.max_steps), desc="pretraining", unit="step", disable=not progress, leave=False)
    with pretraining_threads():
        for step in bar:
            if cursor + recipe.batch_size > len(order):
                order, cursor = torch.randperm(len(blocks), generator=generator), 0
            batch = blocks[order[cursor : cursor + min(recipe.batch_size, len(order))]]  # (B, T)
            cursor += recipe.batch_size
            losses.append(_train_step(model, batch, optimizer, schedule, recipe.grad_clip))
            if not math.isfinite(losses[-1]):
                raise FloatingPointError(f"pretraining loss became {losses[-1]} at step {step}; lower learning_rate")
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            if on_step is not None:
                on_step(step, losses[-1])
    wall = time.perf_counter() - start
    model.eval()
    tokens = recipe.max_steps * recipe.batch_size * blocks.shape[1]
    return {
        "first_loss": losses[0],
        "final_loss": float(np.mean(losses[-10:])),
        "tokens_seen": tokens,
        "train_wall_s": wall,
        "tokens_per_s": tokens / wall,
        "threads": PRETRAINING_THREADS,
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
