"""A small GPT-2 pretrained from scratch on the movie reviews (plus worked arithmetic), saved as a HF model dir.

The result loads exactly like ``gpt2-large``: ``AutoModelForCausalLM.from_pretrained(dir)`` gives a
``GPT2LMHeadModel`` and ``AutoTokenizer.from_pretrained(dir)`` a byte-level BPE ``GPT2Tokenizer`` whose
``<|endoftext|>`` is bos, eos, unk and pad.

Pretraining packs the shuffled documents, each preceded by ``<|endoftext|>``, into fixed-length blocks and runs
AdamW with linear warmup and cosine decay to a floor. The run is sized in steps, not seconds, so that a recipe
always gives the same model. The default shape is chosen for a budget of about ten CPU-minutes: at ~3e13 FLOPs
a model of about a million parameters trained on a few million tokens learns more than a larger model that
sees fewer tokens (4 layers x 256 wide reached held-out perplexity ~350 in the same time, 4 x 128 ~165), and
small batches of 8 blocks of 256 give more updates per token. The context is 512 tokens, trained on batches of 4 blocks
of 512 (the same tokens per step), so that every game's default prompt fits (Leduc poker's, liar's dice's, a repeated
game's and rock-paper-scissors' history run past 256). On an idle 2-core CPU it trains in about 15 minutes.

Two fifths of the tokens are worked arithmetic problems, with every digit its own token. With a fifth, and
numbers cut into arbitrary BPE pieces, the model solved about 1% of held-out problems (sampled); digit tokens and
the 40% share alone brought that to 4%, smaller numbers in the problems to 9%, and 2000 steps instead of 1500 to
10% while held-out review perplexity improved from 168 to 155 (one seed each, 100 problems x 5 samples).

The recipe is :class:`~marllm.assets.offline.base_model_recipe.BaseModelRecipe` and the pretraining loop
:func:`~marllm.assets.offline.pretraining.pretrain` (both importable from here); this module trains the tokenizer,
packs the documents into blocks, evaluates the trained model and saves it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast
from transformers.utils import logging as hf_logging

from marllm.assets.offline.arithmetic_problems import pretraining_documents
from marllm.assets.offline.base_model_recipe import BaseModelRecipe
from marllm.assets.offline.pretraining import PRETRAINING_THREADS, pretrain, pretraining_threads

__all__ = [
    "EOS_TOKEN",
    "BaseModelRecipe",
    "PRETRAINING_THREADS",
    "build_model",
    "heldout_perplexity",
    "pack_blocks",
    "pretrain",
    "sample_continuations",
    "train_base_model",
    "train_tokenizer",
]

logger = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"


def train_tokenizer(texts: Sequence[str], vocab_size: int, min_frequency: int = 2,
                    model_max_length: int = 1024, split_digits: bool = False) -> GPT2TokenizerFast:
    """Train a byte-level BPE on ``texts`` with the ``tokenizers`` library and wrap it as a GPT-2 tokenizer.

    ``<|endoftext|>`` gets id 0 and serves as bos, eos, unk and pad, as in GPT-2 (plus pad = eos). With
    ``split_digits`` the training sees every digit as a word of its own, so no merge involves a digit and the
    saved tokenizer, whose GPT-2 pre-tokenizer would keep " 45" together, still spells it " ", "4", "5".
    """
    if not texts:
        raise ValueError("train_tokenizer needs at least one text")
    bpe = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level]) if split_digits
        else byte_level
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer, length=len(texts))
    trained = json.loads(bpe.to_str())["model"]
    return GPT2TokenizerFast(
        vocab=trained["vocab"],
        merges=[tuple(pair) for pair in trained["merges"]],
        pad_token=EOS_TOKEN,
        model_max_length=model_max_length,
    )


def build_model(recipe: BaseModelRecipe, tokenizer: GPT2TokenizerFast) -> GPT2LMHeadModel:
    """A freshly initialised GPT-2 of the recipe's shape for ``tokenizer`` (seeded by ``recipe.seed``)."""
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=recipe.n_positions,
        n_embd=recipe.n_embd,
        n_layer=recipe.n_layer,
        n_head=recipe.n_head,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        # one pass over a small corpus: the model is far from overfitting, so dropout only slows learning
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(recipe.seed)
    model = GPT2LMHeadModel(config)
    # like gpt2 the model config names no pad token; generation pads with eos
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def _encode(tokenizer: GPT2TokenizerFast, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens or length checks (texts longer than the context are fine)."""
    # a private copy of the Rust tokenizer: the wrapper may have switched on padding or truncation in its own
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    return [encoding.ids for encoding in backend.encode_batch(list(texts), add_special_tokens=False)]


def pack_blocks(documents: Sequence[str], tokenizer: GPT2TokenizerFast, block_size: int,
                seed: int) -> torch.Tensor:
    """Shuffle ``documents``, prefix each with eos, concatenate and cut into ``(n_blocks, block_size)`` ids.

    The incomplete last block is dropped. Raises ``ValueError`` when not even one block fills.
    """
    order = np.random.default_rng(seed).permutation(len(documents))
    encoded = _encode(tokenizer, [documents[i] for i in order])
    eos = tokenizer.eos_token_id
    stream = np.fromiter(
        (token for ids in encoded for token in (eos, *ids)), dtype=np.int64, count=sum(len(i) + 1 for i in encoded)
    )
    n_blocks = len(stream) // block_size
    if n_blocks == 0:
        raise ValueError(
            f"the pretraining documents hold {len(stream)} tokens, fewer than one block of {block_size}"
        )
    return torch.from_numpy(stream[: n_blocks * block_size].reshape(n_blocks, block_size))  # (N, T)


@torch.no_grad()
def heldout_perplexity(model: GPT2LMHeadModel, tokenizer: GPT2TokenizerFast, texts: Sequence[str],
                       block_size: int, max_tokens: int, batch_size: int = 16) -> dict[str, float]:
    """Token-level perplexity of ``model`` on ``texts`` packed (in order, eos-separated) into full blocks.

    Scores the first ``max_tokens`` tokens (rounded down to whole blocks; at least one block). Returns
    ``{"perplexity", "nll", "tokens", "word_perplexity", "chars_per_token"}``.
    """
    encoded = _encode(tokenizer, texts)
    stream = [t for ids in encoded for t in (tokenizer.eos_token_id, *ids)]
    if len(stream) < block_size:
        raise ValueError(f"held-out texts hold {len(stream)} tokens, fewer than one block of {block_size}")
    n_blocks = max(1, min(len(stream), max_tokens) // block_size)
    blocks = torch.tensor(stream[: n_blocks * block_size]).view(n_blocks, block_size)  # (N, T)
    model.eval()
    total_nll, total_tokens = 0.0, 0
    for start in range(0, n_blocks, batch_size):
        batch = blocks[start : start + batch_size]
        # HF averages over the B * (T - 1) predicted tokens; undo the mean to pool exactly across batches
        n_predicted = batch.shape[0] * (block_size - 1)
        total_nll += model(input_ids=batch, labels=batch).loss.item() * n_predicted
        total_tokens += n_predicted
    nll = total_nll / total_tokens
    n_tokens = sum(len(ids) + 1 for ids in encoded)  # each text's eos included, as it is scored
    n_words = sum(len(t.split()) + 1 for t in texts)
    return {
        "perplexity": math.exp(nll),
        "nll": nll,
        "tokens": total_tokens,
        # per word (whitespace-separated, eos counted as one), comparable across tokenizers
        "word_perplexity": math.exp(nll * n_tokens / n_words),
        "chars_per_token": sum(len(t) for t in texts) / sum(len(ids) for ids in encoded),
    }


@torch.no_grad()
def sample_continuations(model: GPT2LMHeadModel, tokenizer: GPT2TokenizerFast, prompts: Sequence[str],
                         max_new_tokens: int, seed: int) -> list[str]:
    """Sample one continuation per prompt as the CORY sentiment task does (top_k 0, top_p 1, rep. penalty 1.1).

    Returns the generated text only (prompt excluded), decoded without special tokens.
    """
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        batch = tokenizer(list(prompts), return_tensors="pt", padding=True)
    finally:
        tokenizer.padding_side = padding_side
    torch.manual_seed(seed)
    output = model.generate(
        **batch, do_sample=True, top_k=0, top_p=1.0, repetition_penalty=1.1, max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
    )
    return tokenizer.batch_decode(output[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)


@contextlib.contextmanager
def _save_progress(enabled: bool) -> Iterator[None]:
    """Silence transformers' shard-writing bar when progress output is off, restoring the setting after."""
    was_disabled = not hf_logging.is_progress_bar_enabled()
    if not enabled and not was_disabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if not enabled and not was_disabled:
            hf_logging.enable_progress_bar()


def _arithmetic_documents(n: int, seed: int) -> list[str]:
    return pretraining_documents(n, seed)


def train_base_model(train_texts: Sequence[str], heldout_reviews: Sequence[str], recipe: BaseModelRecipe,
                     out_dir: Path, progress: bool = True) -> dict[str, Any]:
    """Train tokenizer and GPT-2 on ``train_texts`` plus arithmetic documents; save both to ``out_dir``.

    Torch runs on :data:`~marllm.assets.offline.pretraining.PRETRAINING_THREADS` intra-op threads throughout (the
    same bytes whatever the machine's cores or load); its setting is restored afterwards. Returns the phase metrics:
    held-out perplexity on ``heldout_reviews``, the realised arithmetic share, pretraining losses and speed, and
    sampled continuations of held-out review openings.
    """
    with pretraining_threads():
        return _train_base_model(train_texts, heldout_reviews, recipe, out_dir, progress)


def _train_base_model(train_texts: Sequence[str], heldout_reviews: Sequence[str], recipe: BaseModelRecipe,
                      out_dir: Path, progress: bool) -> dict[str, Any]:
    start = time.perf_counter()
    if not train_texts:
        raise ValueError("train_base_model needs at least one training text")
    # a probe of arithmetic documents sizes the final set to the target token share after tokenisation
    probe = _arithmetic_documents(200, recipe.arithmetic_seed) if recipe.arithmetic_fraction > 0 else []
    tokenizer = train_tokenizer(list(train_texts) + probe, recipe.vocab_size, recipe.min_frequency,
                                model_max_length=recipe.n_positions, split_digits=recipe.split_digits)
    n_arithmetic = 0
    arithmetic: list[str] = []
    if recipe.arithmetic_fraction > 0:
        text_tokens = sum(len(ids) + 1 for ids in _encode(tokenizer, train_texts))
        probe_tokens = np.mean([len(ids) + 1 for ids in _encode(tokenizer, probe)])
        share = recipe.arithmetic_fraction / (1.0 - recipe.arithmetic_fraction)
        n_arithmetic = max(1, round(share * text_tokens / probe_tokens))
        arithmetic = _arithmetic_documents(n_arithmetic, recipe.arithmetic_seed)
    tokenizer_s = time.perf_counter() - start

    blocks = pack_blocks(list(train_texts) + arithmetic, tokenizer, recipe.block_size, recipe.seed)
    arithmetic_tokens = sum(len(ids) + 1 for ids in _encode(tokenizer, arithmetic))
    model = build_model(recipe, tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("pretraining a %.1fM-parameter GPT-2 on %d blocks of %d tokens", n_params / 1e6, *blocks.shape)
    train_stats = pretrain(model, blocks, recipe, progress=progress)

    evaluation = heldout_perplexity(model, tokenizer, heldout_reviews, recipe.block_size, recipe.eval_max_tokens)
    prompts = [" ".join(text.split()[:5]) for text in heldout_reviews[:5]]
    samples = sample_continuations(model, tokenizer, prompts, recipe.sample_new_tokens, recipe.seed)

    out_dir.mkdir(parents=True, exist_ok=True)
    with _save_progress(progress):
        model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {
        "parameters": n_params,
        "vocab_size": len(tokenizer),
        "pretraining_tokens": int(blocks.numel()),
        "arithmetic_documents": n_arithmetic,
        "arithmetic_token_share": arithmetic_tokens / max(1, int(blocks.numel())),
        "epochs": train_stats["tokens_seen"] / blocks.numel(),
        "heldout_perplexity": evaluation["perplexity"],
        "heldout_nll": evaluation["nll"],
        "heldout_word_perplexity": evaluation["word_perplexity"],
        "heldout_tokens": evaluation["tokens"],
        "chars_per_token": evaluation["chars_per_token"],
        "tokenizer_wall_s": tokenizer_s,
        **train_stats,
        "samples": [{"prompt": p, "continuation": c} for p, c in zip(prompts, samples, strict=True)],
    }
