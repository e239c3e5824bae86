"""``ppo.optimiser.anneal_updates``: the learning rate falls linearly to 0 over a learner's updates, set from its update
count (so a restored learner goes on where it was), and is logged; without it nothing changes."""

from __future__ import annotations

import json

import pytest
import torch

from marllm.algorithms import PPOConfig
from tests.test_action_modes import PROMPTS, SCORE_MOVES, constrained_learner, reinforce_score_learner

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def one_update(learner):
    learner.act({"prompt": PROMPTS, "legal_moves": SCORE_MOVES})
    learner.finish([1.0, 0.0, -1.0, 0.5])
    return learner.update()


@pytest.mark.parametrize("make", [constrained_learner, reinforce_score_learner])
def test_the_learning_rate_falls_linearly_over_the_updates(tokenizer, make):
    torch.manual_seed(0)
    learner = make(tokenizer, mini_batch_size=4, learning_rate=1e-3, anneal_updates=4)
    rates = []
    for _ in range(5):
        metrics = one_update(learner)
        rates.append(metrics["learning_rate"])
        assert all(group["lr"] == rates[-1] for group in learner.optimizer.param_groups)
    assert rates == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4, 0.0])
    tensors, meta = learner.state_dict()
    restored = make(tokenizer, mini_batch_size=4, learning_rate=1e-3, anneal_updates=8)
    restored.load_state_dict(tensors, json.loads(json.dumps(meta)))
    assert one_update(restored)["learning_rate"] == pytest.approx(1e-3 * (1 - 5 / 8))  # its 6th update


def test_a_constant_learning_rate_logs_nothing_new(tokenizer):
    torch.manual_seed(0)
    learner = constrained_learner(tokenizer, mini_batch_size=4, learning_rate=1e-3)
    assert "learning_rate" not in one_update(learner)
    assert [group["lr"] for group in learner.optimizer.param_groups] == [1e-3]
    with pytest.raises(ValueError, match="anneal_updates"):
        PPOConfig.from_flat(anneal_updates=0)
