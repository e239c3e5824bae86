"""ppo.compute.gradient_checkpointing: the policy's transformer layers recomputed in the backward give the same update
(the same weights after it, bit for bit on the CPU) and the same rollout, on GPT-2, a tiny Qwen2 and a LoRA adapter;
refused for a model class that does not support it."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from marllm.algorithms import ComputeConfig, GenerationConfig, PPOConfig, PPOLearner
from marllm.models.checkpointing import checkpointed_layers, enable_gradient_checkpointing
from marllm.models.lora import LoraSettings, attach_adapters
from tests.conftest import make_tiny_gpt2

PROMPTS = ["this movie was", "what a", "the actors in this movie were all", "i think"] * 2
# A beginning of 16+ tokens shared by every prompt: the rollout and the update passes run on its key/value cache,
# which checkpointing must leave alone.
SHARED = "this movie was good and the acting was great , the music is great , the story is fine . "
SHARED_PROMPTS = [SHARED + prompt for prompt in PROMPTS]
COLUMNS = ("response", "logprobs", "ref_logprobs", "values", "kl", "mask")


def tiny_qwen2(tokenizer):
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    return Qwen2ForCausalLM(config)


def attention_calls(model):
    """How many times each attention module runs (a checkpointed layer's runs again in the backward)."""
    calls = [0]
    for name, module in model.named_modules():
        if name.endswith((".attn", ".self_attn")):
            module.register_forward_hook(lambda *args: calls.__setitem__(0, calls[0] + 1))
    return calls


def updated(tokenizer, base, checkpointing, prompts=PROMPTS, lora=False):
    """One act-reward-update of a learner on a copy of ``base``: its rollout's columns, its trained weights after
    the update, and how many attention calls the update made."""
    model = copy.deepcopy(base)
    settings = {"mini_batch_size": 4, "ppo_epochs": 2, "learning_rate": 3e-3, "init_kl_coef": 0.01}
    config = PPOConfig.from_flat(kl_control="fixed", gradient_checkpointing=checkpointing, **settings)
    kwargs = {"reference": copy.deepcopy(base).requires_grad_(False).eval()}
    torch.manual_seed(0)  # the adapters' and the value head's initial weights
    if lora:
        model = attach_adapters(model, ["llm1"], LoraSettings(r=2, alpha=4, target_modules=["c_attn"]))
        kwargs = {"reference": None, "adapter": "llm1"}
    learner = PPOLearner(
        "llm1", model=model, tokenizer=tokenizer, config=config, generation=GenerationConfig(4, 8), **kwargs
    )
    torch.manual_seed(1)
    learner.act({"prompt": prompts})
    rollout = {column: learner.rollouts[0].tensors[column].clone() for column in COLUMNS}
    learner.finish(np.linspace(-1.0, 1.0, len(prompts)))
    calls = attention_calls(learner.model)
    before = [p.clone() for p in _trained(learner.model)]
    learner.update()
    assert not all(torch.equal(p, b) for p, b in zip(_trained(learner.model), before, strict=True))  # it trained
    assert not any(module.training for module in learner.model.modules())  # every layer back in eval mode
    weights = {name: p.detach().clone() for name, p in learner.model.named_parameters() if p.requires_grad}
    weights |= {f"value_head.{name}": p.detach().clone() for name, p in learner.value_head.named_parameters()}
    return rollout, weights, calls[0]


@pytest.mark.parametrize(
    ("model", "prompts", "lora"),
    [("gpt2", PROMPTS, False), ("gpt2", SHARED_PROMPTS, False), ("qwen2", PROMPTS, False), ("gpt2", PROMPTS, True)],
    ids=["gpt2", "gpt2 shared prefix", "qwen2", "gpt2 lora"],
)
def test_checkpointing_gives_the_same_rollout_and_weights(tokenizer, model, prompts, lora):
    base = make_tiny_gpt2(tokenizer, n_positions=256) if model == "gpt2" else tiny_qwen2(tokenizer)
    plain_rollout, plain_weights, plain_calls = updated(tokenizer, base, False, prompts, lora)
    rollout, weights, calls = updated(tokenizer, base, True, prompts, lora)
    for column in COLUMNS:  # generation and the rollout's forwards (no gradients) are untouched
        assert torch.equal(rollout[column], plain_rollout[column]), column
    # The backward recomputes each checkpointed layer's forward with the same ops on the same inputs: the gradients,
    # and so Adam's steps, are the same floats. Bit-identical on the CPU; a GPU's kernels could choose otherwise
    # between the two forwards only with non-deterministic algorithms, which would break this test first.
    assert weights.keys() == plain_weights.keys()
    differences = {name: (weights[name] - plain_weights[name]).abs().max().item() for name in weights}
    assert max(differences.values()) == 0.0, differences
    if prompts is PROMPTS:  # the layers were recomputed: their attention ran again in the backward
        assert calls > plain_calls
    else:  # passes on the shared prefix's cache keep their activations: nothing is recomputed
        assert calls == plain_calls


def _trained(model):
    return [p.detach() for p in model.parameters() if p.requires_grad]


def test_checkpointing_is_enabled_once_on_the_layers_alone(tokenizer):
    model = make_tiny_gpt2(tokenizer)
    assert enable_gradient_checkpointing(model) == 2  # GPT-2's two blocks
    assert enable_gradient_checkpointing(model) == 2
    assert [type(layer).__name__ for layer in checkpointed_layers(model)] == ["GPT2Block", "GPT2Block"]
    assert len(model.transformer.h[0]._forward_pre_hooks) == 1
    # Under no_grad (generation, rollout) no layer is put in training mode.
    model.eval()
    seen = []
    model.transformer.h[0].register_forward_pre_hook(lambda module, args: seen.append(module.training))
    with torch.no_grad():
        model(input_ids=torch.tensor([[1, 2, 3]]))
    model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True).logits.sum().backward()
    model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=False).logits.sum().backward()
    # In training mode (checkpointed) only while gradients are recorded and no cache is written or read.
    assert seen == [False, False, True]
    assert not model.transformer.h[0].training and not model.transformer.h[0].attn.training


def test_checkpointing_is_refused_for_a_model_class_without_it(tokenizer):
    class NoCheckpointing(GPT2LMHeadModel):
        supports_gradient_checkpointing = False

    model = NoCheckpointing(make_tiny_gpt2(tokenizer).config)
    with pytest.raises(
        ValueError, match=r"ppo.compute.gradient_checkpointing: NoCheckpointing does not support gradient"
    ):
        PPOLearner(
            "llm1",
            model=model,
            tokenizer=tokenizer,
            reference=copy.deepcopy(model).requires_grad_(False),
            config=PPOConfig.from_flat(gradient_checkpointing=True),
        )


def test_gradient_checkpointing_setting_is_checked():
    assert PPOConfig().compute.gradient_checkpointing is False
    with pytest.raises(ValueError, match="ppo.compute.gradient_checkpointing must be true or false, got 'yes'"):
        PPOConfig.from_flat(gradient_checkpointing="yes")
    assert any("gradient_checkpointing" in reason for reason in ComputeConfig(gradient_checkpointing=True)
               .whole_model_settings())  # fmt: skip
