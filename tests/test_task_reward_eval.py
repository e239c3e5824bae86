"""``marllm eval`` of any text config (issue 22): the mean task reward, with its 95% interval, of each role and each
turn for every model given, multi-turn configs included; and evaluation queries called what they are (training
queries when the task has no evaluation split) by ``marllm eval``, cross-play and the run report."""

import json

import numpy as np
import pytest
import yaml

from marllm.cli import main
from marllm.envs import SequentialTextEnv
from marllm.evaluation.task_rewards import task_rewards
from marllm.reporting import build_report

REWARDS = '''
def length(samples, responses):
    return [float(len(r)) for r in responses]

def opposed(samples, responses, context):
    sign = 1.0 if context.role == "proposer" else -1.0
    return [sign * len(r) / 10 for r in responses]
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_lm_dir):
    """A multi-turn text config (proposer, critic, proposer) with a role-aware reward, trained for one iteration."""
    root = tmp_path_factory.mktemp("project")
    (root / "rewards.py").write_text(REWARDS)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"query": f"prompt {i}"}) + "\n" for i in range(6)))
    config = {
        "name": "chain",
        "iterations": 1,
        "model": {"name_or_path": str(tiny_lm_dir), "device": "cpu"},
        "task": {"name": "text", "dataset": str(root / "prompts.jsonl"), "reward": "rewards.py:opposed"},
        "env": {
            "roles": ["proposer", "critic"],
            "turns": ["proposer", "critic", "proposer"],
            "templates": {"proposer": "{query}", "critic": "{query} {proposer}", "proposer_2": "{critic}"},
            "batch_size": 2,
        },
        "ppo": {"batching": {"mini_batch_size": 2, "ppo_epochs": 1}},
        "generation": {"min_new_tokens": 2, "max_new_tokens": 4},
        "logging": {"tensorboard": False, "progress": False, "eval_queries": 2, "checkpoint_every": None},
    }
    path = root / "chain.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["train", str(path), "--run-dir", str(root / "run")]) == 0
    return root, path


def test_eval_without_options_prints_each_role_and_turn_for_each_model(project, capsys):
    root, path = project
    capsys.readouterr()
    out = root / "eval.json"
    args = ["eval", str(path), "--checkpoint", "base", "--checkpoint", str(root / "run"), "--limit", "3"]
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "task reward over 3 training queries, mean [95% interval]" in printed
    assert "| | base | run/llm1 | run/llm2 |" in printed
    rows = [line.split(" | ")[0].lstrip("| ") for line in printed.splitlines() if line.startswith("| ")]
    assert rows == ["", "proposer", "proposer_1 (turn)", "proposer_2 (turn)", "critic"]
    result = json.loads(out.read_text())
    assert result["models"] == ["base", "run/llm1", "run/llm2"] and result["queries"] == "training"
    cells = {(c["row"], c["model"]): c for c in result["cells"]}
    for model in result["models"]:
        proposer, last, critic = (cells[(row, model)] for row in ("proposer", "proposer_2", "critic"))
        assert proposer["rewards"] == last["rewards"]  # the role's reward is its last response's
        assert all(r >= 0 for r in proposer["rewards"]) and all(r <= 0 for r in critic["rewards"])  # opposed
        assert proposer["n"] == 3 and proposer["ci_low"] <= proposer["mean"] <= proposer["ci_high"]
        assert proposer["mean"] == pytest.approx(np.mean(proposer["rewards"]))


def test_pass_at_k_stays_an_option_and_needs_a_binary_reward(project, capsys):
    _, path = project
    assert main(["eval", str(path), "--pass-k", "1", "--limit", "2"]) == 1
    assert "needs a task with a 0/1 reward" in capsys.readouterr().err


def test_the_run_logs_both_a_multi_turn_roles_reward_and_its_turns(project):
    root, _ = project
    line = json.loads((root / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert line["llm1/role"] == "proposer"
    turns = [line["llm1/turn_task_reward/proposer_1"], line["llm1/turn_task_reward/proposer_2"]]
    assert line["llm1/role_task_reward"] == turns[1]
    assert line["llm1/task_reward"] == pytest.approx(np.mean(turns))  # the learner's: the mean over its turns
    assert "llm2/role_task_reward" not in line  # the critic speaks once


def test_the_report_calls_training_queries_what_they_are(project):
    root, _ = project
    text = build_report([root / "run"], root / "report").read_text()
    assert "## Evaluation samples" in text and "## Held-out samples" not in text
    assert "training queries (the task has no evaluation split" in text


def test_cross_play_without_an_evaluation_split_says_training_queries(tmp_path, tiny_lm_dir, capsys):
    rewards = tmp_path / "rewards.py"
    rewards.write_text(REWARDS)
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"query": f"q {i}"}) + "\n" for i in range(3)))
    config = {
        "model": {"name_or_path": str(tiny_lm_dir), "device": "cpu"},
        "task": {"name": "text", "dataset": str(tmp_path / "prompts.jsonl"), "reward": "rewards.py:length"},
        "env": {"roles": ["pioneer", "observer"], "templates": {"pioneer": "{query}", "observer": "{pioneer}"},
                "batch_size": 2},
        "ppo": {"batching": {"mini_batch_size": 2}},
        "generation": {"min_new_tokens": 2, "max_new_tokens": 3},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["eval", str(path), "--cross-play", "--limit", "2", "--out", str(tmp_path / "cp.json")]) == 0
    assert "task reward over 2 training queries" in capsys.readouterr().out
    assert json.loads((tmp_path / "cp.json").read_text())["queries"] == "training"


def test_task_rewards_in_python_on_a_raw_env():
    env = SequentialTextEnv(
        [{"query": "a"}, {"query": "bb"}, {"query": "ccc"}],
        ["proposer", "critic"],
        {"proposer": "{query}", "critic": "{proposer}!", "proposer_2": "{critic}!"},
        lambda samples, responses: [float(len(r)) for r in responses],
        batch_size=3,
        turns=["proposer", "critic", "proposer"],
        turn_rewards="each",
    )
    models = {"echo": lambda prompts: list(prompts), "short": lambda prompts: ["x"] * len(prompts)}
    result = task_rewards(env, list(models), models.__getitem__, queries="held-out")
    assert result.rows() == ["proposer", "proposer_1", "proposer_2", "critic"]
    echo = result.rewards["echo"]
    # the prompts are echoed: proposer_1 answers the query, the critic "<answer>!", proposer_2 "<answer>!!"
    order = np.argsort(echo["proposer_1"])  # the env shuffles the queries (the same order for every model)
    np.testing.assert_allclose(echo["proposer_1"][order], [1, 2, 3])
    np.testing.assert_allclose(echo["critic"][order], [2, 3, 4])
    np.testing.assert_allclose(echo["proposer_2"][order], [3, 4, 5])
    np.testing.assert_allclose(echo["proposer"], echo["proposer_2"])
    assert result.estimate("critic", "short").mean == 1.0
    # t(0.975, 2) = 4.3027, standard error 1 / √3
    assert result.estimate("critic", "echo").low == pytest.approx(3 - 4.302653 / np.sqrt(3), abs=1e-5)
    assert "| proposer_2 (turn) | 4.000 [1.516, 6.484] | 1.000 [1.000, 1.000] |" in result.to_markdown()
