"""A model playing a game outside training: evaluation plays a checkpoint as its run trained it (the players that
``marllm eval``, the exploitability evaluation and the round-robin build take the run's ``ppo.compute`` settings),
and its exact move probabilities refuse what its answers refuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from marllm.algorithms.ppo_config import ComputeConfig
from marllm.config import load_config
from marllm.games.model_player import ModelPlayer
from tests.conftest import make_tiny_gpt2

KUHN = Path(__file__).resolve().parents[1] / "examples" / "games" / "kuhn_poker_offline.yaml"
PROMPTS = ["Your card: K. You may pass or bet.", "Your card: J. The other player bet."]
LEGAL = [["pass", "bet"], ["pass", "bet"]]


def test_a_run_trained_under_autocast_is_evaluated_under_it(tokenizer):
    config = load_config(KUHN, ["game.actions=score", "ppo.compute.autocast_dtype=bfloat16"])
    model = make_tiny_gpt2(tokenizer).eval()
    player = ModelPlayer.of_run("checkpoint", model, tokenizer, config)
    assert player.collector.compute.autocast_dtype == "bfloat16" and player.collector.actions == "score"
    trained = ModelPlayer(
        "as trained", model, tokenizer, config.generation, "score", compute=ComputeConfig(autocast_dtype="bfloat16")
    )
    in_float32 = ModelPlayer("float32", model, tokenizer, config.generation, "score")
    evaluated = player.move_probabilities(PROMPTS, LEGAL)
    assert evaluated == trained.move_probabilities(PROMPTS, LEGAL)
    assert evaluated != in_float32.move_probabilities(PROMPTS, LEGAL)  # bfloat16's logits round differently


def test_exact_move_probabilities_refuse_what_answers_refuse(tokenizer):
    """Constrained moves end with EOS: with it suppressed, the exact probabilities would be NaN (every move's end
    impossible); they are refused with the same message as the answers."""
    from marllm.algorithms import GenerationConfig

    model = make_tiny_gpt2(tokenizer).eval()
    player = ModelPlayer("no eos", model, tokenizer, GenerationConfig(4, 8, stop_at_eos=False), "constrained")
    with pytest.raises(ValueError, match="stop_at_eos: false would suppress it"):
        player.move_probabilities(PROMPTS, LEGAL)
    with pytest.raises(ValueError, match="stop_at_eos: false would suppress it"):
        player.answer({"prompt": PROMPTS, "legal_moves": LEGAL})
