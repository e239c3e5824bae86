"""ppo.compute.rollout_from_generate: the rollout's log-probs and values taken from generate's own KV-cached forwards
are those of a second full forward up to float rounding, on the same sampled tokens; the switch is refused where
generate's forwards cannot be matched to the tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from marllm.algorithms.critic_free_learner import CriticFreeLearner
from marllm.algorithms.ppo_config import ComputeConfig, GenerationConfig, PPOConfig
from marllm.config import ConfigError, load_config
from marllm.models.generation import generate_responses
from marllm.models.policy import position_ids_for, ready_for_generation, response_forward
from marllm.parallel.placement import Placement, Sharded
from tests.conftest import make_tiny_gpt2
from tests.test_ppo_learner import make_learner

ROOT = Path(__file__).resolve().parents[1]
# Prompts of different lengths: the batch is left-padded, and the padding must not move positions or values.
PROMPTS = ("this movie was", "what a", "the actors in this movie were all", "i think", "a long and slow film") * 2


def tiny_llama(tokenizer):
    torch.manual_seed(1)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config).eval()


def assert_close_to(got, want, tolerance=1e-5):
    """Within ``tolerance`` of the largest magnitude of ``want``, or of 1 for columns near zero (a KL of 0)."""
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= tolerance * max(want.abs().max().item(), 1.0)


def models(tokenizer):
    gpt2 = make_tiny_gpt2(tokenizer).eval()
    lora = get_peft_model(make_tiny_gpt2(tokenizer, seed=3), LoraConfig(r=2, lora_alpha=4, target_modules=["c_attn"]))
    for name, parameter in lora.named_parameters():  # adapters that change the output (lora_B starts at zero)
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.5)
    return {"gpt2": gpt2, "llama": tiny_llama(tokenizer), "gpt2 with a LoRA adapter": lora.eval()}


@pytest.mark.parametrize("kind", ["gpt2", "llama", "gpt2 with a LoRA adapter"])
def test_captured_logits_and_hidden_states_are_a_full_forwards(tokenizer, kind):
    model, tokenizer = models(tokenizer)[kind], ready_for_generation(tokenizer)
    generation = GenerationConfig(3, 7, repetition_penalty=1.2, stop_at_eos=True)
    torch.manual_seed(0)
    plain = generate_responses(model, tokenizer, PROMPTS, 7, generation)
    torch.manual_seed(0)
    captured = generate_responses(model, tokenizer, PROMPTS, 7, generation, capture=True)
    assert plain.logits is None and plain.hidden is None
    assert torch.equal(captured.response, plain.response) and captured.texts == plain.texts  # sampling untouched
    input_ids = torch.cat([captured.prompt_ids, captured.response], 1)
    attention = torch.cat([captured.prompt_mask, torch.ones_like(captured.response)], 1)
    prompt_length = captured.prompt_ids.shape[1]
    with torch.no_grad():
        logits, _ = response_forward(model, input_ids, attention, prompt_length)
        outputs = model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=position_ids_for(attention),
            output_hidden_states=True,
        )
    length = captured.response.shape[1]
    assert captured.logits.shape == (len(PROMPTS), length, len(tokenizer)) and captured.logits.dtype == torch.float32
    assert captured.hidden.shape == (len(PROMPTS), length, outputs.hidden_states[-1].shape[-1])
    assert_close_to(captured.logits, logits)
    assert_close_to(captured.hidden, outputs.hidden_states[-1][:, prompt_length - 1 : -1])


def rollout_pair(tokenizer, learner_class=None, learner_kwargs=None, **ppo):
    """Two learners of the same weights, one with the switch, each after one rollout from the same seed."""
    learners = []
    for switch in (False, True):
        learner = make_learner(
            tokenizer,
            0,
            **({"learner_class": learner_class} if learner_class else {}),
            learner_kwargs=learner_kwargs,
            rollout_from_generate=switch,
            **ppo,
        )
        torch.manual_seed(0)
        learner.act({"prompt": list(PROMPTS[:8])})
        learners.append(learner)
    return learners


@pytest.mark.parametrize("forward_batch_size", [None, 3])
def test_ppo_rollout_from_generate_matches_a_second_forward(tokenizer, forward_batch_size):
    full, cached = rollout_pair(tokenizer, forward_batch_size=forward_batch_size)
    one, other = full.rollouts[0], cached.rollouts[0]
    assert other.responses == one.responses
    assert torch.equal(other.tensors.response, one.tensors.response)
    assert torch.equal(other.tensors.ref_logprobs, one.tensors.ref_logprobs)  # the reference's forward is unchanged
    for column in ("logprobs", "values", "kl_full", "kl"):
        assert_close_to(other.tensors[column], one.tensors[column])
    for learner in (full, cached):
        learner.finish([0.3 * (i % 3) - 0.2 for i in range(8)])
    first = [full.update(), cached.update()]
    # The first epoch starts on the rollout's own policy: the ratio is 1 up to the rounding the two forwards differ by.
    for key in ("loss/policy", "loss/value", "approx_kl"):
        assert first[1][key] == pytest.approx(first[0][key], rel=1e-3, abs=1e-6), key


def test_critic_free_rollout_from_generate_has_no_values_to_take(tokenizer):
    full, cached = rollout_pair(tokenizer, CriticFreeLearner, {"algorithm": "reinforce_pp"})
    assert cached.rollouts[0].tensors.get("values") is None
    assert cached.rollouts[0].responses == full.rollouts[0].responses
    assert_close_to(cached.rollouts[0].tensors.logprobs, full.rollouts[0].tensors.logprobs)


def test_rollout_from_generate_is_on_by_default_for_whole_models_and_refused_with_fsdp_when_asked():
    assert PPOConfig().compute.rollout_from_generate == "auto"
    assert PPOConfig().compute.settled(Placement).rollout_from_generate is True
    assert PPOConfig().compute.settled(Sharded).rollout_from_generate is False
    assert ComputeConfig(rollout_from_generate=False).settled(Placement).rollout_from_generate is False
    with pytest.raises(ValueError, match="ppo.compute.rollout_from_generate must be true, false or 'auto'"):
        PPOConfig.from_flat(rollout_from_generate="yes")
    load_config(ROOT / "examples" / "cory_gsm8k_fsdp.yaml").check_placement(8)  # the defaults suit sharding
    with pytest.raises(ConfigError, match="ppo.compute.rollout_from_generate takes one logit per sampled token"):
        config = load_config(ROOT / "examples" / "cory_gsm8k_fsdp.yaml", ["ppo.compute.rollout_from_generate=true"])
        config.check_placement(8)


def test_every_whole_model_setting_is_named_when_refused_with_fsdp():
    assert PPOConfig().compute.whole_model_settings() == []
    every = PPOConfig.from_flat(micro_batch_size=4, autocast_dtype="bfloat16", rollout_from_generate=True)
    reasons = every.compute.whole_model_settings()
    assert [reason.split(" ", 1)[0] for reason in reasons] == [
        "ppo.compute.micro_batch_size",
        "ppo.compute.autocast_dtype",
        "ppo.compute.rollout_from_generate",
    ]
    overrides = ["ppo.compute.rollout_from_generate=true", "ppo.compute.micro_batch_size=2"]
    with pytest.raises(
        ConfigError, match="ppo.compute.micro_batch_size splits.*; ppo.compute.rollout_from_generate takes"
    ):
        load_config(ROOT / "examples" / "cory_gsm8k_fsdp.yaml", overrides).check_placement(8)
