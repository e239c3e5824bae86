"""Which distribution the log-probs come from (GenerationConfig.logprobs_from), and the chunked vocabulary math."""

import pytest
import torch
import torch.nn.functional as F

from marllm.algorithms import GenerationConfig, PPOConfig, PPOLearner, core
from marllm.algorithms.core import (
    entropy_of,
    floor_logprobs,
    full_kl,
    logprobs_and_entropy,
    logprobs_and_full_kl,
    logprobs_of,
)
from marllm.models.generation import (
    generate_responses,
    logprob_logits,
    process_logits,
    reference_logprob_logits,
    reference_processors,
    sampling_processors,
)
from marllm.models.policy import response_forward
from tests.conftest import make_tiny_gpt2

PROMPTS = ["this movie was", "a", "i hated the ending , a", "the cast is good"] * 4


def confident_gpt2(tokenizer, seed=0):
    """A tiny GPT-2 with logits of a few units (a random one's are ~0.1, on which a repetition penalty does nothing)."""
    model = make_tiny_gpt2(tokenizer, seed=seed)
    with torch.no_grad():
        model.transformer.ln_f.weight.mul_(30.0)
    return model


def make_learner(tokenizer, generation, **ppo):
    settings = {"mini_batch_size": len(PROMPTS), "learning_rate": 1e-3, "kl_control": "fixed", "init_kl_coef": 0.05}
    settings.update(ppo)
    model = confident_gpt2(tokenizer)
    reference = confident_gpt2(tokenizer).requires_grad_(False).eval()
    return PPOLearner(
        "llm1",
        model=model,
        tokenizer=tokenizer,
        reference=reference,
        config=PPOConfig.from_flat(**settings),
        generation=generation,
        seed=0,
    )


def record_generate_scores(model):
    """Make ``model.generate`` also keep its processed scores, the logits of what it sampled from: (B, L, V)."""
    original = model.generate
    recorded = {}

    def generate(**kwargs):
        as_dict = kwargs.get("return_dict_in_generate", False)  # the rollout from generate's forwards asks for it
        output = original(**{**kwargs, "output_scores": True, "return_dict_in_generate": True})
        recorded["scores"] = torch.stack(output.scores, 1)
        return output if as_dict else output.sequences

    model.generate = generate
    return recorded


def sampler_logprobs(recorded, batch):
    """log μ(a): the log-probs of the sampled tokens under the distributions generate drew them from."""
    return torch.gather(F.log_softmax(recorded["scores"], -1), 2, batch.response.unsqueeze(-1)).squeeze(-1)


SAMPLING_SETTINGS = [
    {"repetition_penalty": 1.3, "top_k": 20},
    {"repetition_penalty": 1.3, "top_p": 0.8, "temperature": 0.7},
    {"repetition_penalty": 1.3, "top_k": 20, "stop_at_eos": False},
]


@pytest.mark.parametrize("settings", SAMPLING_SETTINGS)
def test_sampling_logprobs_are_the_samplers_and_the_first_ratio_is_one(tokenizer, settings, monkeypatch):
    torch.manual_seed(0)
    learner = make_learner(tokenizer, GenerationConfig(6, 6, logprobs_from="sampling", **settings))
    recorded = record_generate_scores(learner.model)
    learner.act({"prompt": PROMPTS})
    batch = learner.rollouts[0].tensors
    mask = batch.mask.bool()
    mu = sampler_logprobs(recorded, batch)
    # Rollout log-probs = log μ(a) per token, up to the KV cache's rounding against a full forward.
    assert torch.allclose(batch.logprobs[mask], mu[mask], rtol=1e-4, atol=1e-4)
    assert abs((mu - batch.logprobs)[mask].mean().item()) < 1e-5
    # The reference is the same model: same processing, same kept tokens, so the KL is 0.
    assert torch.allclose(batch.ref_logprobs[mask], batch.logprobs[mask], rtol=1e-5, atol=1e-5)
    assert batch.kl_full[mask].abs().max().item() < 1e-5

    seen = []
    clipped_policy_loss = core.clipped_policy_loss

    def recording_loss(logprobs, old_logprobs, *args):
        seen.append((logprobs.detach().clone(), old_logprobs.clone(), args[1].bool()))
        return clipped_policy_loss(logprobs, old_logprobs, *args)

    monkeypatch.setattr(core, "clipped_policy_loss", recording_loss)
    learner.finish(torch.linspace(0, 1, len(PROMPTS)).numpy())
    stats = learner.update()
    logprobs, old, first_mask = seen[0]
    # The first mini-batch runs the rollout's policy on the rollout's tokens: the ratio is exactly 1.
    assert torch.allclose(logprobs[first_mask], old[first_mask], rtol=1e-5, atol=1e-5)
    assert all(torch.isfinite(torch.tensor(v)) for k, v in stats.items() if not k.startswith("time"))


