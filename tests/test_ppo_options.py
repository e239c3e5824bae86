"""PPO switches and guards on a tiny GPT-2: LoRA on embeddings, half precision, score scaling, the ratio guard and
the loss reduction over an optimiser step."""

import numpy as np
import pytest
import torch

from marllm.algorithms import GenerationConfig, PPOConfig, PPOLearner
from marllm.models.lora import LoraSettings, adapter_parameters, attach_adapters
from tests.conftest import make_tiny_gpt2

RESPONSE_LENGTH = 8


def make_learner(tokenizer, seed=0, dtype=torch.float32, **ppo):
    settings = {"mini_batch_size": 8, "learning_rate": 3e-3, "init_kl_coef": 0.01, "kl_control": "fixed"}
    settings.update(ppo)
    model = make_tiny_gpt2(tokenizer, seed=seed).to(dtype)
    reference = make_tiny_gpt2(tokenizer, seed=seed).to(dtype).requires_grad_(False).eval()
    # Every response runs to exactly RESPONSE_LENGTH tokens, so tests can shape the response mask themselves.
    generation = GenerationConfig(RESPONSE_LENGTH, RESPONSE_LENGTH, stop_at_eos=False)
    return PPOLearner(
        "llm1",
        model=model,
        tokenizer=tokenizer,
        reference=reference,
        config=PPOConfig.from_flat(**settings),
        generation=generation,
        seed=seed,
    )


def parameter_vector(learner):
    params = list(learner.model.parameters()) + list(learner.value_head.parameters())
    return torch.cat([p.detach().float().flatten() for p in params])


# --- LoRA on embeddings -----------------------------------------------------------------------------------------


def lora_learners(tokenizer, dtype=torch.float32):
    base = make_tiny_gpt2(tokenizer).to(dtype)
    shared = attach_adapters(base, ["llm1", "llm2"], LoraSettings(r=2, alpha=4, target_modules=["c_attn", "wte"]))
    config = PPOConfig.from_flat(mini_batch_size=8, learning_rate=1e-2, ppo_epochs=2, score_transform="none")
    generation = GenerationConfig(4, 6)
    return {
        name: PPOLearner(
            name,
            model=shared,
            tokenizer=tokenizer,
            reference=None,
            config=config,
            generation=generation,
            seed=i,
            adapter=name,
        )
        for i, name in enumerate(["llm1", "llm2"])
    }


def test_lora_embedding_adapters_are_optimised_and_trained(tokenizer):
    learners = lora_learners(tokenizer)
    llm1 = learners["llm1"]
    llm1.activate()
    in_optimizer = {id(p) for group in llm1.optimizer.param_groups for p in group["params"]}
    trainable = {n: p for n, p in llm1.model.named_parameters() if p.requires_grad and "llm1" in n.split(".")}
    assert any("lora_embedding" in n for n in trainable)
    missing = [n for n, p in trainable.items() if id(p) not in in_optimizer]
    assert not missing, f"trainable adapter parameters left out of the optimiser: {missing}"
    # nothing of the other learner, nor of the base
    assert all("llm1" in n.split(".") for n, p in llm1.model.named_parameters() if id(p) in in_optimizer)

    embedding = {n: p.detach().clone() for n, p in llm1.model.named_parameters() if "lora_embedding" in n}
    llm1.act({"prompt": ["this movie was"] * 8})
    llm1.finish(np.linspace(-1.0, 1.0, 8))
    llm1.update()  # two epochs: lora_embedding_A starts at 0, so B only gets a gradient in the second step
    after = dict(llm1.model.named_parameters())
    changed = {n for n, before in embedding.items() if not torch.equal(after[n], before)}
    assert {n for n in changed if n.endswith(".llm1")} == {n for n in embedding if n.endswith(".llm1")}
    assert not any(n.endswith(".llm2") for n in changed)


def test_adapter_parameters_match_whole_name_parts(tokenizer):
    base = make_tiny_gpt2(tokenizer)
    shared = attach_adapters(base, ["llm1", "llm10"], LoraSettings(r=2, alpha=4, target_modules=["c_attn", "wte"]))
    names = {id(p): n for n, p in shared.named_parameters()}
    picked = [names[id(p)] for p in adapter_parameters(shared, "llm1")]
    assert picked and all("llm1" in n.split(".") for n in picked)
    assert any(n.endswith("lora_embedding_A.llm1") for n in picked)


