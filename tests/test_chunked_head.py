"""ppo.compute.logits_chunk_rows: the LM head applied a few rows at a time, recomputed in the backward, gives the update
of the whole pass (the weights after it within float rounding) while no head call sees more than the chunk's rows; a
model that changes its logits after its head is refused."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM

from marllm.algorithms import ComputeConfig, GenerationConfig, PPOConfig, PPOLearner
from marllm.models.chunked_head import check_plain_head, chunked_head_logprobs, head_deferred
from marllm.models.lora import LoraSettings, attach_adapters
from tests.conftest import make_tiny_gpt2
from tests.test_gradient_checkpointing import PROMPTS, SHARED_PROMPTS, tiny_qwen2

COLUMNS = ("response", "logprobs", "ref_logprobs", "values", "kl")


def updated(tokenizer, base, chunk_rows, prompts=PROMPTS, lora=False, generation=None):
    """One act-reward-update of a learner on a copy of ``base``: its rollout, its trained weights after the update,
    the largest row count any LM-head call saw during the update, and the update's statistics."""
    model = copy.deepcopy(base)
    settings = {"mini_batch_size": 4, "ppo_epochs": 2, "learning_rate": 3e-3, "init_kl_coef": 0.01}
    config = PPOConfig.from_flat(kl_control="fixed", logits_chunk_rows=chunk_rows, micro_batch_size=None, **settings)
    kwargs = {"reference": copy.deepcopy(base).requires_grad_(False).eval()}
    torch.manual_seed(0)
    if lora:
        targets = lora if isinstance(lora, list) else ["c_attn"]
        model = attach_adapters(model, ["llm1"], LoraSettings(r=2, alpha=4, target_modules=targets))
        kwargs = {"reference": None, "adapter": "llm1"}
    generation = generation or GenerationConfig(4, 8)
    learner = PPOLearner("llm1", model=model, tokenizer=tokenizer, config=config, generation=generation, **kwargs)
    torch.manual_seed(1)
    learner.act({"prompt": prompts})
    rollout = {column: learner.rollouts[0].tensors[column].clone() for column in COLUMNS}
    learner.finish(np.linspace(-1.0, 1.0, len(prompts)))
    head = learner.model.get_output_embeddings()
    rows_seen = []
    # Rows each real projection onto the vocabulary saw (the deferred pass returns its input: not a projection).
    head.register_forward_hook(
        lambda module, args, out: rows_seen.append(args[0].shape[0]) if out.shape[-1] != args[0].shape[-1] else None
    )
    stats = learner.update()
    weights = {name: p.detach().clone() for name, p in learner.model.named_parameters() if p.requires_grad}
    weights |= {f"value_head.{name}": p.detach().clone() for name, p in learner.value_head.named_parameters()}
    return rollout, weights, max(rows_seen), stats


def adapters_before(base, targets):
    """The head's LoRA A matrices as a fresh attachment makes them (seeded as ``updated`` seeds them)."""
    model = copy.deepcopy(base)
    torch.manual_seed(0)
    model = attach_adapters(model, ["llm1"], LoraSettings(r=2, alpha=4, target_modules=targets))
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lm_head" in n and "lora_A" in n}


