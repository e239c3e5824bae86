"""Evaluation plays a checkpoint as its run trained it: the players that ``marllm eval``, the exploitability
evaluation and the round-robin build take the run's ``ppo.compute`` settings, so a run trained under bfloat16 autocast
is evaluated and tabulated under it, not in float32."""

from __future__ import annotations

from pathlib import Path

from marllm.algorithms.ppo_config import ComputeConfig
from marllm.config import load_config
from marllm.games.model_player import ModelPlayer
from tests.conftest import make_tiny_gpt2

KUHN = Path(__file__).resolve().parents[1] / "examples" / "games" / "kuhn_poker_offline.yaml"
PROMPTS = ["Your card: K. You may pass or bet.", "Your card: J. The other player bet."]
LEGAL = [["pass", "bet"], ["pass", "bet"]]


def test_a_run_trained_under_autocast_is_evaluated_under_it(tokenizer):
    config = load_config(KUHN, ["game.actions.mode=score", "ppo.compute.autocast_dtype=bfloat16"])
    model = make_tiny_gpt2(tokenizer).eval()
    player = ModelPlayer.of_run("checkpoint", model, tokenizer, config)
    assert player.collector.compute == config.ppo.compute and player.collector.actions == "score"
    trained = ModelPlayer(
        "as trained", model, tokenizer, config.generation, "score", compute=ComputeConfig(autocast_dtype="bfloat16")
    )
    in_float32 = ModelPlayer("float32", model, tokenizer, config.generation, "score")
    evaluated = player.move_probabilities(PROMPTS, LEGAL)
    assert evaluated == trained.move_probabilities(PROMPTS, LEGAL)
    assert evaluated != in_float32.move_probabilities(PROMPTS, LEGAL)  # bfloat16's logits round differently
