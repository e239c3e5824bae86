"""``marllm plan``: its arithmetic checked against what a tiny model really allocates — the activations autograd saves
at full depth, the weights, gradients and Adam state of learners after an update — and its command line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from marllm.cli import main
from marllm.config import config_from_dict
from marllm.models.memory import activation_bytes, model_shape, saved_tensor_bytes
from marllm.run.learners import learners_from_config
from marllm.run.plan import CPU_RUNTIME_BYTES, plan_memory, prompt_tokens
from tests.test_durable_runs import cory_data
from tests.test_gradient_checkpointing import tiny_qwen2


def identity(name: str) -> str:
    return name


@pytest.fixture
def cory(tiny_lm_dir, tiny_classifier_dir, reviews_file):
    def make(**top):
        return config_from_dict(cory_data(tiny_lm_dir, tiny_classifier_dir, reviews_file, **top))

    return make


def real_saved_bytes(model, rows: int, tokens: int, checkpointing: bool = False) -> int:
    """What autograd keeps for the backward of the full-depth trunk, measured on a real forward."""
    ids = torch.randint(1, 100, (rows, tokens))
    mask = torch.ones_like(ids)
    mask[0, : tokens // 4] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with saved_tensor_bytes(exclude=list(model.parameters())) as saved:
        model.get_decoder()(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
    return saved[0]


@pytest.mark.parametrize("architecture", ["gpt2", "qwen2"])
def test_activations_measured_on_two_layers_are_those_of_the_full_depth(tmp_path, tokenizer, architecture):
    from tests.conftest import make_tiny_gpt2

    model = make_tiny_gpt2(tokenizer) if architecture == "gpt2" else tiny_qwen2(tokenizer)
    text = model.config
    for key in ("n_layer", "num_hidden_layers"):
        if hasattr(text, key):
            setattr(text, key, 5)
    if getattr(text, "layer_types", None):
        text.layer_types = text.layer_types[:1] * 5
    deep = AutoModelForCausalLM.from_config(text).eval()
    deep.save_pretrained(tmp_path)
    shape = model_shape(str(tmp_path))
    assert shape.layers == 5 and shape.parameters == sum(p.numel() for p in deep.parameters())
    estimated = activation_bytes(shape, 24, "float32").total(6)
    # Linear in rows and layers by construction; the only approximation is that each row costs what the measured
    # pair's average row does (one of two rows is left-padded there, as one of six here).
    assert estimated == pytest.approx(real_saved_bytes(deep, 6, 24), rel=0.02)


def test_weights_gradients_and_adam_state_are_counted_as_allocated(cory, tiny_lm_dir, tokenizer):
    """After an update the plan's kept lines match the learners' real tensors: fp32, pure bfloat16, LoRA."""
    for overrides in ({}, {"model__dtype": "bfloat16"}, {"model__lora": {"r": 4}, "model__dtype": "bfloat16"}):
        config = cory(**overrides, env__batch_size=4, ppo__batching__mini_batch_size=4, ppo__batching__ppo_epochs=1)
        plan = plan_memory(config, identity)
        learners, reference = learners_from_config(config, tokenizer)
        for learner in learners.values():
            learner.act({"prompt": ["the film was", "i think", "what a", "it is"]})
            learner.finish(np.zeros(4))
            learner.update()
        kept = {line.name: line.bytes for line in plan.kept}
        models = {id(learner.model): learner.model for learner in learners.values()}
        weights = sum(p.numel() * p.element_size() for m in models.values() for n, p in m.named_parameters()
                      if "lora_" not in n)  # fmt: skip
        adapters = sum(p.numel() * p.element_size() for m in models.values() for n, p in m.named_parameters()
                       if "lora_" in n)  # fmt: skip
        assert kept["weights"] == weights, overrides
        assert kept["adapters"] == adapters, overrides
        assert kept["reference"] == (0 if reference is None else sum(
            p.numel() * p.element_size() for p in reference.parameters()))  # fmt: skip
        heads = {id(p) for learner in learners.values() for p in learner.value_head.parameters()}
        state = sum(t.numel() * t.element_size() for learner in learners.values()
                    for p, s in learner.optimizer.state.items() if id(p) not in heads
                    for t in s.values() if torch.is_tensor(t) and t.dim() > 0)  # fmt: skip
        assert kept["optimiser"] == state, overrides
        # Gradients are freed when an update ends: the plan counts one learner's, while it updates.
        assert all(p.grad is None for learner in learners.values() for p in learner.model.parameters())
        assert plan.update[0].name == "gradients" and plan.update[0].bytes == state / 2 / len(learners)


def test_levers_are_listed_when_the_run_does_not_fit(cory):
    config = cory()
    plan = plan_memory(config, identity, capacity=CPU_RUNTIME_BYTES + 1, device="cpu")
    assert plan.fits is False and plan.levers
    levers = dict(plan.levers)
    assert levers["model.dtype: bfloat16"] < plan.peak
    assert levers["ppo.compute.gradient_checkpointing: true"] < plan.peak
    assert any(name.startswith("model.lora") for name in levers)
    assert [peak for _, peak in plan.levers] == sorted(peak for _, peak in plan.levers)
    assert plan_memory(config, identity, capacity=1e15).levers == []


def test_prompt_length_follows_the_templates(cory):
    config = cory(task__query_max_tokens=8, generation__max_new_tokens=16)
    templates = config.role_templates()
    literal = len(templates["observer"].replace("{query}", "").replace("{pioneer}", ""))
    assert prompt_tokens(config) == 8 * templates["observer"].count("{query}") + 16 + -(-literal // 3)


def test_the_plan_follows_the_levers(cory):
    base = plan_memory(cory(), identity)
    chunked = plan_memory(cory(ppo__compute__logits_chunk_rows=1), identity)
    assert chunked.update[2].bytes < base.update[2].bytes
    checkpointed = plan_memory(cory(ppo__compute__gradient_checkpointing=True), identity)
    assert checkpointed.update[1].bytes < base.update[1].bytes
    half = plan_memory(cory(model__reference_dtype="bfloat16"), identity)
    assert half.kept[3].bytes == base.kept[3].bytes / 2


def test_cli_prints_the_plan_and_refuses_a_bad_device(tmp_path, cory, tiny_lm_dir, tiny_classifier_dir, reviews_file,
                                                      capsys):  # fmt: skip
    import yaml

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cory_data(tiny_lm_dir, tiny_classifier_dir, reviews_file)))
    assert main(["plan", str(path), "env.batch_size=8", "--device", "0.0001"]) == 0
    out = capsys.readouterr().out
    assert "batch 8" in out and "does NOT fit" in out and "levers" in out and "model.dtype: bfloat16" in out
    assert main(["plan", str(path), "--device", "tpu"]) == 2
    assert "--device must be cpu, cuda or a positive number of GiB, got 'tpu'" in capsys.readouterr().err
