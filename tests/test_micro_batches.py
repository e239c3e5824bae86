"""ppo.compute.micro_batch_size: a mini-batch in passes of fewer rows, sorted by length and trimmed of padding, is the
same update as the whole mini-batch up to the order of float sums — gradients, skipped mini-batches and metrics."""

from __future__ import annotations

import copy

import pytest
import torch
from tianshou.data import Batch

from marllm.algorithms.critic_free_config import CriticFreeConfig
from marllm.algorithms.critic_free_learner import CriticFreeLearner
from marllm.algorithms.ppo import PPOLearner
from marllm.algorithms.ppo_config import AUTO_MICRO_BATCH_SIZE, ComputeConfig, PPOConfig
from marllm.algorithms.ppo_steps import trim_padding
from marllm.parallel.placement import Placement, Sharded
from tests.test_ppo_learner import make_learner

PROMPTS = ("this movie was", "what a", "the actors in this movie were all", "i think", "a long and slow film") * 2
PROMPTS = PROMPTS[:8]


def test_trim_padding_drops_only_the_columns_no_row_needs():
    # Prompt length 4, response length 3: both rows' prompts start at column 2, no response uses its last column.
    mb = Batch(
        input_ids=torch.tensor([[0, 0, 5, 6, 7, 8, 0], [0, 0, 0, 9, 4, 0, 0]]),
        attention_mask=torch.tensor([[0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1]]),
        response=torch.tensor([[7, 8, 0], [4, 0, 0]]),
        mask=torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]),
        logprobs=torch.tensor([[-1.0, -2.0, 0.0], [-3.0, 0.0, 0.0]]),
        outcome=torch.tensor([1.0, 2.0]),
    )
    trimmed, prompt_length = trim_padding(mb, 4)
    assert prompt_length == 2
    assert trimmed.input_ids.tolist() == [[5, 6, 7, 8], [0, 9, 4, 0]]
    assert trimmed.attention_mask.tolist() == [[1, 1, 1, 1], [0, 1, 1, 1]]
    assert trimmed.response.tolist() == [[7, 8], [4, 0]] and trimmed.mask.tolist() == [[1.0, 1.0], [1.0, 0.0]]
    assert trimmed.logprobs.tolist() == [[-1.0, -2.0], [-3.0, 0.0]]
    assert trimmed.outcome.tolist() == [1.0, 2.0]  # per-response columns are kept whole
    untouched, same = trim_padding(trimmed, 2)
    assert untouched is trimmed and same == 2


def rollout_pair(tokenizer, learner_class=None, learner_kwargs=None, micro_batch_size=3, **ppo):
    """Two learners of the same weights and generator, one with micro-batches, and one rewarded rollout that both
    hold."""
    ppo = {"micro_batch_size": None, **ppo}  # the whole mini-batch in one untrimmed pass
    whole = make_learner(tokenizer, 0, learner_class or PPOLearner, learner_kwargs, **ppo)
    micro = make_learner(tokenizer, 0, learner_class or PPOLearner, learner_kwargs, **ppo)
    micro.config = PPOConfig.from_flat(**{**vars(whole.config), "micro_batch_size": micro_batch_size})
    torch.manual_seed(0)
    whole.act({"prompt": list(PROMPTS)})
    whole.finish([0.3 * (i % 3) - 0.2 for i in range(len(PROMPTS))])
    tensors = whole.rollouts[0].tensors
    for row in range(len(PROMPTS)):  # responses of different lengths (as if they stopped at EOS): tokens ≠ rows
        tensors.mask[row, tensors.mask.shape[1] - row % 4 :] = 0.0
    tensors.kl = tensors.kl * tensors.mask
    micro.rollouts = copy.deepcopy(whole.rollouts)
    micro._rng.bit_generator.state = whole._rng.bit_generator.state  # the generator its parts hold, in place
    return whole, micro


def record_steps(learner):
    gradients = []
    step = learner.optimizer.step

    def recording(*args, **kwargs):
        gradients.append(torch.cat([p.grad.flatten() for p in learner._trained_parameters() if p.grad is not None]))
        return step(*args, **kwargs)

    learner.optimizer.step = recording
    return gradients


def assert_same_update(whole, micro, steps_scale=2e-2):
    steps = [record_steps(whole), record_steps(micro)]
    metrics = [whole.update(), micro.update()]
    assert len(steps[0]) == len(steps[1]) > 0
    for one, other in zip(*steps, strict=True):
        # Float sums in another order differ by ~1e-5 of the largest component; a pass weighted wrongly (a share
        # off by one row of eight) by ~1e-1 of it.
        scale = one.abs().max().item()
        assert scale > 0 and (one - other).abs().max().item() <= 1e-4 * scale
    for one, other in zip(whole._trained_parameters(), micro._trained_parameters(), strict=True):
        # Adam divides each gradient by its own magnitude: on components whose gradient is near ε the last-bit
        # differences above show, as between data-parallel ranks (tests/test_data_parallel.py); a step moves a
        # parameter by ~the learning rate, ~50× this tolerance.
        torch.testing.assert_close(one, other, rtol=1e-4, atol=steps_scale * whole.config.optimiser.learning_rate)
    for key in ("loss/policy", "loss/total", "ratio", "clipfrac", "approx_kl", "skipped_minibatch_fraction"):
        if key in metrics[0]:
            assert metrics[1][key] == pytest.approx(metrics[0][key], rel=1e-4, abs=1e-6), key
    return metrics


