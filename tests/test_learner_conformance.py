"""The learner conformance suite (:mod:`marllm.testing`) over the matrix of algorithm × action mode × prefix sharing ×
micro-batches (× the rollout taken from generate, where a mode allows it), on tiny models built here: every pair
keeps the invariants (a config refuses the pairs a run cannot hold, with the reason: GRPO and RLOO on a game's moves,
which come in no groups, :mod:`tests.test_config`)."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest
import torch

from marllm.algorithms import GenerationConfig, PPOConfig
from marllm.algorithms.catalog import AlgorithmOptions, build_learner
from marllm.models import prefix_forward
from marllm.testing import (
    check_first_update_is_on_policy,
    check_move_probabilities_are_played,
    check_resume_equals_uninterrupted,
    check_two_ranks_equal_one_process,
    run_ranks,
)
from tests.conftest import make_tiny_gpt2

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ALGORITHMS = ["ppo", "reinforce_pp", "grpo", "rloo"]
ACTIONS = ["generate", "constrained", "think", "score"]
GROUPED = ("grpo", "rloo")  # compare the answers to one prompt: the batch holds each prompt twice in a row
# Prompts that share a long beginning (the rules, 20+ tokens), as a game's do; moves of several tokens, two names that
# share their first tokens, none the beginning of another.
RULES = "this movie was good and the acting was great , the story is fine and the music is great . "
ENDINGS = ["i loved the story", "bad", "what a terrible waste of time , bad from start", "good"]
MOVES = [["good", "bad"], ["pass", "bet"], ["a b c", "a b d", "the story"], ["good", "bad"]]
# Every processor on; the ratio of the tempered policy (the default), while moves are sampled after all of them.
GENERATION = GenerationConfig(min_new_tokens=1, max_new_tokens=3, temperature=1.3, top_k=20, repetition_penalty=2.0)


def observations(algorithm: str) -> tuple[list[dict], list[list[float]]]:
    """One iteration: two turns of different sizes (the second merged with the first in the update), and rewards."""
    rows = [0, 0, 2, 2] if algorithm in GROUPED else [0, 1, 2, 3]
    second = [1, 1] if algorithm in GROUPED else [1, 3]
    turns = [
        {"prompt": [RULES + ENDINGS[i] for i in picked], "legal_moves": [MOVES[i] for i in picked]}
        for picked in (rows, second)
    ]
    return turns, [[1.0, 0.0, -1.0, 0.5], [0.5, -0.5]]


def maker(algorithm: str, actions: str, micro_batch_size: int | None, from_generate: bool = False):
    def make():
        return tiny_learner(None, algorithm, actions, micro_batch_size, from_generate)

    return make


def tiny_learner(
    placement=None, algorithm="ppo", actions="generate", micro_batch_size=None, from_generate=False
):
    """The matrix's learner: a tiny GPT-2 policy and reference, seeded alike on every call (and every rank)."""
    config = PPOConfig.from_flat(
        mini_batch_size=6, ppo_epochs=1, micro_batch_size=micro_batch_size,
        rollout_from_generate=True if from_generate else "auto",
    )  # fmt: skip
    options = AlgorithmOptions(actions=actions, group_size=2 if algorithm in GROUPED else 1)
    tokenizer = make_tokenizer_once()
    model, reference = make_tiny_gpt2(tokenizer, seed=1), make_tiny_gpt2(tokenizer, seed=2)
    with torch.no_grad():  # logits large enough for the repetition penalty to move probabilities measurably
        model.transformer.ln_f.weight.mul_(8)
        reference.transformer.ln_f.weight.mul_(8)
    torch.manual_seed(0)
    return build_learner(
        algorithm, "llm", options, model=model, tokenizer=tokenizer, reference=reference, config=config,
        generation=GENERATION, placement=placement,
    )  # fmt: skip


def failing_on_rank_one(placement=None, **options):
    """A learner whose second rank cannot be built (the first then waits for it in the update's collectives)."""
    if placement is not None and placement.rank == 1:
        raise RuntimeError("rank one cannot build its learner")
    return tiny_learner(placement, **options)


def hanging_on_rank_one(placement=None, **options):
    """A learner whose second rank never comes to the update."""
    if placement is not None and placement.rank == 1:
        time.sleep(3600)
    return tiny_learner(placement, **options)


def summing_ranks(directory, ranks):
    """Each rank sums its rank + 1 over the group and writes what it got."""
    total = ranks.sum_over_ranks(torch.tensor([ranks.rank + 1.0]))
    Path(directory, f"sum{ranks.rank}.txt").write_text(str(float(total)))


def failing_rank_one(directory, ranks):
    if ranks.rank == 1:
        raise RuntimeError("rank one fails")
    ranks.barrier()


def stuck_rank_one(directory, ranks):
    ranks.barrier()
    if ranks.rank == 1:
        time.sleep(3600)
    ranks.barrier()


def without_gradient_sums(placement=None, **options):
    """A learner whose ranks never sum their gradients: each steps on its own half of every mini-batch."""
    learner = tiny_learner(placement, **options)
    if placement is not None:
        object.__setattr__(placement, "sum_gradients_", lambda parameters: None)  # a frozen dataclass
    return learner


