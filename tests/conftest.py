"""Tiny local stand-ins for hub models: a byte-level BPE tokenizer, a 2-layer GPT-2 and a tiny classifier."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    DistilBertConfig,
    DistilBertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
)

# The models here are tiny: one thread is faster than two, and immune to another process holding the cores.
torch.set_num_threads(1)

# marllm:offline-base and the other embedded assets, where a test (or a command it runs) loads them, come from the
# small recipe: seconds to prepare on a fresh machine instead of the main job's 10 minutes. The full recipe's
# preparation is what `make run` does; the preparation code itself is tested on tiny recipes.
os.environ.setdefault("MARLLM_OFFLINE_RECIPE", "small")

EOS = "<|endoftext|>"
CORPUS = [
    "this movie was good and the acting was great",
    "this film was bad and the plot was terrible",
    "i loved the story , a wonderful and happy film",
    "i hated the ending , a boring and sad movie",
    "the cast is good , the music is great , the story is fine",
    "what a terrible waste of time , bad from start to end",
]
REVIEWS = [{"text": line * 3, "label": i % 2} for i, line in enumerate(CORPUS * 4)]


def make_tokenizer(vocab_size: int = 300) -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE(unk_token=EOS))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(CORPUS * 5, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=EOS, eos_token=EOS, unk_token=EOS, pad_token=EOS)


def make_tiny_gpt2(tokenizer: PreTrainedTokenizerFast, n_positions: int = 128, seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    return GPT2LMHeadModel(config)


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer()


@pytest.fixture(scope="session")
def tiny_lm_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer: PreTrainedTokenizerFast) -> Path:
    """A 2-layer GPT-2 saved like a hub model (config.json, safetensors, tokenizer files)."""
    path = tmp_path_factory.mktemp("tiny-gpt2")
    make_tiny_gpt2(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_classifier_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer: PreTrainedTokenizerFast) -> Path:
    """A tiny DistilBERT sentiment classifier with labels NEGATIVE/POSITIVE, saved like lvwerra/distilbert-imdb."""
    path = tmp_path_factory.mktemp("tiny-classifier")
    torch.manual_seed(0)
    config = DistilBertConfig(
        vocab_size=len(tokenizer),
        dim=16,
        hidden_dim=32,
        n_layers=1,
        n_heads=2,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        id2label={0: "NEGATIVE", 1: "POSITIVE"},
        label2id={"NEGATIVE": 0, "POSITIVE": 1},
    )
    DistilBertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def reviews_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A JSONL review corpus standing in for IMDB."""
    path = tmp_path_factory.mktemp("reviews") / "reviews.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in REVIEWS))
    return path