# --- half precision ---------------------------------------------------------------------------------------------


def test_full_parameter_training_in_float16_is_refused(tokenizer):
    # bfloat16 trains with stochastic rounding (tests/test_stochastic_rounding.py)
    with pytest.raises(ValueError, match=r"model.dtype.*model.lora.*float32"):
        make_learner(tokenizer, dtype=torch.float16)


def test_half_precision_lora_adapters_are_refused(tokenizer):
    from peft import LoraConfig, get_peft_model

    base = make_tiny_gpt2(tokenizer).to(torch.bfloat16)
    config = LoraConfig(r=2, lora_alpha=4, target_modules=["c_attn"], task_type="CAUSAL_LM")
    shared = get_peft_model(base, config, adapter_name="llm1", autocast_adapter_dtype=False)
    with pytest.raises(ValueError, match=r"bfloat16 parameters directly \(adapter 'llm1' was made without peft's"):
        PPOLearner(
            "llm1",
            model=shared,
            tokenizer=tokenizer,
            reference=None,
            config=PPOConfig.from_flat(mini_batch_size=8),
            adapter="llm1",
        )


def test_lora_on_a_bfloat16_base_keeps_float32_adapters_and_trains(tokenizer):
    learners = lora_learners(tokenizer, dtype=torch.bfloat16)
    llm1 = learners["llm1"]
    optimised = [p for group in llm1.optimizer.param_groups for p in group["params"]]
    assert all(p.dtype == torch.float32 for p in optimised)
    before = parameter_vector(llm1)
    llm1.act({"prompt": ["this movie was"] * 8})
    llm1.finish(np.linspace(-1.0, 1.0, 8))
    stats = llm1.update()
    assert np.isfinite(stats["loss/total"])
    assert not torch.equal(parameter_vector(llm1), before)


# --- score scaling ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("transform", "expected"), [("scale", 1.0), ("normalize", 0.0)])
def test_constant_first_batch_is_not_blown_up_by_score_scaling(tokenizer, transform, expected):
    """Every answer right (0/1 reward all 1): no spread to scale by yet, so the score is left unscaled."""
    learner = make_learner(tokenizer, score_transform=transform, ppo_epochs=1)
    learner.act({"prompt": ["a"] * 8})
    learner.finish([1.0] * 8)
    stats = learner.update()
    assert stats["score"] == pytest.approx(expected, abs=1e-6)
    assert np.isfinite(stats["loss/value"]) and stats["loss/value"] < 10.0
    # once the scores spread, scaling by the running std resumes
    learner.act({"prompt": ["a"] * 8})
    learner.finish([0.0, 1.0] * 4)
    stats = learner.update()
    all_scores = np.array([1.0] * 8 + [0.0, 1.0] * 4)
    shift = all_scores.mean() if transform == "normalize" else 0.0
    assert stats["score"] == pytest.approx((0.5 - shift) / all_scores.std(), rel=1e-6)


# --- ratio guard ------------------------------------------------------------------------------------------------


def rewarded_learner(tokenizer, **ppo):
    torch.manual_seed(3)
    learner = make_learner(tokenizer, seed=3, **ppo)
    learner.act({"prompt": ["the story"] * 8})
    learner.finish(np.linspace(-1.0, 1.0, 8))
    return learner


def test_ratio_guard_skips_mini_batches_whose_mean_ratio_is_too_large(tokenizer):
    learner = rewarded_learner(tokenizer, mini_batch_size=4, gradient_accumulation_steps=1, ppo_epochs=2)
    assert learner.config.guards.ratio_threshold == 10.0
    # old log-probs 5 nats lower: every ratio is e^5 ≈ 148, as after a policy blow-up
    learner.rollouts[0].tensors.logprobs -= 5.0
    before = parameter_vector(learner)
    stats = learner.update()
    assert stats["skipped_minibatch_fraction"] == 1.0
    assert stats["ratio"] == pytest.approx(np.exp(5.0), rel=1e-3)
    assert torch.equal(parameter_vector(learner), before)
    assert all(p.grad is None for p in learner.model.parameters())


