"""The training loop end to end on tiny local stand-ins: CLI smoke run, role swap, determinism, tasks."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from marllm.config import config_from_dict, load_config
from marllm.rewards.sentiment import ClassifierReward
from marllm.run.setup import build
from marllm.run.train import train
from marllm.tasks.sentiment import SentimentTask

ROOT = Path(__file__).resolve().parents[1]


def tiny_overrides(lm, classifier, reviews):
    return {
        "model": {"name_or_path": str(lm), "device": "cpu"},
        "task": {
            "dataset": str(reviews),
            "eval_split": None,
            "min_text_chars": 20,
            "reward_model": str(classifier),
        },
        "env": {"batch_size": 4},
        "ppo": {
            "batching": {"mini_batch_size": 2, "ppo_epochs": 2},
            "optimiser": {"learning_rate": 1e-3},
            "compute": {"forward_batch_size": None},
        },
        "logging": {"tensorboard": False, "eval_queries": 3, "progress": False, "save_checkpoint": False},
    }


def merge_settings(data: dict, overrides: dict) -> dict:
    """``data`` (a config's YAML data) with ``overrides`` set in it key by key, into sections at any depth."""
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            merge_settings(data[key], value)
        else:
            data[key] = value
    return data


def tiny_config(base_yaml, lm, classifier, reviews, **top):
    data = yaml.safe_load((ROOT / "examples" / base_yaml).read_text())
    merge_settings(data, tiny_overrides(lm, classifier, reviews))
    data.update(top)
    return config_from_dict(data)


def test_cli_trains_cory_from_yaml_with_role_swap(tmp_path, tiny_lm_dir, tiny_classifier_dir, reviews_file):
    data = yaml.safe_load((ROOT / "examples" / "cory_imdb.yaml").read_text())
    merge_settings(data, tiny_overrides(tiny_lm_dir, tiny_classifier_dir, reviews_file))
    data["logging"].update({"tensorboard": True, "save_checkpoint": True})
    config_path = tmp_path / "cory_tiny.yaml"
    config_path.write_text(yaml.safe_dump(data))
    run_dir = tmp_path / "run"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "marllm.cli",
            "train",
            str(config_path),
            "iterations=6",
            "agents.role_period=2",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in lines] == list(range(6))
    roles = [(m["llm1/role"], m["llm2/role"]) for m in lines]
    swapped = ("observer", "pioneer")
    assert roles == [("pioneer", "observer")] * 2 + [swapped] * 2 + [("pioneer", "observer")] * 2
    for m in lines:
        for learner in ("llm1", "llm2"):
            for key in (
                "task_reward",
                "received_reward",
                "kl",
                "combined_reward",
                "kl_coef",
                "loss/policy",
                "loss/value",
                "response_length",
            ):
                assert np.isfinite(m[f"{learner}/{key}"]), (learner, key)
        # CORY: both agents are trained on the same collective reward r1 + r2
        assert m["llm1/received_reward"] == pytest.approx(m["llm2/received_reward"])
        assert m["llm1/received_reward"] == pytest.approx(m["llm1/task_reward"] + m["llm2/task_reward"])
        assert m["time/iteration_s"] >= m["time/generation_s"] > 0
    evals = [json.loads(line) for line in (run_dir / "eval_samples.jsonl").read_text().splitlines()]
    assert sorted({row["model"] for row in evals}) == ["base", "llm1", "llm2"]
    assert len(evals) == 9
    run = json.loads((run_dir / "run.json").read_text())
    assert run["learners"] == ["llm1", "llm2"] and run["name"] == "cory"
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    policy = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / "llm1" / "policy")
    assert policy.config.n_layer == 2
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    observer_rows = [s for s in samples if s["role"] == "observer"]
    assert observer_rows and all(s["prompt"].startswith("I can make this sentence") for s in observer_rows)


def test_cli_reports_config_errors(tmp_path, capsys):
    from marllm.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("ppo:\n  optimiser:\n    learning_rat: 0.1\n")
    assert main(["train", str(bad)]) == 2
    assert "ppo.optimiser.learning_rat" in capsys.readouterr().err


def test_training_is_deterministic_for_a_seed(tmp_path, tiny_lm_dir, tiny_classifier_dir, reviews_file):
    histories = []
    for attempt in range(2):
        config = tiny_config("cory_imdb.yaml", tiny_lm_dir, tiny_classifier_dir, reviews_file, iterations=3, seed=7)
        result = train(config, tmp_path / f"run{attempt}")
        histories.append([{k: v for k, v in m.items() if not k.startswith("time/")} for m in result.history])
    assert histories[0] == histories[1]
    assert (tmp_path / "run0" / "samples.jsonl").read_text() == (tmp_path / "run1" / "samples.jsonl").read_text()


def test_ppo_config_trains_a_single_agent(tmp_path, tiny_lm_dir, tiny_classifier_dir, reviews_file):
    config = tiny_config("ppo_imdb.yaml", tiny_lm_dir, tiny_classifier_dir, reviews_file, iterations=2)
    result = train(config, tmp_path / "ppo")
    assert all(m["llm1/role"] == "pioneer" for m in result.history)
    assert not any(k.startswith("llm2/") for k in result.history[0])
    # a lone agent is trained on its own task reward
    assert result.history[0]["llm1/received_reward"] == pytest.approx(result.history[0]["llm1/task_reward"])


