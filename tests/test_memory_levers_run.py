"""The three memory settings together in a training run from a config: a bfloat16 policy trained with stochastic
rounding, its reference in its own dtype, and gradient checkpointing."""

import math

import torch

from marllm.algorithms.stochastic_rounding import StochasticRoundingAdam
from marllm.run.setup import build
from marllm.run.train import train
from tests.test_train import tiny_config


def test_a_run_trains_a_bfloat16_policy_against_a_float32_reference_with_checkpointing(
    tmp_path, tiny_lm_dir, tiny_classifier_dir, reviews_file
):
    def config():
        made = tiny_config("ppo_imdb.yaml", tiny_lm_dir, tiny_classifier_dir, reviews_file, iterations=2)
        made.model.dtype, made.model.reference_dtype = "bfloat16", "float32"
        made.ppo.compute.gradient_checkpointing = True
        return made

    setup = build(config())
    learner = setup.learners["llm1"]
    assert next(learner.model.parameters()).dtype == torch.bfloat16
    assert {p.dtype for p in setup.reference.parameters()} == {torch.float32}
    assert isinstance(learner.optimizer, StochasticRoundingAdam)
    assert all(layer.gradient_checkpointing for layer in learner.model.transformer.h)
    result = train(config(), tmp_path / "run")
    assert len(result.history) == 2
    for key in ("llm1/loss/policy", "llm1/loss/value", "llm1/kl"):
        assert all(math.isfinite(metrics[key]) for metrics in result.history), key