_TOKENIZER = []


def make_tokenizer_once():
    if not _TOKENIZER:
        from tests.conftest import make_tokenizer

        tokenizer = make_tokenizer()
        tokenizer.padding_side = "left"
        _TOKENIZER.append(tokenizer)
    return _TOKENIZER[0]


@pytest.fixture(params=["shared prefix", "whole prompts"])
def prefix_sharing(request, monkeypatch):
    if request.param == "whole prompts":
        monkeypatch.setattr(prefix_forward, "MIN_SHARED_TOKENS", 10**6)
    return request.param


@pytest.mark.parametrize("micro_batch_size", [None, 1], ids=["whole mini-batches", "micro-batches of 1"])
@pytest.mark.parametrize("actions", ACTIONS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_learner_and_action_mode_keeps_the_invariants_or_is_refused(
    algorithm, actions, micro_batch_size, prefix_sharing
):
    make = maker(algorithm, actions, micro_batch_size)
    turns, rewards = observations(algorithm)
    assert check_first_update_is_on_policy(make, turns, rewards) < 1e-5
    assert check_resume_equals_uninterrupted(make, turns, rewards) < 1e-6
    # The modes that claim exact move probabilities; micro-batches change the update, not what is played.
    if actions in ("constrained", "score") and micro_batch_size is None:
        check_move_probabilities_are_played(make, turns[0]["prompt"][2], MOVES[2], samples=800)


@pytest.mark.parametrize("actions", ["generate", "constrained"])
@pytest.mark.parametrize("algorithm", ["ppo", "reinforce_pp"])
def test_the_rollout_taken_from_generate_keeps_the_invariants(algorithm, actions):
    make = maker(algorithm, actions, 2, from_generate=True)
    turns, rewards = observations(algorithm)
    assert check_first_update_is_on_policy(make, turns, rewards) < 1e-4  # generate's own forwards: rounding
    assert check_resume_equals_uninterrupted(make, turns, rewards) < 1e-6


def test_the_checks_fail_on_a_learner_that_breaks_an_invariant():
    """The suite can fail: a learner whose rollout records log-probs off by 0.1, one whose probabilities are not those
    it plays, and one whose evaluation plays otherwise than its training, are each caught with the reason."""
    make = maker("ppo", "constrained", None)
    turns, rewards = observations("ppo")

    def off_by_a_tenth():
        learner = make()
        collect = learner.collector.collect

        def shifted(observation, role=None):
            rollout = collect(observation, role)
            rollout.tensors.logprobs = rollout.tensors.logprobs + 0.1
            return rollout

        learner.collector.collect = shifted
        return learner

    with pytest.raises(AssertionError, match="re-scores another distribution"):
        check_first_update_is_on_policy(off_by_a_tenth, turns, rewards)

    def tabulates_one_move():
        learner = make()
        learner.move_probabilities = lambda prompts, moves: [[1.0] + [0.0] * (len(row) - 1) for row in moves]
        return learner

    with pytest.raises(AssertionError, match="not those of the policy that plays"):
        check_move_probabilities_are_played(tabulates_one_move, turns[0]["prompt"][0], MOVES[0], samples=1000)

    def evaluation_plays_the_first_move():
        learner = make()
        learner.collector.play = lambda observation: tuple(moves[0] for moves in observation["legal_moves"])
        return learner

    with pytest.raises(AssertionError, match="is played outside training .* not those of the policy that plays"):
        check_move_probabilities_are_played(evaluation_plays_the_first_move, turns[0]["prompt"][2], MOVES[2], 1000)


def test_a_collector_that_does_not_play_outside_training_is_checked_in_training_only():
    make = maker("ppo", "score", None)
    turns, _ = observations("ppo")

    def plays_in_training_only():
        learner = make()

        def play(observation):
            raise NotImplementedError

        learner.collector.play = play
        return learner

    probabilities = check_move_probabilities_are_played(plays_in_training_only, turns[0]["prompt"][2], MOVES[2], 400)
    assert sum(probabilities) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("actions", ["generate", "constrained", "think"])
def test_sharing_the_prompts_beginning_changes_no_sample_and_no_log_prob(actions, monkeypatch):
    """The same learner from the same generator, its prompts' common beginning computed once or the whole prompts
    run: the same answers and the same recorded log-probs, under a repetition penalty, with a move that competes with
    EOS ("1" against "10") and logits large enough for the penalty to matter."""
    make = maker("ppo", actions, None)
    prompts = [RULES + ending for ending in ENDINGS]
    observation = {"prompt": prompts, "legal_moves": [["1", "10", "good"]] * len(prompts)}

    def rollout():
        learner = make()
        torch.manual_seed(5)
        answers = learner.act(observation)
        b = learner.rollouts[-1].tensors
        return answers, (b.logprobs * b.mask).sum(1)

    shared = rollout()
    monkeypatch.setattr(prefix_forward, "MIN_SHARED_TOKENS", 10**6)
    whole = rollout()
    assert shared[0] == whole[0]
    torch.testing.assert_close(shared[1], whole[1], atol=1e-4, rtol=1e-4)


def test_two_gloo_ranks_update_as_one_process():
    """The public check on one pair; tests/test_data_parallel.py holds the learners and modes on two ranks,
    micro-batched too."""
    turns, rewards = observations("reinforce_pp")
    options = {"algorithm": "reinforce_pp", "actions": "constrained", "micro_batch_size": 1}
    largest = check_two_ranks_equal_one_process(f"{__name__}:tiny_learner", turns, rewards, options)
    assert largest < 2e-5


def test_the_two_rank_check_fails_on_ranks_that_do_not_sum_their_gradients():
    turns, rewards = observations("ppo")
    with pytest.raises(AssertionError, match="the ranks do not sum to one process"):
        check_two_ranks_equal_one_process(f"{__name__}:without_gradient_sums", turns, rewards, {"actions": "score"})


def test_a_rank_that_fails_ends_the_check_with_its_traceback_and_no_rank_left_running():
    turns, rewards = observations("ppo")
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"(?s)rank 1 failed first.*RuntimeError: rank one cannot build"):
        check_two_ranks_equal_one_process(f"{__name__}:failing_on_rank_one", turns, rewards, timeout=120)
    assert time.monotonic() - started < 60  # rank 0, waiting in a collective, was ended, not awaited
    assert not multiprocessing.active_children()


