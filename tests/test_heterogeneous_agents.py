"""Agents of different base models, each with its own tokenizer and reference, talking through text."""

import json

import pytest
import torch

from marllm.config.loading import ConfigError
from marllm.evaluation.cross_play import cross_play_of_checkpoints
from marllm.evaluation.deployed import load_deployed_model
from marllm.loop import run_iteration
from marllm.models.placement import ModelPlacement
from marllm.run.learners import make_learners
from marllm.run.setup import build
from marllm.run.train import train
from tests.conftest import make_tiny_gpt2, make_tokenizer
from tests.test_train import tiny_config


@pytest.fixture(scope="module")
def other_lm_dir(tmp_path_factory):
    """A second tiny GPT-2 whose tokenizer differs from the first's (a smaller BPE vocabulary)."""
    tokenizer = make_tokenizer(vocab_size=280)
    path = tmp_path_factory.mktemp("other-gpt2")
    make_tiny_gpt2(tokenizer, seed=1).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def hetero_config(tiny_lm_dir, other_lm_dir, tiny_classifier_dir, reviews_file, **top):
    config = tiny_config("cory_imdb.yaml", tiny_lm_dir, tiny_classifier_dir, reviews_file, iterations=2, **top)
    config.agents.models = {"llm2": str(other_lm_dir)}
    config.agents.role_period = 1
    config.logging.save_checkpoint = True
    return config


def test_each_learner_has_its_base_tokenizer_and_reference(tiny_lm_dir, other_lm_dir, tiny_classifier_dir,
                                                           reviews_file):
    setup = build(hetero_config(tiny_lm_dir, other_lm_dir, tiny_classifier_dir, reviews_file))
    llm1, llm2 = setup.learners["llm1"], setup.learners["llm2"]
    assert len(llm1.tokenizer) == 300 and len(llm2.tokenizer) == 280
    assert llm1.tokenizer("the movie")["input_ids"] != llm2.tokenizer("the movie")["input_ids"]
    assert llm1.reference is not llm2.reference
    assert llm2.model.config.vocab_size == 280 and set(setup.reference) == {str(tiny_lm_dir), str(other_lm_dir)}
    policies = {name: parameters(learner.model) for name, learner in setup.learners.items()}
    references = {name: parameters(learner.reference) for name, learner in setup.learners.items()}
    metrics, dialogues = run_iteration(setup.env, setup.learners, seed=0)
    # llm2 reads llm1's text, tokenized with its own vocabulary, and both are trained: each policy moved (its first
    # batch had no KL: it was its reference), no reference did
    assert dialogues["llm2"]["role"] == "observer" and all(dialogues["llm2"]["turns"][0]["prompts"])
    for name, learner in setup.learners.items():
        # (0 up to the rounding between generate's KV-cached forwards, which give the rollout its log-probs, and the
        # reference's full forward)
        assert abs(metrics[f"{name}/kl"]) < 1e-5, name
        moved = max((a - b).abs().max().item() for a, b in zip(parameters(learner.model), policies[name], strict=True))
        assert moved > 1e-4, name
        assert all(map(torch.equal, parameters(learner.reference), references[name])), name
    # the next batch comes from the moved policies: each is now some way from its own reference
    metrics, _ = run_iteration(setup.env, setup.learners, seed=1)
    assert metrics["llm1/kl"] > 1e-4 and metrics["llm2/kl"] > 1e-4, metrics


def parameters(model):
    return [p.detach().clone() for p in model.parameters()]


def test_a_heterogeneous_run_trains_saves_and_cross_plays(tmp_path, tiny_lm_dir, other_lm_dir, tiny_classifier_dir,
                                                          reviews_file):
    config = hetero_config(tiny_lm_dir, other_lm_dir, tiny_classifier_dir, reviews_file)
    result = train(config, tmp_path / "run")
    assert [m["llm2/role"] for m in result.history] == ["observer", "pioneer"]
    # each base model deployed alone, by its own name, then each learner
    models = [row["model"] for row in result.eval_rows]
    assert list(dict.fromkeys(models)) == [f"base:{tiny_lm_dir}", f"base:{other_lm_dir}", "llm1", "llm2"]
    saved = tmp_path / "run" / "checkpoints" / "llm2"
    model, label, tokenizer = load_deployed_model(config, saved)
    assert len(tokenizer) == 280 and model.config.vocab_size == 280 and label == str(saved)
    outcome = cross_play_of_checkpoints(config, ["base", str(tmp_path / "run")], num_queries=3, progress=False)
    assert outcome.models == ["base", "run/llm1", "run/llm2"] and len(outcome.cells) == 3 + 3 * 3
    assert json.dumps(outcome.to_dict())


def test_lora_learners_of_two_bases_get_one_shared_base_each(tiny_lm_dir, other_lm_dir):
    from marllm.models.lora import LoraSettings

    lora = LoraSettings(r=2, alpha=4, target_modules=["c_attn"])
    models = {"m1": str(tiny_lm_dir), "m2": str(tiny_lm_dir), "m3": str(other_lm_dir)}
    placement = ModelPlacement(device="cpu", lora=lora)
    learners, reference = make_learners(models, ["m1", "m2", "m3"], placement=placement)
    assert learners["m1"].model is learners["m2"].model and learners["m3"].model is not learners["m1"].model
    assert reference is None and len(learners["m3"].tokenizer) == 280
    with pytest.raises(ValueError, match=r"no model for learner\(s\) \[.m4.\]"):
        make_learners(models, ["m1", "m4"], placement=ModelPlacement(device="cpu"))


def test_agents_models_are_checked(tiny_lm_dir, other_lm_dir, tiny_classifier_dir, reviews_file, tmp_path):
    with pytest.raises(ConfigError, match=r"agents.models names unknown learner\(s\) \['llm3'\]"):
        tiny_config("cory_imdb.yaml", tiny_lm_dir, tiny_classifier_dir, reviews_file,
                    agents={"models": {"llm3": str(other_lm_dir)}})
    config = hetero_config(tiny_lm_dir, tmp_path / "missing", tiny_classifier_dir, reviews_file)
    with pytest.raises(ConfigError, match="agents.models.llm2"):
        config.check_references()


def test_model_placement_is_checked_when_made():
    from marllm.models.lora import LoraSettings
    from marllm.parallel.placement import Sharded

    with pytest.raises(TypeError, match="fsdp_compute_dtype"):
        ModelPlacement(fsdp_compute_dtype="bfloat16")  # the compute dtype of sharded models is the Sharded placement's
    with pytest.raises(TypeError, match="rank"):
        Sharded()  # no data-parallel ranks to shard over
    with pytest.raises(ValueError, match="fsdp shards full models"):
        ModelPlacement(processes=Sharded(0, 2), lora=LoraSettings(r=2, alpha=4, target_modules=["c_attn"]))
    placement = ModelPlacement(device="cpu", devices={"llm2": "meta"})
    assert (placement.device_of("llm1"), placement.device_of("llm2")) == ("cpu", "meta")
