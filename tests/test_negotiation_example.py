"""examples/negotiation (issue 22): the buyer/seller config of docs/guides/custom-tasks.md, trained for two iterations
and evaluated with ``marllm eval``, as the guide's commands do (a tiny GPT-2 stands in for the offline base model);
and its reward module's opposed, role-aware rewards."""

import json
from pathlib import Path

import pytest

from marllm.cli import main
from marllm.config import load_config
from marllm.envs import RewardContext
from marllm.utils.imports import load_reference

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "negotiation"
CONFIG = EXAMPLE / "negotiation.yaml"


def test_the_reward_module_opposes_seller_and_buyer():
    rewards = {name: load_reference(f"{EXAMPLE / 'rewards.py'}:{name}") for name in ("haggle", "seller", "buyer")}
    samples = [{"list_price": 100}, {"list_price": 100}, {"list_price": 100}]
    dialogue = (("150 dollars", "no", "120"), ("90", "maybe", "80"), ("110", "never", "a lot"))
    for role in ("seller", "buyer"):
        context = RewardContext(role, 2 if role == "seller" else 1, ("seller", "buyer", "seller"), samples, dialogue)
        values = rewards["haggle"](samples, list(context.responses), context)
        assert values == rewards[role](samples, list(context.responses), context)
        # deals: 110 (the seller's final word), none (no number at all: -1 for both), 80 (the buyer's offer stands)
        assert values == pytest.approx([0.1, -1.0, -0.2] if role == "seller" else [-0.1, -1.0, 0.2])


def test_the_config_reads_and_names_its_reward_beside_it(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the reward file is found beside the config, wherever marllm runs
    config = load_config(CONFIG)
    assert config.task.reward == f"{EXAMPLE / 'rewards.py'}:haggle" and config.task.reward_fn.__name__ == "haggle"
    assert config.speaking_order == ["seller", "buyer", "seller"]


def test_train_two_iterations_then_marllm_eval(tmp_path, tiny_lm_dir, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the config names its offers relative to the repository root, as the guide's commands
    model = f"model.name_or_path={tiny_lm_dir}"
    run_dir = tmp_path / "negotiation"
    argv = ["train", str(CONFIG.relative_to(ROOT)), "iterations=2", model, "model.device=cpu", "logging.progress=false"]
    assert main([*argv, "--run-dir", str(run_dir)]) == 0
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and metrics[0]["llm1/role"] == "seller" and metrics[0]["llm2/role"] == "buyer"
    assert {"llm1/role_task_reward", "llm1/turn_task_reward/seller_1", "llm1/turn_task_reward/seller_2"} <= set(
        metrics[0]
    )
    capsys.readouterr()
    out = tmp_path / "eval.json"
    evaluate = ["eval", str(CONFIG.relative_to(ROOT)), model, "model.device=cpu", "--checkpoint", "base"]
    assert main([*evaluate, "--checkpoint", str(run_dir), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "task reward over 8 held-out queries" in printed
    assert "| | base | negotiation/llm1 | negotiation/llm2 |" in printed
    result = json.loads(out.read_text())
    cells = {(c["row"], c["model"]): c["rewards"] for c in result["cells"]}
    for model_name in result["models"]:
        for seller, buyer in zip(cells[("seller", model_name)], cells[("buyer", model_name)], strict=True):
            assert seller == buyer == -1.0 or seller == pytest.approx(-buyer)  # no deal, or a zero-sum deal
