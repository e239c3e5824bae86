"""The embedded offline base plays every game the games guide names with the default prompt: random play reaches no
prompt that, with generation's default budget, exceeds the base's context, and the longest prompts of each game are
answered in free text and tabulated under constrained answers on the base itself."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from marllm.assets import resolve_model
from marllm.models.generation import generate_responses
from marllm.models.generation_config import GenerationConfig
from marllm.models.legal_moves import constrained_move_probabilities

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.skipif(
        importlib.util.find_spec("pyspiel") is None or importlib.util.find_spec("shimmy") is None,
        reason="needs the optional open_spiel and shimmy (pip install 'marllm[games]')",
    ),
]

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "games.md"
# The games the guide names, each with its default options (rock-paper-scissors: PettingZoo's 15 rounds).
GUIDE_GAMES = [
    "tictactoe_v3",
    "connect_four_v3",
    "rps_v2",
    "openspiel:kuhn_poker",
    "openspiel:leduc_poker",
    "openspiel:liars_dice",
    "openspiel:tic_tac_toe",
    "openspiel:matrix_rps",
    "openspiel:matrix_pd",
    "openspiel:repeated_game(stage_game=matrix_pd(),num_repetitions=5)",
]


@pytest.fixture(scope="module")
def embedded_base():
    path = resolve_model("marllm:offline-base")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    return AutoModelForCausalLM.from_pretrained(path).eval(), tokenizer


def longest_prompts(name: str, tokenizer, games: int = 8, keep: int = 2) -> list[tuple[int, str, list[str]]]:
    """The ``keep`` longest (tokens, prompt, legal moves) of ``games`` randomly played games of ``name``."""
    from marllm.games.env.batched_env import BatchedGameEnv
    from marllm.games.env.factory import game_factory

    environment = BatchedGameEnv(game_factory(name), games)
    environment.reset(seed=0)
    rng, seen = random.Random(0), []
    for _ in environment.agent_iter(10_000):
        observation, _, terminated, truncated, _ = environment.last()
        if terminated or truncated:
            environment.step(None)
            continue
        for prompt, moves in zip(observation["prompt"], observation["legal_moves"], strict=True):
            seen.append((len(tokenizer(prompt)["input_ids"]), prompt, list(moves)))
        environment.step(tuple(rng.choice(moves) for moves in observation["legal_moves"]))
    environment.close()
    return sorted(seen, key=lambda item: -item[0])[:keep]


def test_the_guide_names_these_games():
    text = GUIDE.read_text()
    for name in ("tictactoe_v3", "connect_four_v3", "rps_v2", "kuhn_poker", "leduc_poker", "liar's dice", "matrix_*",
                 "repeated_game", "openspiel:tic_tac_toe"):  # fmt: skip
        assert name in text


@pytest.mark.parametrize("name", GUIDE_GAMES)
def test_the_embedded_base_plays_the_guides_games_with_the_default_prompt(embedded_base, name):
    model, tokenizer = embedded_base
    budget = GenerationConfig().max_new_tokens
    context = model.config.n_positions
    longest = longest_prompts(name, tokenizer)
    assert longest[0][0] + budget <= context, f"{name}: a {longest[0][0]}-token prompt leaves no {budget} tokens"
    prompts, moves = [prompt for _, prompt, _ in longest], [names for _, _, names in longest]
    torch.manual_seed(0)
    answers = generate_responses(model, tokenizer, prompts, budget, GenerationConfig(), context, name)
    assert len(answers.texts) == len(prompts)
    table = constrained_move_probabilities(model, tokenizer, prompts, moves, GenerationConfig())
    assert all(sum(row) == pytest.approx(1.0, abs=1e-5) for row in table)
