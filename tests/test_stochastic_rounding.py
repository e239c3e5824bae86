"""Pure bfloat16 full fine-tuning: Adam computed in float32 and written back with stochastic rounding, unbiased where
rounding to nearest loses PPO's small updates; a bfloat16 learner trains, keeps 8 bytes per parameter, and resumes
exactly; float32 learners keep torch's Adam."""

from __future__ import annotations

import pytest
import torch

from marllm.algorithms import GenerationConfig, PPOConfig, PPOLearner
from marllm.algorithms.stochastic_rounding import StochasticRoundingAdam, stochastic_round_to_bfloat16
from marllm.testing import check_resume_equals_uninterrupted
from tests.conftest import make_tiny_gpt2

PROMPTS = ["this movie was", "what a", "the actors in this movie were all", "i think"] * 2
SPACING = 2.0**-7  # between bfloat16 neighbours in [1, 2)


@pytest.mark.parametrize("fraction", [0.01, 0.3, 0.5, 0.9])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_stochastic_rounding_is_unbiased(fraction, sign):
    lower = 1.5
    value = torch.tensor(sign * (lower + fraction * SPACING), dtype=torch.float32)
    draws = 40_000
    generator = torch.Generator().manual_seed(0)
    rounded = stochastic_round_to_bfloat16(value.expand(draws).contiguous(), generator)
    assert rounded.dtype == torch.bfloat16
    # Only the two neighbours, the upper one with probability ``fraction``.
    assert set(rounded.abs().float().unique().tolist()) <= {lower, lower + SPACING}
    mean = rounded.double().mean().item()
    standard_error = SPACING * (fraction * (1 - fraction) / draws) ** 0.5
    assert abs(mean - value.item()) < 4 * standard_error  # 4 standard errors: fails by chance once in ~16,000 runs
    # Exact values (bfloat16 already) and infinities stay as they are.
    exact = torch.tensor([1.0, -2.5, 0.0, float("inf"), -float("inf")])
    assert torch.equal(stochastic_round_to_bfloat16(exact, generator).float(), exact)


def test_updates_far_below_the_spacing_move_a_bfloat16_weight_only_with_stochastic_rounding():
    # A constant gradient: Adam's step is the learning rate, here 100 times below the weight's spacing.
    lr, steps = SPACING / 100, 100
    weights = {
        "nearest": torch.nn.Parameter(torch.ones(1000, dtype=torch.bfloat16)),
        "stochastic": torch.nn.Parameter(torch.ones(1000, dtype=torch.bfloat16)),
        "float32": torch.nn.Parameter(torch.ones(1000)),
    }
    optimizers = {
        "nearest": torch.optim.Adam([weights["nearest"]], lr=lr),  # rounds each step's weight to nearest
        "stochastic": StochasticRoundingAdam([weights["stochastic"]], lr=lr, seed=0),
        "float32": torch.optim.Adam([weights["float32"]], lr=lr),
    }
    for _ in range(steps):
        for name, weight in weights.items():
            weight.grad = torch.ones_like(weight)
            optimizers[name].step()
    moved = {name: 1.0 - weight.detach().double().mean().item() for name, weight in weights.items()}
    assert moved["nearest"] == 0.0  # every update rounded away
    assert moved["float32"] == pytest.approx(steps * lr, rel=1e-3)
    # In expectation as float32 (one spacing in all); the mean over 1000 weights is within ~3% of it.
    assert moved["stochastic"] == pytest.approx(moved["float32"], rel=0.15)
    state = optimizers["stochastic"].state[weights["stochastic"]]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16


def bf16_learner(tokenizer, seed=0, **ppo):
    settings = {"mini_batch_size": 8, "learning_rate": 1e-3, "init_kl_coef": 0.01, "kl_control": "fixed"} | ppo
    model = make_tiny_gpt2(tokenizer, seed=seed).to(torch.bfloat16)
    reference = make_tiny_gpt2(tokenizer, seed=seed).to(torch.bfloat16).requires_grad_(False).eval()
    return PPOLearner(
        "llm1",
        model=model,
        tokenizer=tokenizer,
        reference=reference,
        config=PPOConfig.from_flat(**settings),
        generation=GenerationConfig(4, 8),
        seed=seed,
    )


def test_a_bfloat16_learner_trains_with_eight_bytes_per_parameter(tokenizer):
    torch.manual_seed(0)
    learner = bf16_learner(tokenizer)
    assert isinstance(learner.optimizer, StochasticRoundingAdam)
    before = [p.detach().clone() for p in learner.model.parameters()]
    learner.act({"prompt": PROMPTS})
    learner.finish(torch.linspace(-1, 1, len(PROMPTS)).tolist())
    gradient_sizes = {}  # the gradients are dropped after each step: their element size is recorded as they come
    for parameter in learner.model.parameters():
        parameter.register_post_accumulate_grad_hook(lambda p: gradient_sizes.__setitem__(p, p.grad.element_size()))
    metrics = learner.update()
    assert all(torch.isfinite(torch.tensor(value)) for value in metrics.values() if isinstance(value, float))
    changed = sum(not torch.equal(p, b) for p, b in zip(learner.model.parameters(), before, strict=True))
    assert changed == len(before)  # every weight tensor moved
    trunk, stored = 0, 0
    for parameter in learner.model.parameters():
        state = learner.optimizer.state[parameter]
        tensors = [parameter, state["exp_avg"], state["exp_avg_sq"]]
        assert all(t.dtype == torch.bfloat16 for t in tensors)
        trunk += parameter.numel()
        stored += sum(t.numel() * t.element_size() for t in tensors) + parameter.numel() * gradient_sizes[parameter]
    assert stored == 8 * trunk  # weights, gradients and Adam's two moments: 2 + 2 + 2 + 2 bytes
    for parameter in learner.value_head.parameters():  # the value head stays float32
        assert learner.optimizer.state[parameter]["exp_avg"].dtype == torch.float32


def test_a_bfloat16_learner_resumes_as_if_uninterrupted(tokenizer):
    observations = [{"prompt": PROMPTS}]
    rewards = [torch.linspace(-1, 1, len(PROMPTS)).tolist()]
    # bfloat16 weights either are the same or differ by a spacing: the tolerance is 0 (the rounding's generator is
    # restored with the optimiser's state).
    assert check_resume_equals_uninterrupted(lambda: bf16_learner(tokenizer), observations, rewards, tolerance=0) == 0
    learner = bf16_learner(tokenizer)
    tensors, meta = learner.state_dict()
    assert isinstance(meta["optimizer"]["extra"]["rounding_generator"], str)


def test_float32_learners_keep_torchs_adam_and_float16_is_refused(tokenizer):
    learner = PPOLearner(
        "llm1",
        model=make_tiny_gpt2(tokenizer),
        tokenizer=tokenizer,
        reference=make_tiny_gpt2(tokenizer).requires_grad_(False),
        config=PPOConfig(),
    )
    assert type(learner.optimizer) is torch.optim.Adam
    tensors, meta = learner.state_dict()
    assert "extra" not in meta["optimizer"]  # a float32 learner's checkpoint is as before
    with pytest.raises(ValueError, match=r"float16 parameters directly .* squared gradients underflow"):
        PPOLearner(
            "llm1",
            model=make_tiny_gpt2(tokenizer).to(torch.float16),
            tokenizer=tokenizer,
            reference=make_tiny_gpt2(tokenizer).to(torch.float16).requires_grad_(False),
        )
