"""The learners' maths where a setting changes how a loss is weighted or a value is computed: the step weights of
merged mini-batches, the value head's input and precision, and the k2 estimator's bound."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marllm.algorithms import GenerationConfig, PPOConfig, PPOLearner
from marllm.algorithms.core import floor_logprobs
from marllm.algorithms.critic_free import LOG_RATIO_BOUND, kl_penalty
from marllm.models.policy import response_forward
from tests.conftest import make_tiny_gpt2
from tests.test_ppo_learner import make_learner


def step_weights(learner, batch_size):
    """Each optimiser step's mini-batch weights of one epoch over ``batch_size`` samples of 3 tokens each."""
    masses = torch.full((batch_size,), 3.0)
    return [[mb.weight for mb in step] for step in learner._optimisation().plan(masses, np.arange(batch_size))]


@pytest.mark.parametrize(
    ("batch_size", "minibatches"),
    [(6, [1]), (8, [2]), (20, [2, 3]), (16, [2, 2])],  # 4 × 2 per step; merged, a step may hold 1 or 3
)
def test_the_mini_batches_of_a_merged_step_weigh_one_in_sum(tokenizer, batch_size, minibatches):
    """Under minibatch_token_mean a step's loss is the mean of its mini-batches' losses, however many it holds: a
    batch of 6 is one mini-batch of 6 weighted 1 (not 1/2); a batch of 20 ends with a step of 3 mini-batches
    weighted 1/3 each (not 1/2, a sum of 1.5)."""
    learner = make_learner(
        tokenizer, mini_batch_size=4, gradient_accumulation_steps=2, last_minibatch="merge", ppo_epochs=1
    )
    weights = step_weights(learner, batch_size)
    assert [len(step) for step in weights] == minibatches
    for step in weights:
        assert sum(step) == pytest.approx(1.0)
        assert len(set(step)) == 1


def test_step_token_mean_weights_by_tokens_of_the_whole_step(tokenizer):
    learner = make_learner(
        tokenizer,
        mini_batch_size=4,
        gradient_accumulation_steps=2,
        last_minibatch="merge",
        ppo_epochs=1,
        loss_reduction="step_token_mean",
    )
    for step in step_weights(learner, 20):
        assert sum(step) == pytest.approx(1.0)


class Scaled(torch.nn.Module):
    """Scales the hidden state before the LM head, as MiniCPM3's ``logits_scaling`` does."""

    def forward(self, hidden):
        return hidden * 2.0


def head_scaling_gpt2(tokenizer):
    """A tiny GPT-2 whose LM head reads 2 × the last hidden state: its output embeddings' input is not
    ``hidden_states[-1]``."""
    model = make_tiny_gpt2(tokenizer, seed=0)
    head = model.lm_head
    model.lm_head = torch.nn.Sequential(Scaled(), head)
    model.get_output_embeddings = lambda: head
    return model


@pytest.mark.parametrize("rollout_from_generate", [False, True])
def test_values_of_the_rollout_and_the_update_read_the_same_hidden_state(tokenizer, rollout_from_generate):
    """On a model that scales the hidden state before its head, the rollout's values (from generate's forwards, or
    a second forward) are those the update computes: the head's input in both paths."""
    model = head_scaling_gpt2(tokenizer)
    learner = PPOLearner(
        "llm1",
        model=model,
        tokenizer=tokenizer,
        reference=make_tiny_gpt2(tokenizer, seed=0).requires_grad_(False).eval(),
        config=PPOConfig.from_flat(mini_batch_size=4, rollout_from_generate=rollout_from_generate),
        generation=GenerationConfig(4, 8),
        seed=0,
    )
    prompts = ["this movie was", "what a", "the actors in this movie were all", "i think"]
    torch.manual_seed(0)
    learner.act({"prompt": prompts})
    rollout = learner.rollouts[0]
    b = rollout.tensors
    with torch.no_grad():
        _, values = response_forward(model, b.input_ids, b.attention_mask, rollout.prompt_length, learner.value_head)
        outputs = model(input_ids=b.input_ids, attention_mask=b.attention_mask, output_hidden_states=True)
    real = b.mask.bool()
    torch.testing.assert_close(b["values"][real], values[real], rtol=0, atol=1e-5)
    last_layer = learner.value_head(outputs.hidden_states[-1][:, rollout.prompt_length - 1 : -1])
    assert (last_layer[real] - values[real]).abs().max() > 1e-3  # the two hidden states differ on this model


def test_the_value_head_computes_in_float32_under_bfloat16_autocast(tokenizer):
    learner = make_learner(tokenizer, autocast_dtype="bfloat16")
    hidden = torch.randn(2, 3, learner.model.config.n_embd)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        values = learner.value_head(hidden)
    assert values.dtype == torch.float32
    torch.testing.assert_close(values, learner.value_head(hidden), rtol=0, atol=0)
    torch.manual_seed(0)
    learner.act({"prompt": ["this movie was", "what a"]})
    b = learner.rollouts[0].tensors
    with torch.no_grad():
        _, exact = response_forward(
            learner.model, b.input_ids, b.attention_mask, learner.rollouts[0].prompt_length, learner.value_head
        )
    real = b.mask.bool()
    # The trunk ran in bfloat16, the head in float32: values are not rounded to bfloat16's 8 bits of mantissa.
    rounded = b["values"][real].to(torch.bfloat16).float()
    assert not torch.equal(rounded, b["values"][real])
    assert exact.dtype == torch.float32


def test_k2_is_bounded_on_a_floored_log_prob():
    """A token top-k removed has its log-prob floored (no gradient): k2 reports at most ½·20², not thousands."""
    logprobs = floor_logprobs(torch.tensor([[float("-inf"), -1.0]]))
    ref = torch.tensor([[-2.0, -1.5]])
    mask = torch.ones(1, 2)
    estimate = kl_penalty(logprobs, ref, mask, "k2")
    assert estimate[0, 0].item() == pytest.approx(0.5 * LOG_RATIO_BOUND**2)
    assert estimate[0, 1].item() == pytest.approx(0.5 * 0.5**2)
