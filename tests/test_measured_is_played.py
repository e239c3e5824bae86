"""What is measured is what plays: the move probabilities a run tabulates (exploitability, a best-response seat,
``marllm eval --exploitability``) are those of the policy that samples the moves, on tiny models built here."""

from __future__ import annotations

import pytest
import torch

from marllm.models.generation_config import GenerationConfig
from marllm.models.legal_moves import constrained_move_probabilities, generate_moves
from tests.conftest import make_tiny_gpt2

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# The rules name the moves, as a game's prompt does: the repetition penalty falls on the move tokens themselves.
PROMPT = "what a terrible waste of time , bad from start to end , it was"
MOVES = ["good", "bad"]


def sharp_model(tokenizer, seed=3):
    """A tiny GPT-2 whose logits are large enough for the repetition penalty to move its moves' probabilities."""
    model = make_tiny_gpt2(tokenizer, seed=seed).eval()
    with torch.no_grad():
        model.transformer.ln_f.weight.mul_(20)
    return model


def test_exact_constrained_probabilities_are_the_frequencies_generate_moves_plays(tokenizer):
    """The default sampling settings (repetition penalty 1.1, log-probs ``tempered``): the tabulated probability of
    each move equals its frequency in 4,000 constrained answers within 3 standard errors, and the tempered π, which
    the learner's ratio uses, is measurably another distribution here."""
    tokenizer.padding_side = "left"
    model, generation = sharp_model(tokenizer), GenerationConfig()
    exact = constrained_move_probabilities(model, tokenizer, [PROMPT], [MOVES], generation)[0]
    unpenalised = GenerationConfig(repetition_penalty=1.0)
    tempered = constrained_move_probabilities(model, tokenizer, [PROMPT], [MOVES], unpenalised)[0]
    torch.manual_seed(0)
    n = 4000
    played = generate_moves(model, tokenizer, [PROMPT] * n, [MOVES] * n, generation).moves
    frequency = sum(move == 0 for move in played) / n
    standard_error = (exact[0] * (1 - exact[0]) / n) ** 0.5
    assert sum(exact) == pytest.approx(1.0, abs=1e-6)
    assert abs(frequency - exact[0]) < 3 * standard_error
    assert abs(frequency - tempered[0]) > 5 * standard_error  # the test can tell the two apart


@pytest.mark.parametrize("actions", ["generate", "think"])
def test_a_free_text_player_answers_with_the_budgets_training_samples(tokenizer, monkeypatch, actions):
    """Training draws a response budget uniformly from [min_new_tokens, max_new_tokens]; the player that evaluation
    plays and tabulates draws each answer's budget from the same range (it used max_new_tokens alone)."""
    from types import SimpleNamespace

    from marllm.algorithms.actions import think, tokens
    from marllm.games.model_player import ModelPlayer

    budgets = []

    def record(model, tokenizer, prompts, *args):
        budget = args[0] if actions == "generate" else args[2]
        budgets.extend([budget] * len(prompts))
        texts = SimpleNamespace(texts=tuple(f"{prompt}|{budget}" for prompt in prompts))
        return texts if actions == "generate" else SimpleNamespace(generated=texts, allowed=None)

    monkeypatch.setattr(tokens, "generate_responses", record)
    monkeypatch.setattr(think, "generate_thought_and_move", record)
    player = ModelPlayer("p", make_tiny_gpt2(tokenizer), tokenizer, GenerationConfig(1, 3), actions)
    prompts = [f"prompt {i}" for i in range(300)]
    torch.manual_seed(0)
    answers = player.answer({"prompt": prompts, "legal_moves": [MOVES] * len(prompts)})
    assert [answer.split("|")[0] for answer in answers] == prompts  # every answer back in its row
    drawn = [int(answer.split("|")[1]) for answer in answers]
    assert sorted(set(drawn)) == [1, 2, 3] == sorted(set(budgets))
    assert all(abs(drawn.count(b) / len(drawn) - 1 / 3) < 0.1 for b in (1, 2, 3))


@pytest.mark.parametrize("normalization", ["none", "token"])
def test_scored_moves_refuse_a_name_that_begins_another(tokenizer, normalization):
    """A scored move has no end: "1" would collect "10"'s probability (and under ``none`` always score at least as
    high). Score mode refuses such a move set, naming the moves; constrained answers, which end with EOS, take it."""
    from marllm.algorithms.catalog import AlgorithmOptions, build_learner
    from marllm.models.packed_moves import scored_move_tokens

    tokenizer.padding_side = "left"
    with pytest.raises(ValueError, match=r"row 1: .*'1' is the beginning of '10'.*game.actions: constrained"):
        scored_move_tokens(tokenizer, ["pick", "pick"], [["a", "b"], ["10", "1", "2"]], False)
    options = AlgorithmOptions(actions="score", action_normalization=normalization)
    learner = build_learner(
        "ppo", "llm", options, model=sharp_model(tokenizer), tokenizer=tokenizer, reference=sharp_model(tokenizer)
    )
    with pytest.raises(ValueError, match="'1' is the beginning of '10'"):
        learner.act({"prompt": ["pick a number"], "legal_moves": [["1", "10"]]})
    with pytest.raises(ValueError, match="'1' is the beginning of '10'"):
        learner.move_probabilities(["pick a number"], [["1", "10"]])
    played = constrained_move_probabilities(
        sharp_model(tokenizer), tokenizer, ["pick a number"], [["1", "10"]], GenerationConfig()
    )
    assert sum(played[0]) == pytest.approx(1.0, abs=1e-6)


