"""Prompts that share their beginning: the shared prefix computed once gives the whole forward's logits, values and
gradients (GPT-2's learned positions, a Llama's rotary ones, a LoRA adapter; responses of several tokens, padded),
and is not used where the prompts share too little."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from marllm.models import prefix_forward
from marllm.models.policy import ValueHead, response_forward
from marllm.models.prefix_forward import (
    MIN_SHARED_TOKENS,
    common_prefix_length,
    last_position_forward,
    prompt_then_moves_forward,
    shared_prefix_response_forward,
)
from tests.conftest import make_tiny_gpt2

RULES = "this movie was good and the acting was great , the story is fine and the music is great . "
ENDINGS = ["i loved the story", "bad", "what a terrible waste of time , bad from start", "good"]
RESPONSES = ["good", "a boring and sad movie", "", "the plot"]  # one row answers with its first token only


def tiny_llama(vocab_size: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256,
    )
    return LlamaForCausalLM(config).eval()


def make_model(tokenizer, kind):
    if kind == "gpt2":
        return make_tiny_gpt2(tokenizer).eval()
    if kind == "llama":
        return tiny_llama(len(tokenizer))
    return get_peft_model(make_tiny_gpt2(tokenizer, seed=1), LoraConfig(r=4, target_modules=["c_attn"])).eval()


def prompts(tokenizer, endings=ENDINGS, rules=RULES):
    tokenizer.padding_side = "left"
    encoded = tokenizer([rules + ending for ending in endings], return_tensors="pt", padding=True)
    return encoded["input_ids"], encoded["attention_mask"]


def with_responses(tokenizer, ids, mask):
    """``[left-padded prompt | response, right-padded]``, each response at least one token (its first word's)."""
    tokens = [tokenizer.encode(text or "i") for text in RESPONSES]
    width = max(len(t) for t in tokens)
    response = torch.full((len(tokens), width), tokenizer.pad_token_id)
    response_mask = torch.zeros(len(tokens), width, dtype=mask.dtype)
    for i, t in enumerate(tokens):
        response[i, : len(t)], response_mask[i, : len(t)] = torch.tensor(t), 1
    return torch.cat([ids, response], 1), torch.cat([mask, response_mask], 1), ids.shape[1], response_mask


def results(model, value_head, forward, *args, read=None):
    """The logits, values and gradients of ``forward``; the loss reads the logits at ``read`` (a mask) only."""
    model.zero_grad(set_to_none=True)
    value_head.zero_grad(set_to_none=True)
    logits, values = forward(model, *args, value_head=value_head)
    (logits[read if read is not None else ...].log_softmax(-1)[..., :7].sum() + values.square().sum()).backward()
    trained = [p for p in [*model.parameters(), *value_head.parameters()] if p.requires_grad]
    return logits.detach(), values.detach(), [p.grad.clone() for p in trained]


def assert_same(shared, whole):
    torch.testing.assert_close(shared[0], whole[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared[1], whole[1], atol=1e-5, rtol=1e-5)
    assert len(shared[2]) == len(whole[2]) > 0
    for mine, theirs in zip(shared[2], whole[2], strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)


def forbid_the_whole_forward(monkeypatch):
    monkeypatch.setattr(prefix_forward, "response_forward", lambda *a, **k: pytest.fail("the prefix was not shared"))


@pytest.mark.parametrize("kind", ["gpt2", "llama", "gpt2-lora"])
def test_responses_after_a_shared_prefix_get_the_whole_forwards_results(tokenizer, kind, monkeypatch):
    model = make_model(tokenizer, kind)
    torch.manual_seed(2)
    value_head = ValueHead(model.config.hidden_size)
    ids, mask = prompts(tokenizer)
    rows = [row[m.bool()] for row, m in zip(ids, mask, strict=True)]
    assert common_prefix_length(rows) >= MIN_SHARED_TOKENS and (mask == 0).any()  # shared rules, padded prompts
    ids, mask, prompt_length, response_mask = with_responses(tokenizer, ids, mask)
    assert (response_mask == 0).any()  # padded responses
    whole = results(model, value_head, response_forward, ids, mask, prompt_length)
    forbid_the_whole_forward(monkeypatch)
    shared = results(model, value_head, shared_prefix_response_forward, ids, mask, prompt_length)
    assert shared[0].shape == whole[0].shape and shared[1].shape == whole[1].shape
    assert_same(shared, whole)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_the_next_token_after_prompts_with_a_shared_prefix(tokenizer, kind, monkeypatch):
    model = make_model(tokenizer, kind)
    torch.manual_seed(2)
    value_head = ValueHead(model.config.hidden_size)
    ids, mask = prompts(tokenizer)
    placeholder = ids[:, -1:]  # any token after each prompt: its own logits are not read
    with_placeholder = torch.cat([ids, placeholder], 1), torch.cat([mask, torch.ones_like(placeholder)], 1)
    whole = results(model, value_head, response_forward, *with_placeholder, ids.shape[1])
    whole = (whole[0][:, 0], whole[1][:, 0], whole[2])
    forbid_the_whole_forward(monkeypatch)
    assert_same(results(model, value_head, last_position_forward, ids, mask), whole)


def test_prompts_that_share_little_take_one_whole_forward(tokenizer, monkeypatch):
    model = make_model(tokenizer, "gpt2")
    calls = []
    monkeypatch.setattr(prefix_forward, "response_forward", lambda *args: calls.append(args) or ("whole", None))
    ids, mask = prompts(tokenizer, rules="")  # the endings share no beginning
    assert shared_prefix_response_forward(model, *with_responses(tokenizer, ids, mask)[:3]) == ("whole", None)
    one, one_mask = prompts(tokenizer, endings=ENDINGS[:1])  # a lone prompt has nothing to share
    assert shared_prefix_response_forward(model, one, one_mask, one.shape[1] - 1) == ("whole", None)
    assert len(calls) == 2


def test_a_prompt_that_is_the_prefix_of_another_keeps_its_last_token_out_of_the_prefix(tokenizer, monkeypatch):
    model = make_model(tokenizer, "gpt2")
    ids, mask = prompts(tokenizer, endings=["good", "good and the acting was great"])
    with torch.no_grad():
        whole, _ = response_forward(model, torch.cat([ids, ids[:, -1:]], 1), torch.cat([mask, mask[:, -1:]], 1),
                                    ids.shape[1])
        forbid_the_whole_forward(monkeypatch)
        shared, _ = last_position_forward(model, ids, mask)
    torch.testing.assert_close(shared, whole[:, 0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rules", [RULES, ""], ids=["shared-rules", "nothing-shared"])
@pytest.mark.parametrize("kind", ["llama", "gpt2-lora"])
def test_moves_scored_on_their_prompts_cache_get_the_whole_forwards_results(tokenizer, kind, rules):
    """Each prompt once, its moves (one to three of them, of one to several tokens) on its cache: the logits before
    every move token, the value after the prompt, and the gradients of [prompt | move] rows computed whole."""
    model = make_model(tokenizer, kind)
    torch.manual_seed(2)
    value_head = ValueHead(model.config.hidden_size)
    ids, mask = prompts(tokenizer, ENDINGS[:3], rules)
    moves = [["good", "bad movie"], ["the story is fine"], ["a", "boring and sad", "i loved the story"]]
    rows = torch.tensor([b for b, names in enumerate(moves) for _ in names])
    tokens = [tokenizer.encode(name) for names in moves for name in names]
    width = max(len(t) for t in tokens)
    move_ids = torch.full((len(tokens), width), tokenizer.pad_token_id)
    move_mask = torch.zeros(len(tokens), width, dtype=mask.dtype)
    for i, t in enumerate(tokens):
        move_ids[i, : len(t)], move_mask[i, : len(t)] = torch.tensor(t), 1
    packed = torch.cat([ids[rows], move_ids], 1), torch.cat([mask[rows], move_mask], 1), ids.shape[1]
    valid = move_mask.bool()  # the logits that predict a move's tokens (past its end, padding is predicted)
    whole = results(model, value_head, lambda *a, value_head: _value_after_prompt(response_forward(*a, value_head)),
                    *packed, read=valid)
    shared = results(model, value_head, prompt_then_moves_forward, ids, mask, rows, move_ids, move_mask, read=valid)
    assert shared[0].shape == whole[0].shape
    assert_same((shared[0][valid], shared[1], shared[2]), (whole[0][valid], whole[1], whole[2]))


def _value_after_prompt(outputs):
    logits, values = outputs
    return logits, values[:, 0]


def test_a_model_that_cannot_share_a_cache_takes_the_whole_forwards(tokenizer, monkeypatch):
    """A sharded model (its ranks must run the same forwards) or one with recurrent or sliding-window layers."""
    model = make_model(tokenizer, "gpt2")
    ids, mask = prompts(tokenizer)
    rows, moves, move_mask = torch.tensor([0, 0, 1]), ids[[0, 1, 2], -2:], torch.ones(3, 2, dtype=mask.dtype)
    with torch.no_grad():
        shared = prompt_then_moves_forward(model, ids, mask, rows, moves, move_mask)[0]
        monkeypatch.setattr(prefix_forward, "can_share", lambda model: False)
        calls = []
        monkeypatch.setattr(
            prefix_forward, "response_forward", lambda *args: calls.append(args) or response_forward(*args)
        )
        whole = prompt_then_moves_forward(model, ids, mask, rows, moves, move_mask)[0]
        shared_prefix_response_forward(model, *with_responses(tokenizer, ids, mask)[:3])
    assert len(calls) == 2
    torch.testing.assert_close(whole, shared, atol=1e-5, rtol=1e-5)
    llama = tiny_llama(len(tokenizer))
    monkeypatch.undo()
    assert prefix_forward.can_share(llama)
    llama.config.layer_types = ["full_attention", "sliding_attention"]
    assert not prefix_forward.can_share(llama)


def test_a_ppo_learner_on_prompts_with_a_shared_prefix_acts_and_updates_as_with_whole_forwards(tokenizer, monkeypatch):
    """The rollout's log-probs (policy and reference) and values, and the update's parameters, with the shared prefix
    computed once, against the same learner whose forwards are all whole (``MIN_SHARED_TOKENS`` out of reach)."""
    from tests.test_ppo_learner import make_learner

    def rollout_and_update():
        torch.manual_seed(0)
        learner = make_learner(tokenizer, mini_batch_size=4, ppo_epochs=2, rollout_from_generate=False)
        learner.act({"prompt": [RULES + ending for ending in ENDINGS]})
        learner.finish([1.0, -1.0, 0.5, 0.0])
        batch = learner.rollouts[0].tensors
        learner.update()
        return batch, torch.cat([p.detach().flatten() for p in learner.model.parameters()])

    calls = []
    real = prefix_forward._repeated_prefix_cache
    monkeypatch.setattr(prefix_forward, "_repeated_prefix_cache", lambda *args: calls.append(1) or real(*args))
    shared_batch, shared_weights = rollout_and_update()
    assert len(calls) == 1 + 2 + 2  # generation, the rollout's policy and reference forwards, each update step
    monkeypatch.setattr(prefix_forward, "MIN_SHARED_TOKENS", 10**6)
    whole_batch, whole_weights = rollout_and_update()
    for key in ("logprobs", "ref_logprobs", "values", "kl_full"):
        torch.testing.assert_close(shared_batch[key], whole_batch[key], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(shared_weights, whole_weights, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("capture", [False, True], ids=["plain", "captured"])
def test_generation_from_the_shared_prefix_samples_what_the_whole_prompts_sample(tokenizer, kind, capture, monkeypatch):
    """generate goes on from the common beginning's cache: the same responses from the same generator, and (captured
    for the rollout) the same logits and last hidden states up to rounding; the prompts come back in the new layout,
    which the rollout's forward reads as the old one."""
    from marllm.models.generation import generate_responses
    from marllm.models.generation_config import GenerationConfig

    model = make_model(tokenizer, kind)
    tokenizer.padding_side = "left"
    prompts_text = [RULES + ending for ending in ENDINGS]
    generation = GenerationConfig(min_new_tokens=2, max_new_tokens=6, top_k=0, top_p=1.0, repetition_penalty=1.1)

    def sample():
        torch.manual_seed(7)
        return generate_responses(model, tokenizer, prompts_text, 6, generation, capture=capture)

    calls = []
    real = prefix_forward._repeated_prefix_cache
    monkeypatch.setattr(prefix_forward, "_repeated_prefix_cache", lambda *args: calls.append(1) or real(*args))
    shared = sample()
    assert calls == [1]
    monkeypatch.setattr(prefix_forward, "MIN_SHARED_TOKENS", 10**6)
    whole = sample()
    assert shared.texts == whole.texts
    assert torch.equal(shared.response, whole.response) and torch.equal(shared.mask, whole.mask)
    assert not torch.equal(shared.prompt_mask, whole.prompt_mask)  # the padding moved behind the prefix
    if capture:
        torch.testing.assert_close(shared.logits, whole.logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(shared.hidden, whole.hidden, atol=1e-4, rtol=1e-4)
    for batch in (shared, whole):  # what the rollout forwards over: the same logits from either layout
        ids = torch.cat([batch.prompt_ids, batch.response], 1)
        mask = torch.cat([batch.prompt_mask, torch.ones_like(batch.response)], 1)
        with torch.no_grad():
            batch.forward = response_forward(model, ids, mask, batch.prompt_ids.shape[1])[0]
    torch.testing.assert_close(shared.forward, whole.forward, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("repetition_penalty", [1.1, 1.5])
def test_the_sampling_processors_on_the_shared_prefix_layout_equal_those_on_the_whole_prompts(
    tokenizer, repetition_penalty
):
    """generate's processors read the ids of the layout it is given: the gap between the prefix and a shorter row's
    rest must add no token to what the repetition penalty counts (a gap of token 0 penalised EOS here)."""
    from marllm.models.generation_config import GenerationConfig
    from marllm.models.logits_processing import sampling_processors
    from marllm.models.prefix_forward import shared_prefix_prompts

    model = make_tiny_gpt2(tokenizer).eval()
    ids, mask = prompts(tokenizer)
    shared_ids, shared_mask, cache = shared_prefix_prompts(model, ids, mask)
    assert cache is not None and not torch.equal(shared_mask, mask)  # the gap sits behind the prefix
    generation = GenerationConfig(repetition_penalty=repetition_penalty, top_k=0, top_p=1.0)
    logits = torch.randn(len(ids), len(tokenizer), generator=torch.Generator().manual_seed(0))
    whole = sampling_processors(generation, mask, tokenizer.eos_token_id, 4)(ids, logits.clone())
    shared = sampling_processors(generation, shared_mask, tokenizer.eos_token_id, 4)(shared_ids, logits.clone())
    torch.testing.assert_close(shared, whole, atol=0, rtol=0)
    assert not torch.equal(whole, logits)  # the penalty did act
