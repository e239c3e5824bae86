"""The algorithm catalog: one list of names, read by the config checks and the learners' builder alike, without
torch; and a learner of one's own, named by reference as a task is, trains with no other edit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from marllm.algorithms.catalog import ALGORITHM_REGISTRY, AlgorithmOptions, build_learner
from marllm.cli import main
from marllm.config import ConfigError, load_config
from tests.conftest import make_tiny_gpt2

# A learner of one's own: PPO trained on the sign of each reward, in one file, nothing else edited.
SIGN_PPO = '''
import numpy as np

from marllm.algorithms import CriticFreeLearner, PPOLearner


class MyRLOO(CriticFreeLearner):
    """RLOO under another name: a critic-free learner says its advantage by its variant."""

    variant = "rloo"


class SignPPO(PPOLearner):
    """PPO on the sign of each reward."""

    built = []

    def __init__(self, name, **kwargs):
        super().__init__(name, **kwargs)
        SignPPO.built.append(name)

    def _transform_scores(self, scores, global_rows=None):
        return np.sign(scores)


class BadInit(PPOLearner):
    """A learner whose constructor takes an argument of its own without a from_options to give it."""

    def __init__(self, required_thing):
        super().__init__(required_thing)


class BrokenInside(PPOLearner):
    """A learner whose constructor binds but fails inside: its own error, as it is."""

    def __init__(self, name, **kwargs):
        len(3)


def make_learner():
    return None


def not_a_builder():
    return None


NOT_CALLABLE = 3
'''


@pytest.fixture
def project(tmp_path, tiny_lm_dir):
    """A folder holding a learner module and the config that names it, as a user's project would."""
    (tmp_path / "learner.py").write_text(SIGN_PPO)
    reward = "def length(samples, responses):\n    return [len(r) - 4.0 for r in responses]\n"
    (tmp_path / "rewards.py").write_text(reward)
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["a", "b", "c", "d"]))
    return tmp_path


def config_of(project, lm_dir, algorithm, roles=("speaker",)):
    data = {
        "model": {"name_or_path": str(lm_dir), "device": "cpu"},
        "task": {"name": "text", "dataset": str(project / "prompts.jsonl"), "query_column": "prompt",
                 "reward": f"{project / 'rewards.py'}:length"},
        "env": {"roles": list(roles), "templates": {role: "{query}" for role in roles}, "batch_size": 2},
        "agents": {"algorithm": algorithm},
        "ppo": {"batching": {"mini_batch_size": 2, "ppo_epochs": 1}},
        "generation": {"min_new_tokens": 2, "max_new_tokens": 3},
        "logging": {"tensorboard": False, "progress": False, "eval_queries": 2, "checkpoint_every": None},
    }  # fmt: skip
    path = project / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_learner_class_in_a_file_beside_the_config_trains(project, tiny_lm_dir, tmp_path_factory, monkeypatch):
    path = config_of(project, tiny_lm_dir, "learner.py:SignPPO")  # relative to the config's folder
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    config = load_config(path)
    assert config.agents.algorithm == f"{project / 'learner.py'}:SignPPO"  # the run's saved config finds it too
    run_dir = project / "run"
    assert main(["train", str(path), "iterations=1", "--run-dir", str(run_dir)]) == 0
    from marllm.utils.imports import load_reference

    assert load_reference(config.agents.algorithm).built == ["llm1"]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1 and "llm1/loss/total" in metrics[0]


@pytest.mark.parametrize(
    ("algorithm", "message"),
    [
        ("ppo2", r"unknown algorithm 'ppo2'; one of \['ppo', 'grpo', 'rloo', 'reinforce_pp'\], or one by reference"),
        (":SignPPO", "names no module or no object"),
    ],
)
def test_an_unknown_algorithm_is_a_config_error_naming_both_forms(project, tiny_lm_dir, algorithm, message):
    with pytest.raises(ConfigError, match=message):
        load_config(config_of(project, tiny_lm_dir, algorithm))


@pytest.mark.parametrize(
    ("name", "message"),
    [("NOT_CALLABLE", "is a int without from_options"), ("Missing", "has no 'Missing'")],
)
def test_a_reference_that_builds_no_learner_is_refused_when_built(project, tokenizer, name, message):
    model, reference = make_tiny_gpt2(tokenizer), make_tiny_gpt2(tokenizer)
    with pytest.raises(ValueError, match=message):
        build_learner(f"{project / 'learner.py'}:{name}", "llm", AlgorithmOptions(), model=model,
                      tokenizer=tokenizer, reference=reference)  # fmt: skip


