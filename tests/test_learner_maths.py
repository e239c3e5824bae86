"""The learners' maths where a setting changes how a loss is weighted or a value is computed: the step weights of
merged mini-batches, the value head's input and precision, and the k2 estimator's bound."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.test_ppo_learner import make_learner


def step_weights(learner, batch_size):
    """Each optimiser step's mini-batch weights of one epoch over ``batch_size`` samples of 3 tokens each."""
    masses = torch.full((batch_size,), 3.0)
    return [[mb.weight for mb in step] for step in learner._step_plan(masses, np.arange(batch_size))]


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