def test_ppo_in_micro_batches_is_the_same_update(tokenizer):
    # Prompts of 2 to 8 tokens: the micro-batches (3, 3, 2 rows of a mini-batch of 8) are trimmed differently.
    whole, micro = rollout_pair(tokenizer, mini_batch_size=8, ppo_epochs=2)
    padded = whole.rollouts[0].prompt_length
    calls = []
    loss = micro._loss
    micro._loss = lambda mb, prompt_length, kl_coef: (
        calls.append((len(mb.mask), prompt_length)),
        loss(mb, prompt_length, kl_coef),
    )[1]
    assert_same_update(whole, micro)
    assert [rows for rows, _ in calls] == [3, 3, 2] * 2
    prompt_lengths = [length for _, length in calls]
    assert max(prompt_lengths) <= padded and min(prompt_lengths) < padded  # the short prompts' passes are trimmed


def test_accumulation_step_token_mean_and_a_critic_free_aggregation_are_unchanged(tokenizer):
    whole, micro = rollout_pair(
        tokenizer, mini_batch_size=4, gradient_accumulation_steps=2, loss_reduction="step_token_mean"
    )
    assert_same_update(whole, micro)
    settings = {"algorithm": "reinforce_pp", "settings": CriticFreeConfig(loss_aggregation="seq-mean-token-mean")}
    whole, micro = rollout_pair(tokenizer, CriticFreeLearner, settings, mini_batch_size=8)
    assert_same_update(whole, micro)


def test_a_mini_batch_skipped_by_the_ratio_threshold_gives_no_gradient_in_micro_batches_either(tokenizer):
    # A learning rate that blows the ratio up after the first steps: later mini-batches are skipped.
    whole, micro = rollout_pair(
        tokenizer, mini_batch_size=2, gradient_accumulation_steps=2, ppo_epochs=4, learning_rate=0.01,
        ratio_threshold=1.01, micro_batch_size=1,
    )  # fmt: skip
    skips = []
    optimisation = whole._optimisation

    def recording(*args):
        steps = optimisation(*args)
        accumulate = steps.accumulate
        steps.accumulate = lambda mb, *args: (lambda out: (skips.append(not out[0]), out)[1])(accumulate(mb, *args))
        return steps

    whole._optimisation = recording
    metrics = assert_same_update(whole, micro)
    assert 0 < metrics[0]["skipped_minibatch_fraction"] < 1
    # Some optimiser step holds a skipped mini-batch beside one that counts: its gradient must be the second's alone.
    assert any(skips[i] != skips[i + 1] for i in range(0, len(skips), 2))


def test_micro_batch_size_is_checked_and_auto_by_default():
    with pytest.raises(ValueError, match="micro_batch_size"):
        PPOConfig.from_flat(micro_batch_size=0)
    assert PPOConfig().compute.micro_batch_size == "auto"
    assert PPOConfig().compute.settled(Placement).micro_batch_size == AUTO_MICRO_BATCH_SIZE == 32
    assert PPOConfig().compute.settled(Sharded).micro_batch_size is None  # sharded: the whole mini-batch in one pass
    assert ComputeConfig(micro_batch_size=None).settled(Placement).micro_batch_size is None
    assert ComputeConfig(micro_batch_size=4).settled(Placement).micro_batch_size == 4


def test_a_pass_no_larger_than_the_mini_batch_is_still_trimmed_to_its_rows(tokenizer):
    """Mini-batches of one row (a game's moves): each pass drops the padding the merged batch added for longer rows,
    down to the row's own prompt, and the update stays the same."""
    whole, micro = rollout_pair(tokenizer, mini_batch_size=1, ppo_epochs=1, micro_batch_size=1)
    tensors = whole.rollouts[0].tensors
    own = tensors.attention_mask[:, : whole.rollouts[0].prompt_length].sum(1).tolist()
    seen = []
    loss = micro._loss
    micro._loss = lambda mb, prompt_length, kl_coef: (
        seen.append((int(mb.attention_mask[0, :prompt_length].sum()), prompt_length)),
        loss(mb, prompt_length, kl_coef),
    )[1]
    assert_same_update(whole, micro, steps_scale=2e-2)  # 8 one-row steps: Adam's ε-scale components drift further
    assert sorted(length for length, _ in seen) == sorted(own)
    assert all(real == prompt_length for real, prompt_length in seen)  # no left padding left in any pass
