"""generation.cache: static preallocates the KV cache for prompt + budget (the shapes a compiled decode step needs on a
GPU). On the CPU, uncompiled: the same tokens as the dynamic cache from the same generator, and the same logits up to
float rounding (attention then sums over the whole preallocated length); refused for a model without a KV cache."""

from __future__ import annotations

import pytest
import torch
from transformers import RwkvConfig, RwkvForCausalLM

from marllm.algorithms import GenerationConfig, PPOConfig, PPOLearner
from marllm.models.generation import generate_responses
from marllm.models.policy import ready_for_generation
from tests.conftest import make_tiny_gpt2
from tests.test_rollout_from_generate import PROMPTS, assert_close_to, models

# Prompts that share a long beginning: the dynamic cache runs it once ahead (shared_prefix_prompts), the static one
# runs the prompts as they are; the tokens must not tell.
SHARED = tuple(f"the rules : say good or bad , then stop . the film was {end}" for end in ("good", "bad", "a", "so"))
TOLERANCE = 1e-5  # of the logits' scale: float rounding of a different summation (measured ~1e-7)


def sampled(model, tokenizer, prompts, cache: str):
    generation = GenerationConfig(3, 7, repetition_penalty=1.2, stop_at_eos=True, cache=cache)
    torch.manual_seed(0)
    return generate_responses(model, tokenizer, prompts, 7, generation, capture=True)


@pytest.mark.parametrize("prompts", [PROMPTS, SHARED], ids=["left-padded", "shared prefix"])
@pytest.mark.parametrize("kind", ["gpt2", "llama", "gpt2 with a LoRA adapter"])
def test_static_cache_samples_the_dynamic_caches_tokens_from_the_same_logits(tokenizer, kind, prompts):
    model, tokenizer = models(tokenizer)[kind], ready_for_generation(tokenizer)
    dynamic = sampled(model, tokenizer, prompts, "dynamic")
    static = sampled(model, tokenizer, prompts, "static")
    assert torch.equal(static.response, dynamic.response) and static.texts == dynamic.texts
    assert torch.equal(static.mask, dynamic.mask)
    assert_close_to(static.logits, dynamic.logits, TOLERANCE)
    assert_close_to(static.logits.log_softmax(-1), dynamic.logits.log_softmax(-1), TOLERANCE)
    assert_close_to(static.hidden, dynamic.hidden, TOLERANCE)


def test_a_learner_with_a_static_cache_records_the_dynamic_caches_rollout(tokenizer):
    """The rollout (generate's own forwards, ``ppo.compute.rollout_from_generate``) of a learner sampling with a static
    cache: the same responses, and log-probs, reference log-probs and values up to float rounding."""
    rollouts = {}
    for cache in ("dynamic", "static"):
        learner = PPOLearner(
            "llm1",
            model=make_tiny_gpt2(tokenizer),
            tokenizer=tokenizer,
            reference=make_tiny_gpt2(tokenizer).requires_grad_(False).eval(),
            config=PPOConfig.from_flat(mini_batch_size=4),
            generation=GenerationConfig(4, 8, cache=cache),
            seed=0,
        )
        torch.manual_seed(0)
        learner.act({"prompt": list(PROMPTS)})
        rollouts[cache] = learner.rollouts[0]
    dynamic, static = rollouts["dynamic"], rollouts["static"]
    assert static.responses == dynamic.responses
    assert torch.equal(static.tensors.response, dynamic.tensors.response)
    for column in ("logprobs", "ref_logprobs", "values", "kl_full"):
        assert_close_to(static.tensors[column], dynamic.tensors[column], TOLERANCE)


def test_a_model_without_a_kv_cache_is_refused_naming_the_model_and_the_key(tokenizer):
    """generate would ignore the setting for a model that keeps a state of its own (RWKV): refused before sampling."""
    model = RwkvForCausalLM(
        RwkvConfig(
            vocab_size=len(tokenizer),
            hidden_size=16,
            num_hidden_layers=2,
            attention_hidden_size=16,
            intermediate_size=32,
            context_length=64,
        )
    ).eval()
    tokenizer = ready_for_generation(tokenizer)
    with pytest.raises(ValueError, match=r"generation\.cache is 'static' but RwkvForCausalLM does not use a KV cache"):
        generate_responses(model, tokenizer, PROMPTS[:2], 4, GenerationConfig(cache="static"))


def test_the_cache_setting_is_checked_when_built():
    assert GenerationConfig().cache == "dynamic"
    with pytest.raises(ValueError, match=r"generation\.cache must be one of \['dynamic', 'static'\], got 'paged'"):
        GenerationConfig(cache="paged")
