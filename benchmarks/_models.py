"""Shared pieces of the benchmarks: a random GPT-2 saved like a hub model, random queries, a cheap reward, and the
sequential N-agent env (SharedReward + RolePermutation) the training loop runs on.

Random weights are enough here: the benchmarks measure time and memory, which depend on shapes, not on what the
model has learned. Nothing is downloaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pettingzoo import AECEnv
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from marllm.envs.text_env import env as text_env
from marllm.wrappers import RolePermutation, SharedReward

EOS = "<|endoftext|>"
UNK = "<unk>"
ROLE_NAMES = ("pioneer", "observer", "editor")
# CORY's observer prompt; each later role reads the role before it the same way.
FOLLOWER_TEMPLATE = 'I can make this sentence "{{query}} {{{previous}}}" more positive: {{query}}'
TEMPLATE_WORDS = ("I", "can", "make", "this", "sentence", "more", "positive", '"', ":")


def word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``w0 w1 …`` plus the template words: one token per word, ``vocab_size`` in all.

    Word-level keeps prompt lengths exact and needs no training; the benchmarks only care about token counts.
    """
    specials = [EOS, UNK]
    fillers = vocab_size - len(specials) - len(TEMPLATE_WORDS)
    if fillers < 1:
        raise ValueError(f"vocab_size must be > {len(specials) + len(TEMPLATE_WORDS)}, got {vocab_size}")
    words = [*specials, *TEMPLATE_WORDS, *(f"w{i}" for i in range(fillers))]
    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS, bos_token=EOS, pad_token=EOS, unk_token=UNK)


def random_gpt2(
    tokenizer: PreTrainedTokenizerBase, n_layer: int, n_embd: int, n_head: int, n_positions: int = 256, seed: int = 0
) -> GPT2LMHeadModel:
    """A randomly initialised GPT-2 (dropout off, as PPO runs it) sized for ``tokenizer``."""
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return GPT2LMHeadModel(config)


def save_random_model(
    directory: str | Path, vocab_size: int, n_layer: int, n_embd: int, n_head: int, n_positions: int = 256
) -> Path:
    """Write a random GPT-2 and its word-level tokenizer to ``directory`` (what ``make_learners`` loads)."""
    directory = Path(directory)
    tokenizer = word_tokenizer(vocab_size)
    random_gpt2(tokenizer, n_layer, n_embd, n_head, n_positions).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def parameter_count(model: torch.nn.Module) -> int:
    """All parameters of ``model``, trainable or not."""
    return sum(p.numel() for p in model.parameters())


def save_random_model_counted(
    directory: str | Path, vocab_size: int, n_layer: int, n_embd: int, n_head: int
) -> dict[str, Any]:
    """:func:`save_random_model`, then ``{"parameters": its parameter count}``, what a ``--save-model`` child prints."""
    from transformers import AutoModelForCausalLM

    save_random_model(directory, vocab_size, n_layer, n_embd, n_head)
    return {"parameters": parameter_count(AutoModelForCausalLM.from_pretrained(directory))}


def run_child(script: str | Path, what: list[str], options: dict[str, Any]) -> dict[str, Any]:
    """Run ``script`` with ``what`` (``--child …``, ``--save-model …``) and ``--option value`` pairs in a fresh
    interpreter; return the JSON it prints last.

    Linux carries ``ru_maxrss`` over from parent to child, across exec: a child's peak reads at least the parent's.
    So a memory benchmark's parent never holds a model (even the one written to disk is built in a child) and stays
    at the bare import footprint, which every child reaches on its own anyway. Options whose value is None are left
    out; ``True`` passes the flag alone (a switch), ``False`` leaves it out.
    """
    command = [sys.executable, str(script), *what]
    for name, value in options.items():
        flag = f"--{name.replace('_', '-')}"
        if value is True:  # a switch (store_true): the flag alone
            command.append(flag)
        elif value is not None and value is not False:
            command += [flag, str(value)]
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(what)} failed (exit {completed.returncode}):\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def random_queries(tokenizer: PreTrainedTokenizerBase, count: int, length: int, seed: int = 0) -> list[dict[str, str]]:
    """``count`` rows ``{"query": text}``, each the decoding of ``length`` random non-special token ids."""
    rng = np.random.default_rng(seed)
    special = set(tokenizer.all_special_ids)
    ordinary = np.array([i for i in range(len(tokenizer)) if i not in special])
    ids = rng.choice(ordinary, size=(count, length))
    texts = tokenizer.batch_decode(ids.tolist(), skip_special_tokens=True)
    return [{"query": text.strip()} for text in texts]


def distinct_word_reward(samples: list[dict[str, Any]], responses: list[str]) -> list[float]:
    """A cheap pure-Python task reward: the share of distinct words in each response."""
    rewards = []
    for text in responses:
        words = text.split()
        rewards.append(len(set(words)) / len(words) if words else 0.0)
    return rewards


def learner_ids(num_agents: int) -> list[str]:
    """``llm1 … llmN``: the learner ids (and agent names after ``RolePermutation``)."""
    return [f"llm{i + 1}" for i in range(num_agents)]


def chain_env(
    dataset: list[dict[str, str]], num_agents: int, batch_size: int, period: int = 5, shard: tuple[int, int] = (0, 1)
) -> AECEnv:
    """``num_agents`` roles speaking in turn (1: single-agent PPO; 2: CORY), agents renamed ``llm1 … llmN``.

    Two or more agents share the sum of the task rewards (``SharedReward``) and rotate roles every ``period``
    episodes (``RolePermutation``), as CORY does. ``shard`` = (rank, N): the rank's slice of every batch.
    """
    if not 1 <= num_agents <= len(ROLE_NAMES):
        raise ValueError(f"num_agents must be in 1..{len(ROLE_NAMES)}, got {num_agents}")
    roles = list(ROLE_NAMES[:num_agents])
    templates = {roles[0]: "{query}"}
    for previous, role in zip(roles, roles[1:], strict=False):
        templates[role] = FOLLOWER_TEMPLATE.format(previous=previous)
    env = text_env(
        dataset=dataset,
        roles=roles,
        templates=templates,
        reward_fn=distinct_word_reward,
        batch_size=batch_size,
        shard=shard,
    )
    if num_agents == 1:
        return RolePermutation(env, None, learner_ids(1))
    return RolePermutation(SharedReward(env), period, learner_ids(num_agents))
