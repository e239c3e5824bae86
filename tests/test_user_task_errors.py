"""A task class of one's own that fails (issue 35, item 2): build() raising, returning None or opening a missing file
is one line naming task.name, the user's file and line and what happened, not a traceback or a bare ``[Errno 2]``."""

from __future__ import annotations

import pytest
import yaml

from marllm.cli import main
from marllm.config import load_config
from marllm.tasks.custom import TaskCodeError

TASKS = '''
from dataclasses import dataclass

from marllm.tasks import TaskParts


def read_rows(path):
    with open(path) as handle:
        return handle.read()


@dataclass
class Failing:
    name: str = "failing"
    how: str = "raise"

    def build(self, tokenizer, seed, device="auto"):
        if self.how == "none":
            return None
        if self.how == "file":
            read_rows("rows.csv")
        table = {}
        return TaskParts(table["rows"], {"speaker": "{query}"}, None)

    def default_templates(self):
        return {"speaker": "{query}"}

    def check_references(self):
        if self.how == "check":
            raise RuntimeError("no data folder")
'''


def config_file(tmp_path, tiny_lm_dir, how):
    (tmp_path / "tasks.py").write_text(TASKS)
    data = {
        "model": {"name_or_path": str(tiny_lm_dir), "device": "cpu"},
        "task": {"name": "tasks.py:Failing", "how": how},
        "env": {"roles": ["speaker"], "batch_size": 2},
        "ppo": {"batching": {"mini_batch_size": 2}},
        "logging": {"tensorboard": False, "progress": False},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def line_of(tmp_path, text):
    return (tmp_path / "tasks.py").read_text().splitlines().index(text) + 1


@pytest.mark.parametrize(
    ("how", "line", "what"),
    [
        ("raise", "        return TaskParts(table[\"rows\"], {\"speaker\": \"{query}\"}, None)",
         "build() raised KeyError('rows')"),
        ("file", "    with open(path) as handle:",
         "build() raised FileNotFoundError: [Errno 2] No such file or directory: 'rows.csv'"),
        ("none", "    def build(self, tokenizer, seed, device=\"auto\"):",
         "build() returned None, not a marllm.tasks.TaskParts (dataset, templates, reward_fn)"),
    ],
)
def test_a_failing_build_is_one_line_with_the_users_frame(tmp_path, tiny_lm_dir, capsys, how, line, what):
    path = config_file(tmp_path, tiny_lm_dir, how)
    expected = f"task.name tasks.py:{line_of(tmp_path, line)}: {what}"
    with pytest.raises(TaskCodeError) as failed:
        load_config(path).task.build(None, 0)
    assert str(failed.value) == expected
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run"), "iterations=1"]) == 1
    assert capsys.readouterr().err.splitlines() == [f"marllm: error: {expected}"]
    assert not (tmp_path / "run").exists()


def test_a_failing_check_is_one_line_too(tmp_path, tiny_lm_dir, capsys):
    path = config_file(tmp_path, tiny_lm_dir, "check")
    line = line_of(tmp_path, '            raise RuntimeError("no data folder")')
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run"), "iterations=1"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"marllm: error: task.name tasks.py:{line}: check_references() raised RuntimeError('no data folder')"
    ]


def test_loading_a_task_class_twice_gives_equal_configs(tmp_path, tiny_lm_dir):
    path = config_file(tmp_path, tiny_lm_dir, "raise")
    first, second = load_config(path), load_config(path)
    assert type(first.task) is type(second.task) and first.task == second.task
    assert type(first.task).__name__ == "Failing" and first.to_dict()["task"]["how"] == "raise"
