"""``game.actions: think``: a free-text thought, a forced ``THOUGHT_END``, then a legal move restricted token by
token, credited as one response whose log-probs are those of the distributions its tokens were drawn from."""

from __future__ import annotations

import pytest
import torch

import marllm.models.thought_moves as thought_moves
from marllm.algorithms import GenerationConfig, PPOConfig, PPOLearner
from marllm.config import config_from_dict
from marllm.games.env import exact_move
from marllm.models.generation import logprob_logits
from marllm.models.legal_moves import token_logprobs
from marllm.models.move_tries import move_continuations, restrict_logits
from marllm.models.policy import ready_for_generation
from marllm.models.thought_moves import THOUGHT_END, generate_thought_and_move
from tests.conftest import make_tiny_gpt2
from tests.test_action_modes import MOVES, PROMPTS, assert_first_update_is_on_policy
from tests.test_games_config import game_config

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# Prompts with a long common beginning (more than 16 tokens): the thought is sampled after their shared prefix's
# cache, with padding in the middle of the shorter rows (what the move's distribution must be computed after too).
RULES = "You are playing a game against the other player. The rules are simple and the moves are listed. "
SHARED = [RULES + p for p in PROMPTS]


def test_every_thought_is_followed_by_the_forced_end_and_a_legal_move(tokenizer):
    model = make_tiny_gpt2(tokenizer).eval()
    ready_for_generation(tokenizer)
    eos, end = tokenizer.eos_token_id, tokenizer(THOUGHT_END, add_special_tokens=False)["input_ids"]
    moves = move_continuations(tokenizer, [THOUGHT_END] * len(MOVES), MOVES)
    torch.manual_seed(0)
    lengths = set()
    for prompts in (PROMPTS, SHARED) * 6:
        sample = generate_thought_and_move(model, tokenizer, prompts, MOVES, GenerationConfig(temperature=2.0), 6)
        batch = sample.generated
        assert batch.response.shape[0] == len(prompts) and sample.allowed.shape[:2] == batch.response.shape
        for row, (answer, names, move) in enumerate(zip(batch.texts, MOVES, sample.moves, strict=True)):
            assert exact_move(answer, names) == move
            tokens = batch.response[row, : int(batch.mask[row].sum())].tolist()
            tail = [*moves[row][move], eos]
            assert tokens[-len(tail) :] == tail  # the move's tokens as read after THOUGHT_END, then EOS
            thought = len(tokens) - len(tail) - len(end)
            assert 0 <= thought <= 6 and tokens[thought : thought + len(end)] == end
            allowed = sample.allowed[row]
            assert (allowed[:thought] == -1).all()  # the thought: unrestricted
            for t, token in enumerate(end):  # THOUGHT_END: its own token, alone
                assert allowed[thought + t].tolist() == [token] + [-1] * (allowed.shape[1] - 1)
            assert all(tokens[i] in allowed[i].tolist() for i in range(thought + len(end), len(tokens)))
            lengths.add(thought)
    assert len(lengths) > 1  # thoughts that end early (EOS) and thoughts that run to the budget


def captured_moves(monkeypatch):
    """Keep the move phase's batch with generate's own logits (and the ids it was sampled after)."""
    kept = []
    sample_after = thought_moves.sample_after

    def capturing(model, tokenizer, prompt_ids, prompt_mask, *args, **kwargs):
        batch = sample_after(model, tokenizer, prompt_ids, prompt_mask, *args, **{**kwargs, "capture": True})
        kept.append((prompt_ids, prompt_mask, batch))
        return batch

    monkeypatch.setattr(thought_moves, "sample_after", capturing)
    return kept


def think_learner(tokenizer, **ppo):
    config = PPOConfig.from_flat(**{"mini_batch_size": 14, "ppo_epochs": 1, **ppo})
    model, reference = make_tiny_gpt2(tokenizer, seed=1), make_tiny_gpt2(tokenizer, seed=2)
    generation = GenerationConfig(
        min_new_tokens=2, max_new_tokens=5, temperature=1.5, logprobs_from="sampling", top_k=20, repetition_penalty=3.0
    )  # the repetition penalty counts the padding inside a prompt (EOS here) as a token wherever it is read
    return PPOLearner(
        "llm", model=model, tokenizer=tokenizer, reference=reference, config=config, generation=generation,
        actions="think",
    )  # fmt: skip


def assert_move_log_probs_are_the_sampler_s(learner, rollout, move, tokenizer):
    """Each move token's log-prob in ``rollout`` equals that of the distribution generate drew it from: ``move``'s
    captured logits, after the ids generate read, restricted and processed; THOUGHT_END's tokens have log-prob 0."""
    b, eos = rollout.tensors, tokenizer.eos_token_id
    end = len(tokenizer(THOUGHT_END, add_special_tokens=False)["input_ids"])
    for row in range(len(rollout.responses)):
        n = int(move.mask[row].sum())
        start = int(b.mask[row].sum()) - n  # the move's first position in the rollout's response
        allowed = b.allowed[row : row + 1, start : start + n]
        response = move.response[row : row + 1, :n]
        ids = torch.cat([move.prompt_ids[row : row + 1], response], 1)
        mask = torch.cat([move.prompt_mask[row : row + 1], torch.ones_like(response)], 1)
        logits = restrict_logits(move.logits[row : row + 1, :n].clone(), allowed)
        logits = logprob_logits(logits, ids, mask, move.prompt_ids.shape[1], learner.generation, eos)
        assert torch.allclose(b.logprobs[row, start : start + n], token_logprobs(logits, response)[0], atol=1e-4)
        assert b.logprobs[row, start - end : start].abs().max() < 1e-6  # THOUGHT_END: forced


@pytest.mark.parametrize("ppo", [{}, {"micro_batch_size": 2}])
def test_thought_and_move_log_probs_are_those_sampled(tokenizer, monkeypatch, ppo):
    """The rollout's log-probs of the moves are the sampler's (rows whose moves compete with EOS, prompts with
    padding inside, a strong repetition penalty that counts that padding); the first update's ratio is 1."""
    torch.manual_seed(0)
    kept = captured_moves(monkeypatch)
    learner = think_learner(tokenizer, **ppo)
    observations = [{"prompt": SHARED, "legal_moves": MOVES}] * 3
    observations.append({"prompt": PROMPTS[1:3], "legal_moves": MOVES[1:3]})
    for observation in observations:
        learner.act(observation)
    for rollout, (_, _, move), observation in zip(learner.rollouts, kept, observations, strict=True):
        assert_move_log_probs_are_the_sampler_s(learner, rollout, move, tokenizer)
        assert all(a in names for a, names in zip(rollout.responses, observation["legal_moves"], strict=True))
    for _ in range(3):
        learner.finish([1.0, 0.0, -1.0, 0.5])
    learner.finish([0.0, 1.0])
    assert_first_update_is_on_policy(learner)


def test_think_is_validated_and_its_probabilities_are_not_exact(tokenizer):
    assert config_from_dict(game_config({"actions": "think"})).game.actions.mode == "think"
    with pytest.raises(ValueError, match="game.actions: think ends each answer with EOS"):
        config_from_dict(game_config({"actions": "think"}, generation={"stop_at_eos": False}))
    with pytest.raises(ValueError, match="set ppo.compute.rollout_from_generate to auto or false"):
        think_learner(tokenizer, rollout_from_generate=True)
    learner = think_learner(tokenizer)
    with pytest.raises(ValueError, match="exact move probabilities need constrained or score"):
        learner.move_probabilities(PROMPTS, MOVES)
