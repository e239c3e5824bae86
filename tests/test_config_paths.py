"""One rule for every path in a config (issue 35, item 6): relative to the config file (an override's, to the working
directory), written absolute into the run's saved config.yaml, so that eval and --resume work from anywhere."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from marllm.cli import main
from marllm.config import load_config
from marllm.config.paths import absolute_config_paths
from marllm.run.run_dir import read_run_state
from tests.test_custom_tasks import PROMPTS, REWARDS
from tests.test_train import ROOT


def project(tmp_path: Path, tiny_lm_dir: Path) -> Path:
    """A user's project folder: a config naming its prompts, reward, model and run directory by relative paths."""
    folder = tmp_path / "proj"
    (folder / "data").mkdir(parents=True)
    (folder / "rewards.py").write_text(REWARDS)
    (folder / "data" / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    (folder / "model").symlink_to(tiny_lm_dir)
    data = {
        "name": "paths",
        "iterations": 1,
        "run_dir": "runs/paths",
        "model": {"name_or_path": "model", "device": "cpu"},
        "task": {"name": "text", "dataset": "data/prompts.jsonl", "query_column": "prompt",
                 "reward": "rewards.py:length"},
        "env": {"roles": ["speaker"], "templates": {"speaker": "{query}"}, "batch_size": 2},
        "ppo": {"batching": {"mini_batch_size": 2, "ppo_epochs": 1}},
        "generation": {"min_new_tokens": 2, "max_new_tokens": 4},
        "logging": {"tensorboard": False, "progress": False, "eval_queries": 2, "checkpoint_every": 1,
                    "save_checkpoint": True},
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(data))
    return folder


def test_every_path_is_relative_to_the_config_file_and_written_absolute(tmp_path, tiny_lm_dir, monkeypatch):
    folder = project(tmp_path, tiny_lm_dir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config(Path("..") / "proj" / "config.yaml")
    assert config.run_dir == str(folder / "runs" / "paths")
    assert config.model.name_or_path == str(folder / "model")
    assert config.task.dataset == str(folder / "data" / "prompts.jsonl")
    assert config.task.reward == f"{folder / 'rewards.py'}:length"
    (elsewhere / "mine.jsonl").write_text((folder / "data" / "prompts.jsonl").read_text())
    overridden = load_config(folder / "config.yaml", ["task.dataset=mine.jsonl", "run_dir=out"])  # typed here
    assert overridden.task.dataset == str(elsewhere / "mine.jsonl") and overridden.run_dir == str(elsewhere / "out")


def test_hub_ids_and_assets_stay_as_written(tmp_path):
    data = {"model": {"name_or_path": "gpt2-large"}, "task": {"name": "sentiment", "dataset": "imdb",
            "reward_model": "marllm:offline-classifier"}, "agents": {"models": {"llm2": "other/model"}}}
    assert absolute_config_paths(data, tmp_path) == data


def test_eval_and_resume_of_a_saved_config_work_from_another_directory(tmp_path, tiny_lm_dir, monkeypatch, capsys):
    folder = project(tmp_path, tiny_lm_dir)
    monkeypatch.chdir(folder)
    assert main(["train", "config.yaml"]) == 0
    run_dir = folder / "runs" / "paths"
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["task"]["dataset"] == str(folder / "data" / "prompts.jsonl")
    assert saved["model"]["name_or_path"] == str(folder / "model") and saved["run_dir"] == str(run_dir)
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    capsys.readouterr()
    saved_config = str(run_dir / "config.yaml")
    assert main(["eval", saved_config, "--checkpoint", str(run_dir), "--limit", "2", "--batch-size", "2"]) == 0
    assert "paths/llm" in capsys.readouterr().out
    assert main(["train", saved_config, "--resume", str(run_dir), "iterations=2"]) == 0
    assert read_run_state(run_dir).describe() == "2 of 2 iterations, finished"
    assert not (other / "runs").exists()


def test_the_negotiation_example_trains_from_outside_the_repository(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(ROOT / "examples" / "negotiation" / "negotiation.yaml")
    assert Path(config.task.dataset).is_file() and Path(config.task.eval_dataset).is_file()
