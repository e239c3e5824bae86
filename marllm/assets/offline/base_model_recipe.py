"""The recipe of the offline base model: its tokenizer, GPT-2 shape and pretraining schedule, checked on creation.

:func:`marllm.assets.offline.base_model.train_base_model` builds the model from it; the defaults and why they were
chosen are described in :mod:`marllm.assets.offline.base_model`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BaseModelRecipe"]


@dataclass(frozen=True)
class BaseModelRecipe:
    """Tokenizer, architecture and pretraining schedule of the base model.

    Args:
        vocab_size: BPE vocabulary size including ``<|endoftext|>``. Smaller is faster on CPU (the LM head and
            softmax dominate at this model size) at the price of more tokens per word.
        min_frequency: a pair must occur this often to be merged.
        split_digits: keep every digit its own token (no merge ever joins a digit to anything), so that every
            number is spelled digit by digit as in LLaMA's tokenizer; a BPE trained on reviews otherwise cuts
            numbers into arbitrary pieces (" 45" one way, " 46" another), which the arithmetic cannot be learnt
            through.
        n_layer, n_embd, n_head, n_positions: GPT-2 shape; ``n_positions`` is the context length.
        block_size: tokens per training block (at most ``n_positions``).
        batch_size: blocks per optimiser step.
        max_steps: optimiser steps; tokens seen = ``max_steps * batch_size * block_size``.
        learning_rate: peak AdamW learning rate, reached after ``warmup_steps`` and decayed by a cosine to
            ``learning_rate * min_lr_ratio``.
        weight_decay: AdamW decay on matrices (not on biases, LayerNorms or position embeddings).
        grad_clip: global gradient-norm clip.
        arithmetic_fraction: target share of the pretraining tokens taken by worked arithmetic problems
            (``marllm.assets.offline.arithmetic_problems.pretraining_documents``), so a later math task has a start.
        arithmetic_seed: seed of those problems; math tasks should draw their train/eval problems from other seeds.
        seed: seed of initialisation, document shuffling, block order and samples.
        eval_max_tokens: held-out reviews scored for perplexity (the first ones, up to this many tokens).
        sample_new_tokens: length of the sampled continuations reported after training.
    """

    vocab_size: int = 4096
    min_frequency: int = 2
    split_digits: bool = True
    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 4
    n_positions: int = 512
    block_size: int = 512
    batch_size: int = 4
    max_steps: int = 2000
    learning_rate: float = 4e-3
    warmup_steps: int = 40
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    arithmetic_fraction: float = 0.4
    arithmetic_seed: int = 7919
    seed: int = 0
    eval_max_tokens: int = 60_000
    sample_new_tokens: int = 24

    def __post_init__(self) -> None:
        positive = ("vocab_size", "n_layer", "n_embd", "n_head", "n_positions", "block_size", "batch_size",
                    "max_steps", "eval_max_tokens", "sample_new_tokens", "min_frequency")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"BaseModelRecipe.{name} must be a positive int, got {value!r}")
        if not isinstance(self.split_digits, bool):
            raise ValueError(f"BaseModelRecipe.split_digits must be a bool, got {self.split_digits!r}")
        if self.vocab_size < 257:
            raise ValueError(
                f"BaseModelRecipe.vocab_size must be at least 257 (256 bytes + eos), got {self.vocab_size}"
            )
        if self.n_embd % self.n_head:
            raise ValueError(f"BaseModelRecipe.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.block_size > self.n_positions:
            raise ValueError(
                f"BaseModelRecipe.block_size ({self.block_size}) must not exceed n_positions ({self.n_positions})"
            )
        if not 0.0 <= self.arithmetic_fraction < 1.0:
            raise ValueError(f"BaseModelRecipe.arithmetic_fraction must be in [0, 1), got {self.arithmetic_fraction}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"BaseModelRecipe.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.learning_rate <= 0 or self.warmup_steps < 0:
            raise ValueError("BaseModelRecipe.learning_rate must be > 0 and warmup_steps >= 0")