def test_learners_share_one_reference_and_own_their_models(tiny_lm_dir, tiny_classifier_dir, reviews_file):
    config = tiny_config("cory_imdb.yaml", tiny_lm_dir, tiny_classifier_dir, reviews_file)
    setup = build(config)
    llm1, llm2 = setup.learners["llm1"], setup.learners["llm2"]
    assert llm1.reference is llm2.reference is setup.reference
    assert llm1.model is not llm2.model and llm1.optimizer is not llm2.optimizer


def test_example_configs_are_the_papers_setup():
    cory, ppo = load_config(ROOT / "examples/cory_imdb.yaml"), load_config(ROOT / "examples/ppo_imdb.yaml")
    assert cory.model.name_or_path == ppo.model.name_or_path == "gpt2-large"
    assert cory.task.reward_model == "lvwerra/distilbert-imdb" and cory.task.dataset == "imdb"
    assert cory.env.templates["observer"] == 'I can make this sentence "{query}{pioneer}" more positive: {query}'
    assert cory.agents.role_period == 5 and ppo.agents.role_period is None
    assert np.array_equal(cory.coefficient_matrix(), np.ones((2, 2))) and ppo.coefficient_matrix() is None
    for config in (cory, ppo):
        assert config.iterations == 100 and config.env.batch_size == 256
        assert config.ppo.optimiser.learning_rate == pytest.approx(1.41e-5) and config.ppo.batching.ppo_epochs == 4
        assert (config.ppo.kl.init_kl_coef, config.ppo.kl.target_kl, config.ppo.kl.kl_horizon) == (0.3, 6.0, 10_000)
        assert (config.ppo.gamma, config.ppo.lam, config.ppo.clip_range, config.ppo.vf_coef) == (1.0, 0.95, 0.2, 0.1)
        assert config.ppo.score_transform == "normalize"
        assert (config.generation.min_new_tokens, config.generation.max_new_tokens) == (4, 16)


def test_sentiment_queries_are_review_openings(tokenizer, reviews_file):
    task = SentimentTask(dataset=str(reviews_file), min_text_chars=20, query_min_tokens=2, query_max_tokens=4)
    reviews = task.load_split("train")
    queries = task.queries(reviews, tokenizer, seed=0)
    assert len(queries) == len(reviews)
    for row in queries:
        ids = tokenizer.encode(row["query"])
        assert 2 <= len(ids) <= 4
        assert row["text"].startswith(row["query"])
    assert queries["query"] == task.queries(reviews, tokenizer, seed=0)["query"]


def test_sentiment_task_input_errors(tokenizer, reviews_file, tmp_path):
    task = SentimentTask(dataset=str(reviews_file), text_column="review")
    with pytest.raises(ValueError, match=r"has no column\(s\) \['review'\]"):
        task.queries(task.load_split("train"), tokenizer, 0)
    long_only = SentimentTask(dataset=str(reviews_file), min_text_chars=10_000)
    with pytest.raises(ValueError, match="no review of at least 10000 characters"):
        long_only.queries(long_only.load_split("train"), tokenizer, 0)
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        SentimentTask(dataset=str(tmp_path / "missing.jsonl")).load_split("train")
    with pytest.raises(ValueError, match="query_min_tokens"):
        SentimentTask(query_min_tokens=5, query_max_tokens=2)


def test_classifier_reward_is_the_positive_logit(tiny_classifier_dir):
    reward = ClassifierReward(str(tiny_classifier_dir), positive_label="POSITIVE", device="cpu", batch_size=2)
    samples = [{"query": "this movie"}, {"query": "the film"}, {"query": "i"}]
    responses = [" was good", " was bad", " loved it"]
    scores = reward(samples, responses)
    tokenizer = AutoTokenizer.from_pretrained(tiny_classifier_dir)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_classifier_dir).eval()
    for sample, response, score in zip(samples, responses, scores, strict=True):
        with torch.no_grad():
            logits = model(**tokenizer(sample["query"] + response, return_tensors="pt")).logits
        assert score == pytest.approx(logits[0, 1].item(), abs=1e-5)
    with pytest.raises(ValueError, match="no label 'pos'.*NEGATIVE"):
        ClassifierReward(str(tiny_classifier_dir), positive_label="pos", device="cpu")


def test_custom_env_example_runs(tiny_lm_dir):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import custom_env
    finally:
        sys.path.pop(0)
    history = custom_env.main(str(tiny_lm_dir), iterations=3)
    assert [m["ann/role"] for m in history] == ["drafter", "drafter", "reviewer"]
    assert {"ann/kl", "bob/kl", "cid/kl"} <= set(history[0])
    assert all(m["ann/received_reward"] == m["bob/received_reward"] == m["cid/received_reward"] for m in history)


def test_offline_main_job_configs_differ_only_in_the_agents():
    cory = load_config(ROOT / "examples/cory_offline.yaml").to_dict()
    ppo = load_config(ROOT / "examples/ppo_offline.yaml").to_dict()
    assert cory["model"]["name_or_path"] == "marllm:offline-base"
    assert cory["task"]["reward_model"] == "marllm:offline-sentiment"
    one_process = {"models": None, "algorithm": "ppo", "devices": None, "reference_device": None}
    assert cory["agents"] == {"learners": ["llm1", "llm2"], "reward_coefficients": 1.0, "role_period": 5, **one_process}
    assert ppo["agents"] == {"learners": ["llm1"], "reward_coefficients": None, "role_period": None, **one_process}
    assert ppo["env"]["roles"] == ["pioneer"] and cory["env"]["roles"] == ["pioneer", "observer"]
    for config in (cory, ppo):
        for key in ("name", "agents", "env"):
            config.pop(key)
    assert cory == ppo
