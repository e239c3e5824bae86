"""Prompts that share their beginning: the shared prefix computed once gives the whole forward's next-token logits,
values and gradients (GPT-2's learned positions, a Llama's rotary ones, a LoRA adapter), and is not used where the
prompts share too little."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from marllm.models import prefix_forward
from marllm.models.policy import ValueHead
from marllm.models.prefix_forward import MIN_SHARED_TOKENS, common_prefix_length, last_position_forward
from tests.conftest import make_tiny_gpt2

WHOLE = prefix_forward._whole_forward
RULES = "this movie was good and the acting was great , the story is fine and the music is great . "
ENDINGS = ["i loved the story", "bad", "what a terrible waste of time , bad from start", "good"]


def tiny_llama(vocab_size: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256,
    )
    return LlamaForCausalLM(config).eval()


def models(tokenizer):
    gpt2 = make_tiny_gpt2(tokenizer).eval()
    lora = get_peft_model(make_tiny_gpt2(tokenizer, seed=1), LoraConfig(r=4, target_modules=["c_attn"])).eval()
    return {"gpt2": gpt2, "llama": tiny_llama(len(tokenizer)), "gpt2-lora": lora}


def batch(tokenizer, endings=ENDINGS, rules=RULES):
    tokenizer.padding_side = "left"
    encoded = tokenizer([rules + ending for ending in endings], return_tensors="pt", padding=True)
    return encoded["input_ids"], encoded["attention_mask"]


def forward_and_gradients(model, value_head, ids, mask, shared: bool):
    model.zero_grad(set_to_none=True)
    value_head.zero_grad(set_to_none=True)
    forward = last_position_forward if shared else WHOLE
    logits, values = forward(model, ids, mask, value_head)
    (logits.log_softmax(-1)[:, :7].sum() + values.square().sum()).backward()
    trained = [p for p in [*model.parameters(), *value_head.parameters()] if p.requires_grad]
    return logits.detach(), values.detach(), [p.grad.clone() for p in trained]


@pytest.mark.parametrize("kind", ["gpt2", "llama", "gpt2-lora"])
def test_the_shared_prefix_gives_the_whole_forwards_logits_values_and_gradients(tokenizer, kind, monkeypatch):
    model = models(tokenizer)[kind]
    torch.manual_seed(2)
    value_head = ValueHead(model.config.hidden_size)
    ids, mask = batch(tokenizer)
    rows = [row[m.bool()] for row, m in zip(ids, mask, strict=True)]
    assert common_prefix_length(rows) >= MIN_SHARED_TOKENS and (mask == 0).any()  # shared rules, padded rows
    whole = forward_and_gradients(model, value_head, ids, mask, shared=False)
    monkeypatch.setattr(prefix_forward, "_whole_forward", lambda *args: pytest.fail("the prefix was not shared"))
    shared = forward_and_gradients(model, value_head, ids, mask, shared=True)
    torch.testing.assert_close(shared[0], whole[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared[1], whole[1], atol=1e-5, rtol=1e-5)
    assert len(shared[2]) == len(whole[2]) > 0
    for mine, theirs in zip(shared[2], whole[2], strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)


def test_prompts_that_share_little_take_one_whole_forward(tokenizer, monkeypatch):
    model = make_tiny_gpt2(tokenizer).eval()
    ids, mask = batch(tokenizer, rules="")  # the endings share no beginning
    calls = []
    monkeypatch.setattr(prefix_forward, "_whole_forward", lambda *args: calls.append(args) or ("whole", None))
    assert last_position_forward(model, ids, mask) == ("whole", None) and len(calls) == 1
    one, one_mask = batch(tokenizer, endings=ENDINGS[:1])  # a lone prompt has nothing to share
    assert last_position_forward(model, one, one_mask) == ("whole", None) and len(calls) == 2


def test_a_prompt_that_is_the_prefix_of_another_keeps_its_last_token_out_of_the_prefix(tokenizer, monkeypatch):
    model = make_tiny_gpt2(tokenizer).eval()
    ids, mask = batch(tokenizer, endings=["good", "good and the acting was great"])
    with torch.no_grad():
        whole, _ = WHOLE(model, ids, mask, None)
        monkeypatch.setattr(prefix_forward, "_whole_forward", lambda *args: pytest.fail("the prefix was not shared"))
        shared, _ = last_position_forward(model, ids, mask)
    torch.testing.assert_close(shared, whole, atol=1e-5, rtol=1e-5)