def test_ranks_that_do_not_finish_in_time_are_ended():
    turns, rewards = observations("ppo")
    with pytest.raises(AssertionError, match="the data-parallel ranks did not finish in 5 s"):
        check_two_ranks_equal_one_process(f"{__name__}:hanging_on_rank_one", turns, rewards, timeout=5)
    assert not multiprocessing.active_children()


def test_ranks_launched_again_in_one_directory_meet_afresh(tmp_path):
    with pytest.raises(AssertionError, match=r"(?s)rank 1 failed first.*RuntimeError: rank one fails"):
        run_ranks(failing_rank_one, tmp_path, timeout=60)
    with pytest.raises(AssertionError, match="did not finish in 5 s"):  # killed: they leave their rendezvous behind
        run_ranks(stuck_rank_one, tmp_path, timeout=5)
    for _ in range(2):  # neither a failed launch's traceback nor an earlier rendezvous is read again
        run_ranks(summing_ranks, tmp_path, timeout=60)
        assert [Path(tmp_path, f"sum{rank}.txt").read_text() for rank in (0, 1)] == ["3.0", "3.0"]
    assert not (tmp_path / "rank1.error").exists()
    assert [entry.name for entry in tmp_path.iterdir() if entry.name.startswith("rendezvous")] == []


def trained_weights(algorithm: str, actions: str, **compute) -> dict[str, torch.Tensor]:
    """One act-reward-update of the matrix's learner with these ``ppo.compute`` settings: its trainable weights."""
    config = PPOConfig.from_flat(mini_batch_size=6, ppo_epochs=2, learning_rate=3e-3, **compute)
    options = AlgorithmOptions(actions=actions, group_size=2 if algorithm in GROUPED else 1)
    tokenizer = make_tokenizer_once()
    model, reference = make_tiny_gpt2(tokenizer, seed=1), make_tiny_gpt2(tokenizer, seed=2)
    torch.manual_seed(0)
    learner = build_learner(
        algorithm, "llm", options, model=model, tokenizer=tokenizer, reference=reference, config=config,
        generation=GENERATION,
    )  # fmt: skip
    turns, rewards = observations(algorithm)
    torch.manual_seed(1)
    for turn in turns:
        learner.act(turn)
    for row_rewards in rewards:
        learner.finish(row_rewards)
    learner.update()
    return {name: p.detach().clone() for name, p in learner.model.named_parameters() if p.requires_grad}


# Every memory lever under every action mode: a lever tested on one mode only is how the chunked head came to crash
# on restricted moves. The levers change the order of float sums, never the update: 3e-5 is 100 times below a step
# (3e-3); a chunked head's sums differ by 1e-5 on some hosts.
LEVERS = {"chunked head": {"logits_chunk_rows": 1}, "checkpointing": {"gradient_checkpointing": True}}


@pytest.mark.parametrize("lever", list(LEVERS))
@pytest.mark.parametrize("actions", ACTIONS)
@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_every_memory_lever_gives_the_update_of_the_whole_pass_under_every_action_mode(algorithm, actions, lever):
    if (actions, lever) == ("score", "chunked head"):  # scored moves project no vocabulary-wide logits to chunk
        with pytest.raises(ValueError, match=r"logits_chunk_rows.*score"):
            trained_weights(algorithm, actions, **LEVERS[lever])
        return
    whole = trained_weights(algorithm, actions)
    levered = trained_weights(algorithm, actions, **LEVERS[lever])
    differences = {name: (levered[name] - whole[name]).abs().max().item() for name in whole}
    assert max(differences.values()) < 3e-5, differences
    start = make_tiny_gpt2(make_tokenizer_once(), seed=1).state_dict()
    assert any((whole[name] != start[name]).any() for name in whole)  # the update moved the weights
