"""A learner's turns of an iteration are one update: merge_rollouts re-pads them into one batch whose log-probs are
the rollouts' own, every epoch shuffles all of them, and whitening, the score statistics and the KL controller take
one step per iteration, however many turns the learner played."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marllm.algorithms.core import logprobs_and_entropy
from marllm.algorithms.rollout import merge_rollouts
from marllm.models.policy import response_forward
from marllm.parallel.distributed import segment_rows
from tests.test_ppo_learner import make_learner

SHORT = ("this movie was", "what a")
LONG = ("the actors in this movie were all", "i think that the story of the film")


def played(learner, *turns, seed=0):
    """``learner`` acts on each turn's prompts and is given rewards 0.1·row for each."""
    torch.manual_seed(seed)
    for prompts in turns:
        learner.act({"prompt": list(prompts)})
    for rollout in learner.rollouts:
        learner.finish([0.1 * i for i in range(len(rollout.responses))])
    return learner.rollouts


def test_merged_rollouts_are_re_padded_and_score_each_row_as_its_own_rollout_did(tokenizer):
    learner = make_learner(tokenizer)
    first, second = played(learner, SHORT, LONG * 2)
    assert first.prompt_length < second.prompt_length
    merged = merge_rollouts([first, second], tokenizer.pad_token_id)
    lengths = [r.tensors.response.shape[1] for r in (first, second)]
    assert merged.prompt_length == second.prompt_length
    assert merged.tensors.response.shape == (6, max(lengths))
    assert merged.tensors.input_ids.shape == (6, merged.prompt_length + max(lengths))
    assert merged.segments == (2, 4) and merged.segment_sizes == (2, 4)
    assert merged.prompts == first.prompts + second.prompts and merged.responses == first.responses + second.responses
    np.testing.assert_allclose(merged.received_rewards, [0.0, 0.1, 0.0, 0.1, 0.2, 0.3])
    generation_s = first.timings["generation_s"] + second.timings["generation_s"]
    assert merged.timings["generation_s"] == pytest.approx(generation_s)
    for rows, rollout in ((slice(0, 2), first), (slice(2, 6), second)):
        length = rollout.tensors.response.shape[1]
        part = merged.tensors[rows]
        # Real tokens where they were, padding masked everywhere else.
        assert torch.equal(part.response[:, :length], rollout.tensors.response)
        assert torch.equal(part.mask[:, :length], rollout.tensors.mask) and not part.mask[:, length:].any()
        assert torch.equal(part.logprobs[:, :length], rollout.tensors.logprobs)
        assert part.attention_mask.sum() == rollout.tensors.attention_mask.sum()
        # The policy scores each re-padded row as its own rollout did: the first PPO ratio stays 1 (up to rounding).
        with torch.no_grad():
            logits, _ = response_forward(learner.model, part.input_ids, part.attention_mask, merged.prompt_length)
            logprobs, _ = logprobs_and_entropy(logits, part.response)
        real = part.mask.bool()
        torch.testing.assert_close(logprobs[real], part.logprobs[real], rtol=0, atol=1e-5)


def test_one_rollout_is_returned_as_it_is_and_bad_input_is_refused(tokenizer):
    learner = make_learner(tokenizer)
    [rollout] = played(learner, SHORT)
    assert merge_rollouts([rollout], tokenizer.pad_token_id) is rollout
    with pytest.raises(ValueError, match="at least one rollout"):
        merge_rollouts([], tokenizer.pad_token_id)
    learner.act({"prompt": list(SHORT)})
    with pytest.raises(ValueError, match=r"rollout\(s\) \[1\] have no rewards"):
        merge_rollouts(learner.rollouts, tokenizer.pad_token_id)


class CountingController:
    """A fixed-η KL controller that records each ``update(kl, n_steps)``."""

    def __init__(self, value=0.05):
        self.value = value
        self.calls = []

    def update(self, kl, n_steps):
        self.calls.append((kl, n_steps))


