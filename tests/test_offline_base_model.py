"""Tokenizer training, block packing, perplexity and the tiny base-model training of the offline assets."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from marllm.assets.offline import base_model, pretraining
from marllm.assets.offline.base_model import (
    PRETRAINING_THREADS,
    BaseModelRecipe,
    build_model,
    heldout_perplexity,
    pack_blocks,
    train_base_model,
    train_tokenizer,
)
from marllm.utils.files import sha256_file

TEXTS = [
    "this film is a wonderful , moving story .",
    "the plot is dull and the acting is terrible .",
    "Question: Mia has 14 stickers.\nAnswer: 14 - 5 = 9. The answer is 9.",
] * 20


def test_tokenizer_is_byte_level_gpt2_with_eos_everywhere(tmp_path):
    tokenizer = train_tokenizer(TEXTS, vocab_size=300, min_frequency=2, model_max_length=64)
    assert tokenizer.eos_token == tokenizer.bos_token == tokenizer.unk_token == tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.eos_token_id == 0 and len(tokenizer) == 300
    text = "an unseen word: zyzzyva ü 42!"  # byte-level: anything round-trips
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    assert len(tokenizer("this film is")["input_ids"]) < len("this film is")  # merges were learned
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert type(reloaded).__name__ == "GPT2Tokenizer"
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert reloaded.pad_token_id == 0 and reloaded.model_max_length == 64


def test_split_digits_spells_every_number_digit_by_digit_after_reloading(tmp_path):
    numbers = [f"Question: {a} + {b} = {a + b} and ${a * b}." for a in range(10, 40) for b in range(10, 40, 7)]
    merged = train_tokenizer(TEXTS + numbers, vocab_size=400)
    assert any(len(merged.tokenize(f" {n}")) == 1 for n in range(10, 100))  # the plain BPE merges digits

    tokenizer = train_tokenizer(TEXTS + numbers, vocab_size=400, split_digits=True)
    assert not [token for token in tokenizer.get_vocab() if len(token) > 1 and any(c.isdigit() for c in token)]
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)  # transformers rebuilds GPT-2's own pre-tokenizer
    for text, pieces in ((" 45", ["Ġ", "4", "5"]), ("$120.", ["$", "1", "2", "0", "."]), ("b2b", ["b", "2", "b"])):
        assert reloaded.tokenize(text) == pieces
        assert reloaded.decode(reloaded(text)["input_ids"]) == text
    assert reloaded.tokenize("this film is") == tokenizer.tokenize("this film is")


def test_pack_blocks_prefixes_documents_with_eos_and_drops_the_tail():
    tokenizer = train_tokenizer(TEXTS, vocab_size=300)
    documents = ["the film", "a dull plot .", "wonderful"]
    blocks = pack_blocks(documents, tokenizer, block_size=3, seed=0)
    order = np.random.default_rng(0).permutation(3)
    stream = [t for i in order for t in [0, *tokenizer(documents[i])["input_ids"]]]
    n_blocks = len(stream) // 3
    assert blocks.tolist() == [stream[3 * b : 3 * b + 3] for b in range(n_blocks)]
    assert blocks.dtype == torch.int64
    with pytest.raises(ValueError, match="fewer than one block"):
        pack_blocks(["a"], tokenizer, block_size=64, seed=0)


def test_perplexity_of_a_uniform_model_is_the_vocabulary_size():
    tokenizer = train_tokenizer(TEXTS, vocab_size=300)
    recipe = BaseModelRecipe(vocab_size=300, n_layer=1, n_embd=16, n_head=2, n_positions=32, block_size=16)
    model = build_model(recipe, tokenizer)
    with torch.no_grad():
        model.transformer.wte.weight.zero_()  # tied LM head: every logit 0, every token probability 1/300
    result = heldout_perplexity(model, tokenizer, TEXTS[:6], block_size=16, max_tokens=10_000)
    assert result["perplexity"] == pytest.approx(300, rel=1e-4)
    assert result["nll"] == pytest.approx(math.log(300), rel=1e-5)
    assert result["tokens"] % 15 == 0  # whole blocks, 15 predicted tokens each
    # per word: the same nats spread over fewer units (tokens and words both count one eos per text)
    n_tokens = sum(len(tokenizer(t)["input_ids"]) + 1 for t in TEXTS[:6])
    n_words = sum(len(t.split()) + 1 for t in TEXTS[:6])
    assert result["word_perplexity"] == pytest.approx(300 ** (n_tokens / n_words), rel=1e-4)


def test_recipe_validation_names_the_parameter():
    with pytest.raises(ValueError, match="block_size"):
        BaseModelRecipe(block_size=512, n_positions=256)
    with pytest.raises(ValueError, match="divisible by n_head"):
        BaseModelRecipe(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="arithmetic_fraction"):
        BaseModelRecipe(arithmetic_fraction=1.0)
    with pytest.raises(ValueError, match="max_steps"):
        BaseModelRecipe(max_steps=0)
    with pytest.raises(ValueError, match="split_digits"):
        BaseModelRecipe(split_digits="yes")


def test_train_base_model_mixes_arithmetic_learns_and_saves_a_loadable_model(tmp_path, monkeypatch):
    calls = []

    def stand_in(n, seed):
        calls.append((n, seed))
        return [f"Question: What is {i} + 1?\nAnswer: {i} + 1 = {i + 1}. The answer is {i + 1}." for i in range(n)]

    monkeypatch.setattr(base_model, "_arithmetic_documents", stand_in)
    recipe = BaseModelRecipe(vocab_size=300, n_layer=1, n_embd=32, n_head=2, n_positions=32, block_size=32,
                             batch_size=4, max_steps=12, warmup_steps=2, learning_rate=3e-3,
                             arithmetic_fraction=0.25, arithmetic_seed=11, eval_max_tokens=200, sample_new_tokens=5)
    reviews = [t for t in TEXTS if not t.startswith("Question")]
    threads = torch.get_num_threads()
    metrics = train_base_model(reviews, reviews[:8], recipe, tmp_path, progress=False)
    assert torch.get_num_threads() == threads
    assert calls[0] == (200, 11) and calls[1] == (metrics["arithmetic_documents"], 11)
    assert 0.15 < metrics["arithmetic_token_share"] < 0.35
    assert metrics["final_loss"] < metrics["first_loss"]
    assert metrics["heldout_perplexity"] < 300
    assert len(metrics["samples"]) == 5 and all(isinstance(s["continuation"], str) for s in metrics["samples"])

    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert type(model).__name__ == "GPT2LMHeadModel" and model.config.n_layer == 1
    assert model.config.eos_token_id == tokenizer.eos_token_id == 0
    batch = tokenizer(["this film is"], return_tensors="pt")
    out = model.generate(**batch, max_new_tokens=3, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape == (1, batch["input_ids"].shape[1] + 3)


def test_the_base_is_the_same_bytes_whatever_the_callers_threads(tmp_path, monkeypatch):
    """Pretraining always runs on PRETRAINING_THREADS intra-op threads (a count picked from the cores or by timing
    made the weights depend on the machine and its load): two builds, called with 1 and 3 threads, are identical."""
    recipe = BaseModelRecipe(vocab_size=300, n_layer=1, n_embd=32, n_head=2, n_positions=32, block_size=32,
                             batch_size=4, max_steps=6, warmup_steps=2, arithmetic_fraction=0.0, eval_max_tokens=200,
                             sample_new_tokens=3)
    reviews = [t for t in TEXTS if not t.startswith("Question")]
    seen = []
    real_step = pretraining._train_step
    monkeypatch.setattr(pretraining, "_train_step", lambda *a: seen.append(torch.get_num_threads()) or real_step(*a))
    previous = torch.get_num_threads()
    digests = []
    try:
        for caller_threads in (1, 3):
            torch.set_num_threads(caller_threads)
            train_base_model(reviews, reviews[:8], recipe, tmp_path / str(caller_threads), progress=False)
            assert torch.get_num_threads() == caller_threads
            digests.append(sha256_file(tmp_path / str(caller_threads) / "model.safetensors"))
    finally:
        torch.set_num_threads(previous)
    assert set(seen) == {PRETRAINING_THREADS}
    assert digests[0] == digests[1]
