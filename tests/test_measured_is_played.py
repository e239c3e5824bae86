"""What is measured is what plays: the move probabilities a run tabulates (exploitability, a best-response seat,
``marllm eval --exploitability``) are those of the policy that samples the moves, on tiny models built here."""

from __future__ import annotations

import pytest
import torch

from marllm.models.generation_config import GenerationConfig
from marllm.models.legal_moves import exact_move_probabilities, generate_moves
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
    exact = exact_move_probabilities(model, tokenizer, [PROMPT], [MOVES], "constrained", generation)[0]
    unpenalised = GenerationConfig(repetition_penalty=1.0)
    tempered = exact_move_probabilities(model, tokenizer, [PROMPT], [MOVES], "constrained", unpenalised)[0]
    torch.manual_seed(0)
    n = 4000
    played = generate_moves(model, tokenizer, [PROMPT] * n, [MOVES] * n, generation).moves
    frequency = sum(move == 0 for move in played) / n
    standard_error = (exact[0] * (1 - exact[0]) / n) ** 0.5
    assert sum(exact) == pytest.approx(1.0, abs=1e-6)
    assert abs(frequency - exact[0]) < 3 * standard_error
    assert abs(frequency - tempered[0]) > 5 * standard_error  # the test can tell the two apart
