"""Configs of marllm's earlier layouts: a user's is refused once, naming every moved key and ``marllm upgrade``,
which writes it in today's layout; a run directory's own ``config.yaml``, which marllm wrote, is read in today's
with a warning, so that ``marllm train RUN/config.yaml --resume RUN`` resumes a run recorded before the sections; a
resume refused for a default that has changed says so."""

from __future__ import annotations

import json

import pytest
import yaml

from marllm.cli import main
from marllm.config import ConfigError, config_from_dict, load_config, resume_differences
from marllm.config.layouts import moves, todays_layout
from tests.test_durable_runs import cory_data
from tests.test_train import ROOT

KUHN = ROOT / "examples" / "games" / "kuhn_poker_offline.yaml"


def flat_layout(data: dict) -> dict:
    """``data`` (today's layout) as an earlier marllm wrote it: ppo's and game's sections' keys directly under them."""
    flat = dict(data)
    if isinstance(flat.get("ppo"), dict):
        ppo = dict(flat["ppo"])
        for section in ("optimiser", "batching", "kl", "compute", "guards"):
            ppo.update(ppo.pop(section, None) or {})
        flat["ppo"] = ppo
    if isinstance(flat.get("game"), dict):
        game = dict(flat["game"])
        game.update(game.pop("opponents", None) or {}, **(game.pop("measurement", None) or {}))
        actions = game.pop("actions", None) or {}
        game["actions"] = actions.get("mode", "generate")
        game["action_normalization"] = actions.get("normalization", "token")
        flat["game"] = game
    return flat


def test_a_users_config_in_an_earlier_layout_is_refused_once_with_every_move(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(flat_layout(yaml.safe_load(KUHN.read_text()))))
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    message = str(refused.value)
    assert "game.actions: generate -> game.actions.mode" in message and f"`marllm upgrade {path}`" in message
    assert "ppo.learning_rate -> ppo.optimiser.learning_rate" in message
    assert "ppo.mini_batch_size -> ppo.batching.mini_batch_size" in message


def test_marllm_upgrade_writes_todays_layout(tmp_path, capsys):
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(flat_layout(yaml.safe_load(KUHN.read_text()))))
    assert main(["upgrade", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "marllm: moved ppo.mini_batch_size -> ppo.batching.mini_batch_size" in err
    upgraded = tmp_path / "new.yaml"
    upgraded.write_text(out)
    assert moves(yaml.safe_load(out)) == [] and load_config(upgraded).to_dict() == load_config(KUHN).to_dict()
    assert main(["upgrade", str(path), "--in-place"]) == 0
    assert load_config(path).to_dict() == load_config(KUHN).to_dict()


def test_a_run_recorded_before_the_sections_resumes_from_its_own_config(tmp_path, tiny_lm_dir, tiny_classifier_dir,
                                                                        reviews_file):  # fmt: skip
    data = cory_data(tiny_lm_dir, tiny_classifier_dir, reviews_file, iterations=1)
    run_dir = tmp_path / "run"
    assert main(["train", _written(tmp_path / "config.yaml", data), "--run-dir", str(run_dir)]) == 0
    recorded = run_dir / "config.yaml"
    old = flat_layout(yaml.safe_load(recorded.read_text()))
    recorded.write_text(yaml.safe_dump(old))  # as a run written before the sections recorded itself
    with pytest.warns(UserWarning, match="read in today's: ppo.learning_rate -> ppo.optimiser.learning_rate"):
        assert load_config(recorded).to_dict() == config_from_dict(todays_layout(old)).to_dict()
    with pytest.warns(UserWarning, match="earlier layout"):
        assert main(["train", str(recorded), "iterations=2", "--resume", str(run_dir)]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [0, 1]


def test_a_resume_refused_for_a_changed_default_says_how_to_keep_the_run(tmp_path):
    config = load_config(KUHN)
    saved = config.to_dict()
    saved["generation"] = {**saved["generation"], "repetition_penalty": 1.1}  # a game run recorded before 1.0
    assert resume_differences(saved, config) == [
        "generation.repetition_penalty: 1.1 -> 1.0 (the default of a config with a game section changed from 1.1 to "
        "1.0: set generation.repetition_penalty=1.1 to keep the run's behaviour)"
    ]


def _written(path, data) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_a_run_recorded_with_a_setting_now_refused_still_loads_and_resumes(tmp_path):
    """A setting refused today as one the run would not read (temperature under score) was accepted when the run was
    recorded: its own config.yaml still loads (to resume, to evaluate), while the same file elsewhere is refused."""
    data = yaml.safe_load(KUHN.read_text())
    data["game"]["actions"] = {"mode": "score"}
    data["generation"]["temperature"] = 0.7
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text("{}")
    recorded = run_dir / "config.yaml"
    recorded.write_text(yaml.safe_dump(data))
    config = load_config(recorded)
    assert config.generation.temperature == 0.7
    assert resume_differences(config.to_dict(), config) == []
    with pytest.raises(ConfigError, match="generation.temperature: 0.7 would be ignored"):
        load_config(_written(tmp_path / "mine.yaml", data))


def test_upgrade_in_place_leaves_a_config_it_cannot_check_as_it_was(tmp_path, capsys):
    data = flat_layout(yaml.safe_load(KUHN.read_text()))
    data["game"]["policy_average"] = "linear"  # refused today: nothing is measured
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data))
    before = path.read_text()
    assert main(["upgrade", str(path), "--in-place"]) == 2
    assert "policy_average: linear weighs the policies measured" in capsys.readouterr().err
    assert path.read_text() == before
