"""A dataset row without a field its prompt template uses is refused when the env is built, naming the row and the
field (issue 35, item 4), not rendered as ``None`` and passed on to the reward."""

from __future__ import annotations

import json

import pytest
import yaml

from marllm.cli import main
from marllm.config import config_from_dict
from marllm.envs import SequentialTextEnv
from marllm.evaluation.deployed import deployed_prompts
from tests.test_custom_tasks import REWARDS

ROWS = [{"prompt": "a lamp", "price": 10}, {"prompt": "a chair", "price": 25}, {"prompt": "a desk"}]
MISSING = (
    "dataset row 2 (counting from 0) has no value for 'price' (null or missing), which the prompt template of role "
    "'seller' uses; give every row a 'price', or leave {price} out of the template"
)


def config_data(tmp_path, lm_dir):
    (tmp_path / "rewards.py").write_text(REWARDS)
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return {
        "model": {"name_or_path": str(lm_dir), "device": "cpu"},
        "task": {"name": "text", "dataset": str(tmp_path / "items.jsonl"), "query_column": "prompt",
                 "reward": f"{tmp_path / 'rewards.py'}:length"},
        "env": {"roles": ["seller"], "templates": {"seller": "Sell {query}, list ${price}:"}, "batch_size": 2},
        "ppo": {"batching": {"mini_batch_size": 2, "ppo_epochs": 1}},
        "generation": {"min_new_tokens": 2, "max_new_tokens": 4},
        "logging": {"tensorboard": False, "progress": False, "eval_queries": 2, "checkpoint_every": None},
    }


def test_a_row_missing_a_template_field_is_refused_when_the_run_is_built(tmp_path, tiny_lm_dir, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config_data(tmp_path, tiny_lm_dir)))
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run"), "iterations=1"]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("marllm")]
    assert errors == [f"marllm: error: {MISSING}"]
    assert not (tmp_path / "run").exists()


def test_a_list_of_rows_missing_a_field_is_refused_by_the_env():
    rows = [{"query": row["prompt"], **row} for row in ROWS]
    with pytest.raises(ValueError) as refused:
        SequentialTextEnv(rows, ["seller"], {"seller": "{query} for {price}"}, lambda s, r: [0.0] * len(r), 2)
    assert str(refused.value) == MISSING
    SequentialTextEnv(rows[:2], ["seller"], {"seller": "{query} for {price}"}, lambda s, r: [0.0] * len(r), 2)


def test_the_deployed_prompt_refuses_a_row_missing_a_field(tmp_path, tiny_lm_dir):
    config = config_from_dict(config_data(tmp_path, tiny_lm_dir))
    rows = [{"query": row["prompt"], **row} for row in ROWS]
    assert deployed_prompts(config, rows[:2]) == ["Sell a lamp, list $10:", "Sell a chair, list $25:"]
    with pytest.raises(ValueError, match="dataset row 2 .* no value for 'price'"):
        deployed_prompts(config, rows)