def test_tempered_logprobs_are_biased_under_a_repetition_penalty(tokenizer):
    torch.manual_seed(0)
    learner = make_learner(tokenizer, GenerationConfig(8, 8, repetition_penalty=1.3))  # logprobs_from="tempered"
    recorded = record_generate_scores(learner.model)
    learner.act({"prompt": PROMPTS})
    batch = learner.rollouts[0].tensors
    mask = batch.mask.bool()
    bias = (sampler_logprobs(recorded, batch) - batch.logprobs)[mask]
    # The sampler penalised repeats that π did not: log μ(a) − log π(a) is not 0 on average.
    assert bias.mean().item() > 0.05, bias.mean().item()


def test_temperature_applies_to_policy_and_reference_logprobs(tokenizer):
    torch.manual_seed(0)
    learner = make_learner(tokenizer, GenerationConfig(6, 6, temperature=2.0, repetition_penalty=1.0))
    recorded = record_generate_scores(learner.model)
    learner.act({"prompt": PROMPTS})
    rollout = learner.rollouts[0]
    batch = rollout.tensors
    mask = batch.mask.bool()
    with torch.no_grad():
        logits, _ = response_forward(learner.model, batch.input_ids, batch.attention_mask, rollout.prompt_length)
        ref_logits, _ = response_forward(
            learner.reference, batch.input_ids, batch.attention_mask, rollout.prompt_length
        )
    expected = logprobs_of(logits / 2.0, batch.response)
    assert torch.allclose(batch.logprobs[mask], expected[mask], rtol=1e-5, atol=1e-5)
    assert torch.allclose(batch.ref_logprobs[mask], logprobs_of(ref_logits / 2.0, batch.response)[mask], atol=1e-5)
    assert not torch.allclose(batch.logprobs[mask], logprobs_of(logits, batch.response)[mask], atol=1e-2)
    # With no other processor, the tempered distribution is the sampler's.
    assert torch.allclose(batch.logprobs[mask], sampler_logprobs(recorded, batch)[mask], rtol=1e-4, atol=1e-4)


def test_the_switch_does_not_change_sampling(tokenizer):
    responses = {}
    for source in ("tempered", "sampling"):
        learner = make_learner(tokenizer, GenerationConfig(6, 6, top_k=20, logprobs_from=source))
        torch.manual_seed(1)
        responses[source] = learner.act({"prompt": PROMPTS})
    assert responses["tempered"] == responses["sampling"]


@pytest.mark.parametrize(
    "name,value", [("no_repeat_ngram_size", 2), ("min_new_tokens", 3), ("num_beams", 2), ("guidance_scale", 1.5)]
)
def test_generate_refuses_a_model_config_that_adds_processors(tokenizer, name, value):
    model = make_tiny_gpt2(tokenizer)
    setattr(model.generation_config, name, value)
    tokenizer.padding_side = "left"
    with pytest.raises(ValueError, match=name):
        generate_responses(model, tokenizer, ["this movie was"], 4, GenerationConfig(4, 4))