def test_ratio_guard_off_or_not_firing_trains(tokenizer):
    unguarded = rewarded_learner(tokenizer, ratio_threshold=None)
    unguarded.rollouts[0].tensors.logprobs -= 5.0
    before = parameter_vector(unguarded)
    stats = unguarded.update()
    assert stats["skipped_minibatch_fraction"] == 0.0
    assert not torch.equal(parameter_vector(unguarded), before)

    guarded = rewarded_learner(tokenizer)
    stats = guarded.update()
    assert stats["skipped_minibatch_fraction"] == 0.0 and stats["ratio"] < 10.0


# --- loss reduction ---------------------------------------------------------------------------------------------


def update_with_uneven_lengths(tokenizer, loss_reduction, mini_batch_size, accumulation):
    """One optimiser step by plain SGD over 8 responses: seven of 1 token and one of 8, split into mini-batches.

    SGD makes the update proportional to the accumulated gradient (Adam's first step is ≈ lr·sign(g), which would
    hide how the tokens are weighted). Returns (parameters before, parameters after).
    """
    torch.manual_seed(1)
    learner = make_learner(
        tokenizer,
        seed=1,
        ppo_epochs=1,
        mini_batch_size=mini_batch_size,
        gradient_accumulation_steps=accumulation,
        loss_reduction=loss_reduction,
        score_transform="none",
    )
    parameters = [p for group in learner.optimizer.param_groups for p in group["params"]]
    learner.optimizer = torch.optim.SGD(parameters, lr=1.0)
    learner.act({"prompt": ["the story"] * 8})
    tensors = learner.rollouts[0].tensors
    assert tensors.mask.shape[1] == RESPONSE_LENGTH
    lengths = torch.tensor([1] * 7 + [RESPONSE_LENGTH])
    tensors.mask = (torch.arange(RESPONSE_LENGTH)[None, :] < lengths[:, None]).float()
    tensors.kl = tensors.kl * tensors.mask
    learner.finish(np.linspace(-1.0, 1.0, 8))
    before = parameter_vector(learner)
    learner.update()
    return before, parameter_vector(learner)


def test_step_token_mean_makes_accumulation_match_one_big_mini_batch(tokenizer):
    before, big = update_with_uneven_lengths(tokenizer, "step_token_mean", 8, 1)
    _, accumulated = update_with_uneven_lengths(tokenizer, "step_token_mean", 2, 4)
    update = (big - before).abs().max()
    assert update > 0
    assert (accumulated - big).abs().max() <= 1e-3 * update


def test_minibatch_token_mean_weights_tokens_by_their_mini_batch(tokenizer):
    """The default (the paper's and TRL's): each mini-batch's token mean counts equally, whatever its length."""
    before, big = update_with_uneven_lengths(tokenizer, "minibatch_token_mean", 8, 1)
    _, accumulated = update_with_uneven_lengths(tokenizer, "minibatch_token_mean", 2, 4)
    update = (big - before).abs().max()
    assert (accumulated - big).abs().max() > 0.1 * update
    # with one mini-batch per step the two reductions are the same
    _, step_mean = update_with_uneven_lengths(tokenizer, "step_token_mean", 8, 1)
    assert (step_mean - big).abs().max() <= 1e-3 * update


# --- config -----------------------------------------------------------------------------------------------------


def test_defaults_keep_the_papers_behaviour():
    config = PPOConfig()
    assert config.batching.loss_reduction == "minibatch_token_mean"
    assert config.guards.ratio_threshold == 10.0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"ratio_threshold": 1.0}, r"ppo.guards.ratio_threshold must be a number > 1 or null .*got 1.0"),
        ({"ratio_threshold": float("inf")}, r"ppo.guards.ratio_threshold must be a number > 1 or null"),
        (
            {"loss_reduction": "sum"},
            r"ppo.batching.loss_reduction must be one of \['minibatch_token_mean', 'step_token_mean'\]",
        ),
    ],
)
def test_new_options_are_validated(settings, message):
    with pytest.raises(ValueError, match=message):
        PPOConfig.from_flat(**settings)