@pytest.mark.parametrize("name", ["BadInit", "make_learner"])
def test_a_reference_whose_signature_does_not_take_the_catalogs_arguments_is_one_clear_error(project, tokenizer, name):
    model, reference = make_tiny_gpt2(tokenizer), make_tiny_gpt2(tokenizer)
    # checked against the declared signature before the call (no traceback read): Python's own reason, and the
    # class named as a config names it
    refusal = rf"{project / 'learner.py'}:{name} cannot be built with the catalog's arguments \((got an unexpected " \
        r"keyword|too many positional)"
    with pytest.raises(ValueError, match=refusal):
        build_learner(f"{project / 'learner.py'}:{name}", "llm", AlgorithmOptions(), model=model,
                      tokenizer=tokenizer, reference=reference)  # fmt: skip
    with pytest.raises(TypeError, match="object of type 'int' has no len"):  # an error inside is left as it is
        build_learner(f"{project / 'learner.py'}:BrokenInside", "llm", AlgorithmOptions(), model=model,
                      tokenizer=tokenizer, reference=reference)  # fmt: skip


def test_every_catalog_entry_builds_a_learner_of_its_algorithm(tokenizer):
    for name in ALGORITHM_REGISTRY:
        model, reference = make_tiny_gpt2(tokenizer), make_tiny_gpt2(tokenizer)
        options = AlgorithmOptions(group_size=2)
        learner = build_learner(name, "llm", options, model=model, tokenizer=tokenizer, reference=reference)
        assert getattr(learner, "algorithm", "ppo") == name
        assert (learner.value_head is not None) == (name == "ppo")


def test_the_catalog_loads_no_torch():
    code = "import sys, marllm.algorithms.catalog; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_a_critic_free_learner_named_by_reference_computes_its_variant(project, tokenizer):
    model, reference = make_tiny_gpt2(tokenizer), make_tiny_gpt2(tokenizer)
    learner = build_learner(f"{project / 'learner.py'}:MyRLOO", "llm", AlgorithmOptions(group_size=2), model=model,
                            tokenizer=tokenizer, reference=reference)  # fmt: skip
    assert type(learner).__name__ == "MyRLOO" and learner.algorithm == "rloo" and learner.value_head is None
    with pytest.raises(ValueError, match="rloo compares the responses to the same query"):
        build_learner(f"{project / 'learner.py'}:MyRLOO", "llm", AlgorithmOptions(group_size=1), model=model,
                      tokenizer=tokenizer, reference=reference)  # fmt: skip


def test_a_missing_learner_file_is_a_config_error_before_anything_loads(project, tiny_lm_dir):
    with pytest.raises(ConfigError, match=r"'.*gone.py:SignPPO' names the file .*gone.py, which does not exist"):
        load_config(config_of(project, tiny_lm_dir, "gone.py:SignPPO"))


def test_each_learners_reference_is_relative_to_where_it_was_set(project, tiny_lm_dir, tmp_path_factory, monkeypatch):
    """A per-learner mapping: the entry from the file against the config's folder, the one an override set against
    the working directory."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / "other.py").write_text(SIGN_PPO)
    path = config_of(project, tiny_lm_dir, {"llm1": "learner.py:SignPPO"}, roles=("a", "b"))
    monkeypatch.chdir(elsewhere)
    config = load_config(path, ["agents.algorithm.llm2=other.py:SignPPO"])
    assert config.agents.algorithm == {
        "llm1": f"{project / 'learner.py'}:SignPPO",
        "llm2": f"{elsewhere / 'other.py'}:SignPPO",
    }


def test_a_learner_class_from_a_file_passes_the_public_check(project):
    """The one-file learner of the catalog's example passes marllm.testing.check_learner, as a built-in does."""
    from marllm.testing import check_learner
    from tests.test_learner_conformance import observations, tiny_learner

    reference = f"{project / 'learner.py'}:SignPPO"
    report = check_learner(lambda: tiny_learner(None, reference), *observations("ppo"))
    assert report["first_update_on_policy"].startswith("largest log-prob difference")
    assert report["resume_equals_uninterrupted"].startswith("largest weight difference")