def test_generate_accepts_a_model_config_of_ids_lengths_and_the_settings_it_overrides(tokenizer):
    """A chat model's usual generation_config (sampling defaults, a max_length) changes nothing: from the same seed,
    the same tokens as the same weights with transformers' defaults, to the budget asked for."""
    chat_like, plain = confident_gpt2(tokenizer), confident_gpt2(tokenizer)
    # sampling defaults that generate_responses overrides explicitly, and a max_length its budget overrides
    for name, value in {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "max_length": 64}.items():
        setattr(chat_like.generation_config, name, value)
    tokenizer.padding_side = "left"
    neutral = GenerationConfig(8, 8, repetition_penalty=1.0, stop_at_eos=False)

    def sample(model, generation):
        torch.manual_seed(0)
        return generate_responses(model, tokenizer, PROMPTS, 8, generation)

    batch = sample(chat_like, neutral)
    assert batch.response.shape == (len(PROMPTS), 8)
    assert torch.equal(batch.response, sample(plain, neutral).response)
    # and the model's settings, had they applied, would have sampled other tokens
    applied = GenerationConfig(8, 8, temperature=0.6, top_p=0.9, repetition_penalty=1.0, stop_at_eos=False)
    assert not torch.equal(batch.response, sample(plain, applied).response)


