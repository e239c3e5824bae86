"""model.reference_dtype: the frozen reference loaded in its own dtype (a bfloat16 reference of a float32 policy is
half its bytes), never trained; equal to model.dtype it changes nothing; checked when the config is built."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from marllm.algorithms import GenerationConfig, PPOConfig
from marllm.config import ConfigError, load_config
from marllm.config.sections import ModelConfig
from marllm.models.lora_settings import LoraSettings
from marllm.models.placement import ModelPlacement
from marllm.models.policy import ReferencePool
from marllm.run.learners import make_learners, model_placement

ROOT = Path(__file__).resolve().parents[1]
CORY = ROOT / "examples" / "cory_imdb.yaml"
PROMPTS = ["this movie was", "what a", "the actors in this movie were all", "i think"] * 2
COLUMNS = ("response", "logprobs", "ref_logprobs", "values", "kl", "kl_full", "mask")


def rollout_with(path, reference_dtype):
    """The rollout of one learner from the model at ``path`` whose reference is loaded in ``reference_dtype``."""
    placement = ModelPlacement(device="cpu", reference_dtype=reference_dtype)
    ppo = PPOConfig.from_flat(mini_batch_size=8, kl_penalty="full")
    learners, reference = make_learners(str(path), ["llm1"], ppo, GenerationConfig(4, 8), placement=placement)
    torch.manual_seed(1)
    learners["llm1"].act({"prompt": PROMPTS})
    return learners["llm1"].rollouts[0].tensors, reference


def test_a_reference_dtype_equal_to_the_dtype_changes_nothing(tiny_lm_dir):
    plain, _ = rollout_with(tiny_lm_dir, None)
    same, reference = rollout_with(tiny_lm_dir, "float32")
    assert next(reference.parameters()).dtype == torch.float32
    for column in COLUMNS:
        assert torch.equal(same[column], plain[column]), column


def test_a_bfloat16_reference_of_a_float32_policy(tiny_lm_dir):
    plain, _ = rollout_with(tiny_lm_dir, None)
    half, reference = rollout_with(tiny_lm_dir, "bfloat16")
    assert {p.dtype for p in reference.parameters()} == {torch.bfloat16}
    assert not any(p.requires_grad for p in reference.parameters())  # frozen: no gradients, no optimiser state
    for column in ("response", "logprobs", "values", "mask"):  # the policy's columns are its own
        assert torch.equal(half[column], plain[column]), column
    for column in ("ref_logprobs", "kl", "kl_full"):
        assert half[column].dtype == torch.float32, column
    # bfloat16 weights and activations keep ~3 significant digits: on this tiny random model's log-probs (about -6,
    # a vocabulary of 300) the reference's differ by up to a few hundredths.
    difference = (half.ref_logprobs - plain.ref_logprobs).abs().max().item()
    assert 0 < difference < 0.05


def test_the_pool_keeps_one_reference_per_dtype(tiny_lm_dir):
    pool = ReferencePool()
    half = ModelPlacement(device="cpu", reference_dtype="bfloat16").load_reference(str(tiny_lm_dir), pool)
    full = ModelPlacement(device="cpu").load_reference(str(tiny_lm_dir), pool)
    assert len(pool) == 2 and half is not full
    assert next(full.parameters()).dtype == torch.float32


def test_reference_dtype_is_checked_when_the_config_is_built():
    assert ModelConfig().reference_dtype is None
    with pytest.raises(ValueError, match=r"model.reference_dtype: model dtype must be one of .*, got 'float8'"):
        ModelConfig(reference_dtype="float8")
    with pytest.raises(ValueError, match=r"model.reference_dtype bfloat16 with model.lora: the reference is the"):
        ModelConfig(reference_dtype="bfloat16", lora=LoraSettings(r=4))
    assert ModelConfig(dtype="bfloat16", reference_dtype="bfloat16", lora=LoraSettings(r=4)).reference_dtype
    with pytest.raises(ConfigError, match=r"model.reference_dtype: model dtype must be one of"):
        load_config(CORY, ["model.reference_dtype=half"])
    config = load_config(CORY, ["model.reference_dtype=bfloat16"])
    assert model_placement(config).reference_dtype == "bfloat16"
    with pytest.raises(ValueError, match="reference_dtype bfloat16 must be None or float32"):
        ModelPlacement(reference_dtype="bfloat16", lora=LoraSettings(r=4))


def test_full_bfloat16_training_is_a_config_choice_and_float16_is_refused():
    config = load_config(CORY, ["model.dtype=bfloat16"])  # trained with stochastic rounding
    assert config.model.dtype == "bfloat16" and config.model.lora is None
    with pytest.raises(ConfigError, match=r"model.dtype float16 with model.lora: null .* squared gradients underflow"):
        load_config(CORY, ["model.dtype=float16"])
    with pytest.raises(ValueError, match=r"sharded models are not trained with stochastic rounding"):
        ModelConfig(dtype="bfloat16", fsdp=True)