@pytest.mark.parametrize(
    ("model", "prompts", "lora", "chunk_rows"),
    [
        ("gpt2", PROMPTS, False, 1),
        ("gpt2", PROMPTS, False, 3),  # a last chunk smaller than the others
        ("gpt2", SHARED_PROMPTS, False, 2),
        ("qwen2", PROMPTS, False, 2),
        ("gpt2", PROMPTS, True, 2),
        ("qwen2", PROMPTS, ["q_proj", "lm_head"], 2),  # an adapter on the head itself: its A and B get gradients
        ("gpt2", PROMPTS, ["c_attn", "lm_head"], 1),  # on a head tied to the input embeddings
    ],
    ids=["gpt2 rows of 1", "gpt2 rows of 3", "gpt2 shared prefix", "qwen2", "gpt2 lora", "qwen2 lora on the head",
         "gpt2 lora on a tied head"],
)
def test_chunked_head_gives_the_update_of_the_whole_pass(tokenizer, model, prompts, lora, chunk_rows):
    base = make_tiny_gpt2(tokenizer, n_positions=256) if model == "gpt2" else tiny_qwen2(tokenizer)
    plain_rollout, plain_weights, plain_rows, plain_stats = updated(tokenizer, base, None, prompts, lora)
    rollout, weights, rows, stats = updated(tokenizer, base, chunk_rows, prompts, lora)
    for column in COLUMNS:  # the rollout does not use the setting
        assert torch.equal(rollout[column], plain_rollout[column]), column
    assert plain_rows == 4 and rows <= chunk_rows  # mini-batches of 4 rows: whole, or by chunks
    # The same products over fewer rows: equal up to the order of float sums inside the matrix product; after two
    # epochs of Adam at lr 3e-3, 1e-5 is far below any real difference (a lost chunk or a wrong row moves weights by
    # the step size, ~3e-3).
    differences = {name: (weights[name] - plain_weights[name]).abs().max().item() for name in weights}
    assert max(differences.values()) < 1e-5, differences
    if isinstance(lora, list) and "lm_head" in lora:  # the head's own adapter trained, as in the whole pass
        head_adapter = [name for name in weights if "lm_head" in name and "lora_A" in name]
        assert head_adapter and all(weights[name].abs().sum() > 0 for name in head_adapter)
        assert all((weights[name] != base_adapter).any() for name, base_adapter in adapters_before(base, lora).items())
    for key in ("entropy", "loss/policy"):
        assert stats[key] == pytest.approx(plain_stats[key], rel=1e-4, abs=1e-6), key


def test_chunked_head_under_sampling_processors(tokenizer):
    """logprobs_from: sampling re-applies the repetition penalty and top-k to each chunk with its own rows."""
    base = make_tiny_gpt2(tokenizer, n_positions=256)
    generation = GenerationConfig(4, 8, top_k=5, repetition_penalty=1.3, logprobs_from="sampling")
    _, plain, _, _ = updated(tokenizer, base, None, generation=generation)
    _, chunked, rows, _ = updated(tokenizer, base, 1, generation=generation)
    assert rows == 1
    assert max((chunked[name] - plain[name]).abs().max().item() for name in plain) < 1e-5


def test_chunked_head_logprobs_match_the_whole_head_with_gradients():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False)
    hidden = torch.randn(5, 3, 8, requires_grad=True)
    tokens = torch.randint(0, 50, (5, 3))

    def logprobs_of_rows(logits, rows):
        logprobs = torch.log_softmax(logits.float(), -1).gather(-1, tokens[rows].unsqueeze(-1)).squeeze(-1)
        return logprobs, torch.zeros_like(logprobs)

    whole, _ = logprobs_of_rows(head(hidden), slice(None))
    (grad_whole,) = torch.autograd.grad(whole.sum(), hidden)
    chunked, _ = chunked_head_logprobs(head, hidden, 2, logprobs_of_rows)
    (grad_chunked,) = torch.autograd.grad(chunked.sum(), hidden)
    torch.testing.assert_close(chunked, whole)
    torch.testing.assert_close(grad_chunked, grad_whole)


def test_head_deferred_returns_the_hidden_states_and_restores_the_head(tokenizer):
    model = make_tiny_gpt2(tokenizer).eval()
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        with head_deferred(model) as head:
            hidden = model(input_ids=ids).logits
        assert hidden.shape == (1, 3, model.config.n_embd)
        torch.testing.assert_close(head(hidden), logits)
        torch.testing.assert_close(model(input_ids=ids).logits, logits)  # the head is whole again


def test_a_model_that_soft_caps_its_logits_is_refused(tokenizer):
    config = Gemma2Config(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, final_logit_softcapping=0.5, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=r"Gemma2ForCausalLM changes them after its head.*logits_chunk_rows: null"):
        check_plain_head(Gemma2ForCausalLM(config), "learner 'llm1'")
    check_plain_head(make_tiny_gpt2(tokenizer), "learner 'llm1'")  # GPT-2's logits are its head's


def test_logits_chunk_rows_is_checked():
    with pytest.raises(ValueError, match="logits_chunk_rows"):
        PPOConfig.from_flat(logits_chunk_rows=0)
    assert any("logits_chunk_rows" in reason for reason in ComputeConfig(logits_chunk_rows=4).whole_model_settings())