@pytest.mark.parametrize("overwrite", [False, True])
def test_process_logits_values_and_gradient(tokenizer, overwrite):
    torch.manual_seed(0)
    generation = GenerationConfig(4, 4, repetition_penalty=1.3, top_k=5, temperature=0.7, stop_at_eos=False)
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    input_ids = torch.randint(1, 50, (2, 7))
    input_ids[0, 3:] = input_ids[0, 1]  # a response repeating a prompt token: the penalty applies
    leaf = (torch.randn(2, 4, 50) * 3).requires_grad_()
    processors = sampling_processors(generation, prompt_mask, tokenizer.eos_token_id, 4)
    # Autograd straight through the processors, position by position, as the reference.
    direct = torch.stack([processors(input_ids[:, : 3 + t], leaf[:, t]) for t in range(4)], 1)
    processed = process_logits(processors, input_ids, leaf * 1.0, 3, overwrite_logits=overwrite)
    in_place = process_logits(processors, input_ids, leaf.detach().clone(), 3, inplace=True)
    assert torch.equal(processed.detach(), direct.detach()) and torch.equal(in_place, direct.detach())
    assert (torch.isneginf(processed).sum(-1) == 50 - 5).all()  # top-k keeps 5 of 50 (no ties in random logits)
    tokens = processed.detach().argmax(-1)  # kept tokens, as sampled ones are
    weights = torch.randn(2, 4)
    (expected,) = torch.autograd.grad((logprobs_of(direct, tokens) * weights).sum(), leaf)
    (grad,) = torch.autograd.grad((logprobs_of(processed, tokens) * weights).sum(), leaf)
    # Two exact formulas in float32, summed in different orders: equal to a few ulps of the largest gradient.
    assert torch.allclose(grad, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    assert (grad != 0).any()


def test_reference_is_processed_alike_and_restricted_to_the_policys_tokens(tokenizer):
    torch.manual_seed(0)
    generation = GenerationConfig(3, 3, repetition_penalty=1.3, top_k=4, temperature=0.5, logprobs_from="sampling")
    input_ids = torch.randint(1, 30, (2, 5))
    attention_mask = torch.ones_like(input_ids)
    policy, reference = torch.randn(2, 3, 30) * 3, torch.randn(2, 3, 30) * 3
    settings = (input_ids, attention_mask, 2, generation, tokenizer.eos_token_id)
    processed = logprob_logits(policy, *settings)
    ref = reference_logprob_logits(reference, processed, *settings)
    assert torch.equal(torch.isneginf(ref), torch.isneginf(processed))  # the policy's 4 tokens, not the reference's
    kept = ~torch.isneginf(ref)
    # On those tokens: the reference with temperature and repetition penalty, as the policy got them.
    reweighted = process_logits(
        reference_processors(sampling_processors(generation, attention_mask[:, :2], tokenizer.eos_token_id, 3)),
        input_ids,
        reference,
        2,
    )
    assert torch.equal(ref[kept], reweighted[kept])
    assert torch.isfinite(full_kl(processed, ref)).all()


def test_half_precision_logits_are_processed_in_float32(tokenizer):
    generation = GenerationConfig(3, 3, repetition_penalty=1.3, temperature=0.7, logprobs_from="sampling")
    input_ids = torch.randint(1, 30, (2, 5))
    logits = (torch.randn(2, 3, 30) * 3).bfloat16()
    settings = (input_ids, torch.ones_like(input_ids), 2, generation, tokenizer.eos_token_id)
    processed = logprob_logits(logits, *settings)
    assert processed.dtype == torch.float32
    assert torch.equal(processed, logprob_logits(logits.float(), *settings))


# ------------------------------------------------------------------------------------------------ chunked math
@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(core, "_CHUNK_ELEMENTS", 25)  # two positions per chunk: chunks end inside rows


def test_chunked_vocabulary_math_matches_the_direct_formulas(small_chunks):
    torch.manual_seed(0)
    policy, reference = torch.randn(7, 3, 11) * 3, torch.randn(7, 3, 11) * 3
    policy[0, 0, :4] = -torch.inf  # tokens a top-k removed: probability 0, no NaN
    tokens = torch.randint(4, 11, (7, 3))
    logp, logq = F.log_softmax(policy, -1), F.log_softmax(reference, -1)
    p = logp.exp()
    expected_kl = torch.where(p > 0, p * (logp - logq), 0.0).sum(-1)
    expected_entropy = -torch.where(p > 0, p * logp, 0.0).sum(-1)
    expected_logprobs = torch.gather(logp, 2, tokens.unsqueeze(-1)).squeeze(-1)
    logprobs, ref_logprobs, kl = logprobs_and_full_kl(policy, reference, tokens)
    assert torch.allclose(logprobs, expected_logprobs, atol=1e-5)
    assert torch.allclose(ref_logprobs, torch.gather(logq, 2, tokens.unsqueeze(-1)).squeeze(-1), atol=1e-5)
    assert torch.allclose(kl, expected_kl, atol=1e-5) and torch.allclose(full_kl(policy, reference), kl, atol=1e-5)
    assert torch.allclose(entropy_of(policy), expected_entropy, atol=1e-5)
    fused_logprobs, fused_entropy = logprobs_and_entropy(policy, tokens)
    assert torch.allclose(fused_logprobs, expected_logprobs, atol=1e-5)
    assert torch.allclose(fused_entropy, expected_entropy, atol=1e-5)


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprob_gradient_matches_autograd_through_log_softmax(small_chunks, dtype, overwrite):
    torch.manual_seed(0)
    leaf = (torch.randn(5, 4, 13) * 2).to(dtype).requires_grad_()
    tokens = torch.randint(0, 13, (5, 4))
    weights = torch.randn(5, 4)
    (expected,) = torch.autograd.grad(
        (torch.gather(F.log_softmax(leaf.float(), -1), 2, tokens.unsqueeze(-1)).squeeze(-1) * weights).sum(), leaf
    )
    logits = leaf * 1.0  # as the LM head's output: a non-leaf whose producer's backward does not read it
    logprobs, _ = logprobs_and_entropy(logits, tokens, overwrite_logits=overwrite)
    (grad,) = torch.autograd.grad((logprobs * weights).sum(), leaf)
    assert grad.dtype == dtype
    # float32: a few ulps of the largest gradient (summation orders differ); bfloat16: its 8-bit mantissa.
    tolerance = (1e-5 if dtype == torch.float32 else 1e-2) * expected.abs().max().item()
    assert torch.allclose(grad.float(), expected.float(), rtol=tolerance, atol=tolerance)


def test_floor_logprobs_keeps_finite_values_and_stops_gradient():
    logprobs = torch.tensor([-1.5, -torch.inf, -200.0], requires_grad=True)
    floored = floor_logprobs(logprobs)
    assert floored.tolist() == pytest.approx([-1.5, core.LOGPROB_FLOOR, -200.0])
    floored.sum().backward()
    assert logprobs.grad.tolist() == [1.0, 0.0, 1.0]