def record_steps(learner):
    """The list that each optimiser step of ``learner``'s updates (its mini-batches) is appended to as it runs."""
    steps = []
    optimisation = learner._optimisation

    def recording(*args):
        runner = optimisation(*args)
        plan = runner.plan
        runner.plan = lambda *args: (step for step in plan(*args) if not steps.append(step))
        return runner

    learner._optimisation = recording
    return steps


def test_a_learner_with_two_turns_takes_one_controller_step_and_one_shuffled_pass_over_both(tokenizer):
    controller = CountingController()
    learner = make_learner(
        tokenizer,
        0,
        learner_kwargs={"kl_controller": controller},
        mini_batch_size=2,
        ppo_epochs=1,
        score_transform="normalize",
    )
    played(learner, SHORT * 2, LONG * 2)
    steps = record_steps(learner)
    metrics = learner.update()
    assert len(controller.calls) == 1 and controller.calls[0][1] == 8  # one step, over both turns' 8 responses
    assert learner.score_statistics.count == 8  # the score statistics took both turns at once
    assert len(steps) == 4  # 8 responses in mini-batches of 2: as many steps as two separate updates would take
    assert sorted(int(i) for step in steps for mb in step for i in mb.indices) == list(range(8))
    assert metrics["received_reward"] == pytest.approx(np.mean([0.0, 0.1, 0.2, 0.3] * 2))
    assert learner.rollouts == [] and learner.num_updates == 1


def test_an_epoch_shuffles_both_turns_together(tokenizer):
    """Turn by turn, every epoch ran on the first turn's rows, then on the second's (whose first ratio was then not
    1); merged, an epoch's steps draw from both turns: here the first step of 8 holds rows of each."""
    learner = make_learner(tokenizer, 0, mini_batch_size=8, ppo_epochs=2)
    played(learner, SHORT * 4, LONG * 4)
    steps = record_steps(learner)
    learner.update()
    assert len(steps) == 4  # 2 epochs of 16 responses in steps of 8
    for step in steps:
        [minibatch] = step
        turns = {int(i) // 8 for i in minibatch.indices}
        assert turns == {0, 1}  # 8 of 16 drawn from one turn alone: probability 2 / C(16, 8) ≈ 1.6e-4


def test_segment_rows_put_each_ranks_slice_of_each_turn_where_one_process_holds_it():
    # Two ranks, two turns of 4 and 6 rows each (2 + 2 and 3 + 3): one process holds turn 0 (rank 0's, rank 1's),
    # then turn 1 (rank 0's, rank 1's).
    sizes = np.array([[2, 3], [2, 3]])
    np.testing.assert_array_equal(segment_rows(sizes, 0), [0, 1, 4, 5, 6])
    np.testing.assert_array_equal(segment_rows(sizes, 1), [2, 3, 7, 8, 9])
    # One turn: each rank's contiguous slice, as before merging.
    np.testing.assert_array_equal(segment_rows(np.array([[4], [4]]), 1), [4, 5, 6, 7])
    # Every global row is some rank's, once.
    both = np.concatenate([segment_rows(sizes, 0), segment_rows(sizes, 1)])
    np.testing.assert_array_equal(np.sort(both), np.arange(10))


def test_split_points_merge_what_is_left_over_into_the_last_slice():
    from marllm.algorithms.ppo_config import BatchingConfig
    from marllm.algorithms.ppo_steps import split_points

    assert split_points(11, 4, merge_last=False) == [slice(0, 4), slice(4, 8), slice(8, 11)]
    assert split_points(11, 4, merge_last=True) == [slice(0, 4), slice(4, 11)]
    assert split_points(12, 4, merge_last=True) == [slice(0, 4), slice(4, 8), slice(8, 12)]
    assert split_points(3, 4, merge_last=True) == [slice(0, 3)]  # smaller than one: one slice of all
    BatchingConfig(mini_batch_size=4, last_minibatch="merge").check_batch_size(11)
    with pytest.raises(ValueError, match=r"not divisible by .*\(or set ppo.batching.last_minibatch: merge"):
        BatchingConfig(mini_batch_size=4).check_batch_size(11)
    with pytest.raises(ValueError, match="ppo.batching.last_minibatch must be one of"):
        BatchingConfig(last_minibatch="drop")