def test_a_moves_target_holds_its_own_states_kl_and_not_the_seats_later_moves(tokenizer):
    """A seat's two moves of one game with payoff R = 0 and η > 0 (action-level PPO): each move's return is −η·KL at
    its own state, the second move's KL is not in the first's (the choice marllm.algorithms.actions.score documents)."""
    from tianshou.data import Batch

    from marllm.algorithms.core import ppo_targets
    from marllm.algorithms.ppo_config import PPOConfig

    kl = torch.tensor([[0.3], [0.5]])  # first move, then the same seat's second move
    moves = Batch(kl=kl, mask=torch.ones(2, 1), values=torch.zeros(2, 1))
    targets = ppo_targets(moves, torch.zeros(2), kl_coef=0.2, config=PPOConfig(whiten_advantages=False))
    torch.testing.assert_close(targets["returns"], -0.2 * kl)


def test_a_game_config_defaults_to_no_repetition_penalty_a_text_task_keeps_its_own():
    """A game's prompt names its moves, so a game config's generation defaults to repetition_penalty 1.0 (in every
    action mode); a config that sets it keeps it, and a text task keeps the 1.1 default."""
    from marllm.config import config_from_dict
    from tests.test_games_config import game_config

    assert config_from_dict(game_config({"actions": "constrained"})).generation.repetition_penalty == 1.0
    explicit = {**game_config({}), "generation": {"repetition_penalty": 1.2, "max_new_tokens": 4}}
    assert config_from_dict(explicit).generation.repetition_penalty == 1.2
    assert config_from_dict(explicit).generation.max_new_tokens == 4
    text = {key: value for key, value in game_config({}).items() if key != "game"}
    assert config_from_dict(text).generation.repetition_penalty == GenerationConfig().repetition_penalty == 1.1


@pytest.mark.parametrize("actions", ["generate", "constrained", "think", "score"])
def test_every_action_mode_refuses_a_prompt_too_long_for_the_context_in_one_line(tokenizer, actions):
    """Acting and tabulating a move distribution check the prompt against the model's context as generate does
    (score mode died with the position embedding's IndexError), and say what shortens a move's answer."""
    from marllm.algorithms.catalog import AlgorithmOptions, build_learner
    from marllm.games.model_player import ModelPlayer
    from marllm.models.generation import PromptTooLongError

    tokenizer.padding_side = "left"
    model = make_tiny_gpt2(tokenizer, n_positions=32)
    options = AlgorithmOptions(actions=actions)
    learner = build_learner(
        "ppo", "llm", options, model=model, tokenizer=tokenizer, reference=make_tiny_gpt2(tokenizer, n_positions=32),
        generation=GenerationConfig(1, 2),
    )  # fmt: skip
    long_prompt = "this movie was good and the acting was great , " * 4
    observation = {"prompt": [long_prompt, "short"], "legal_moves": [MOVES, MOVES]}
    with pytest.raises(PromptTooLongError, match="prompt 0 has .* exceeds the model context of 32") as error:
        learner.act(observation)
    assert "\n" not in str(error.value)
    if actions in ("constrained", "score"):
        assert "shorten the legal moves' names" in str(error.value)
        player = ModelPlayer("p", model, tokenizer, GenerationConfig(), actions)
        for tabulate in (learner.move_probabilities, player.move_probabilities):
            with pytest.raises(PromptTooLongError, match="model context of 32"):
                tabulate(observation["prompt"], observation["legal_moves"])


@pytest.mark.parametrize("actions", ["generate", "constrained", "think", "score"])
def test_a_learner_is_measured_through_the_collector_it_plays_with(tokenizer, actions):
    """The exploitability tabulation of a learner reads its exact probabilities where its mode has them, and else
    samples its answers through the learner's own collector (its autocast included): no second implementation of a
    mode. A model outside training plays through a collector of its mode too, whose answers are legal moves."""
    from marllm.algorithms.catalog import AlgorithmOptions, build_learner
    from marllm.games.model_player import ModelPlayer
    from marllm.games.settings import ActionsConfig, GameConfig
    from marllm.games.strategy import LearnerAnswers, learner_player

    tokenizer.padding_side = "left"
    learner = build_learner(
        "ppo", "llm", AlgorithmOptions(actions=actions), model=make_tiny_gpt2(tokenizer), tokenizer=tokenizer,
        reference=make_tiny_gpt2(tokenizer), generation=GenerationConfig(1, 2),
    )  # fmt: skip
    game = GameConfig(name="openspiel:kuhn_poker", seats=["llm", "random"], actions=ActionsConfig(mode=actions))
    measured = learner_player(game, learner.generation, "llm", learner)
    if actions in ("constrained", "score"):
        assert measured is learner
    else:
        assert measured.collector is learner.collector
    # Other sampling settings than the learner's: a collector of those settings on the learner's model.
    other = LearnerAnswers("llm", learner, GenerationConfig(3, 3), actions)
    assert other.collector is not learner.collector and other.collector.generation == GenerationConfig(3, 3)
    assert other.collector.model is learner.model
    player = ModelPlayer("p", learner.model, tokenizer, GenerationConfig(1, 2), actions)
    assert type(player.collector) is type(learner.collector) and player.collector.owner == "p"
    torch.manual_seed(0)
    answers = player.answer({"prompt": [PROMPT] * 6, "legal_moves": [MOVES] * 6})
    assert len(answers) == 6
    if actions != "generate":  # a thought ends with its move
        assert all(any(answer.endswith(move) for move in MOVES) for answer in answers), answers
