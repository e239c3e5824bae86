"""LoRA learners on one shared base, the math tasks in the loop, and pass@k of agents deployed alone."""

import json

import pytest
import torch

from marllm.assets.offline.arithmetic_problems import generate_problems, write_jsonl
from marllm.cli import main as cli_main
from marllm.config import config_from_dict
from marllm.config.loading import ConfigError
from marllm.evaluation import deployed
from marllm.evaluation.deployed import evaluate_pass_at_k
from marllm.models.generation import GeneratedBatch
from marllm.run.setup import build
from marllm.run.train import train
from tests.conftest import make_tiny_gpt2


@pytest.fixture(scope="module")
def long_context_lm_dir(tmp_path_factory, tokenizer):
    """The tiny GPT-2 with room for a few-shot math prompt (the tiny tokenizer spends many tokens on digits)."""
    path = tmp_path_factory.mktemp("tiny-gpt2-long")
    make_tiny_gpt2(tokenizer, n_positions=1024).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gsm8k_dir(tmp_path_factory):
    """A GSM8K-format fixture: train.jsonl and test.jsonl of generated problems."""
    path = tmp_path_factory.mktemp("gsm8k")
    write_jsonl(generate_problems(8, seed=1), path / "train.jsonl")
    write_jsonl(generate_problems(4, seed=2), path / "test.jsonl")
    return path


def math_config(lm_dir, data_dir, **extra):
    data = {
        "name": "cory_math",
        "iterations": 2,
        "model": {"name_or_path": str(lm_dir), "device": "cpu"},
        "task": {"name": "gsm8k", "dataset": str(data_dir)},
        "env": {"batch_size": 4},
        "agents": {"reward_coefficients": 1.0, "role_period": 1},
        "ppo": {
            "batching": {"mini_batch_size": 2, "ppo_epochs": 1},
            "optimiser": {"learning_rate": 1e-3},
            "score_transform": "none",
        },
        "generation": {"min_new_tokens": 4, "max_new_tokens": 6, "repetition_penalty": 1.0},
        "logging": {"tensorboard": False, "eval_queries": 2, "progress": False, "save_checkpoint": True},
    }
    for key, value in extra.items():
        section, _, name = key.partition("__")
        if name:
            data[section][name] = value
        else:
            data[section] = value
    return config_from_dict(data)


def test_lora_learners_share_one_base_and_train_only_their_adapter(tmp_path, long_context_lm_dir, gsm8k_dir):
    config = math_config(long_context_lm_dir, gsm8k_dir, model__lora={"r": 2, "alpha": 4, "target_modules": ["c_attn"]})
    setup = build(config)
    llm1, llm2 = setup.learners["llm1"], setup.learners["llm2"]
    assert llm1.model is llm2.model and setup.reference is None
    base_before = {n: p.clone() for n, p in llm1.model.named_parameters() if "lora_" not in n}
    adapters_before = {n: p.clone() for n, p in llm1.model.named_parameters() if "lora_" in n}
    from marllm.loop import run_iteration

    metrics, _ = run_iteration(setup.env, setup.learners, seed=0)
    # LoRA B starts at zero: each policy equals the base, so the first batch's KL to the reference is exactly 0
    assert metrics["llm1/kl"] == pytest.approx(0.0, abs=1e-6) and metrics["llm2/kl"] == pytest.approx(0.0, abs=1e-6)
    for name, param in llm1.model.named_parameters():
        if "lora_" not in name:
            assert torch.equal(param, base_before[name]), f"base weight {name} changed"
    changed = {n for n, p in llm1.model.named_parameters() if "lora_" in n and not torch.equal(p, adapters_before[n])}
    assert any(".llm1." in n for n in changed) and any(".llm2." in n for n in changed)
    assert {id(p) for g in llm1.optimizer.param_groups for p in g["params"]}.isdisjoint(
        {id(p) for g in llm2.optimizer.param_groups for p in g["params"]}
    )


def test_lora_learners_on_one_base_take_their_rollout_from_generate(long_context_lm_dir, gsm8k_dir):
    lora = {"r": 2, "alpha": 4, "target_modules": ["c_attn"]}
    ppo = {"batching": {"mini_batch_size": 2, "ppo_epochs": 1}, "optimiser": {"learning_rate": 1e-3}}
    ppo |= {"score_transform": "none", "compute": {"rollout_from_generate": True}}
    config = math_config(long_context_lm_dir, gsm8k_dir, model__lora=lora, ppo=ppo)
    setup = build(config)
    llm1 = setup.learners["llm1"]
    adapters_before = {n: p.clone() for n, p in llm1.model.named_parameters() if "lora_" in n}
    from marllm.loop import run_iteration

    metrics, _ = run_iteration(setup.env, setup.learners, seed=0)
    # Each adapter starts as the base: generate's logits under the adapter and the base's full forward with the
    # adapters off differ by rounding only, so the first KL is 0 up to it.
    assert metrics["llm1/kl"] == pytest.approx(0.0, abs=1e-5) and metrics["llm2/kl"] == pytest.approx(0.0, abs=1e-5)
    changed = {n for n, p in llm1.model.named_parameters() if "lora_" in n and not torch.equal(p, adapters_before[n])}
    assert any(".llm1." in n for n in changed) and any(".llm2." in n for n in changed)


def test_lora_run_checkpoints_adapters_that_evaluate_alone(tmp_path, long_context_lm_dir, gsm8k_dir):
    config = math_config(long_context_lm_dir, gsm8k_dir, model__lora={"r": 2, "alpha": 4, "target_modules": ["c_attn"]})
    result = train(config, tmp_path / "run")
    assert [m["llm1/role"] for m in result.history] == ["pioneer", "observer"]
    assert all(m["llm1/task_reward"] in (0.0, 0.25, 0.5, 0.75, 1.0) for m in result.history)
    adapter_dir = tmp_path / "run" / "checkpoints" / "llm1"
    assert list(adapter_dir.rglob("adapter_config.json"))
    outcome = evaluate_pass_at_k(config, adapter_dir, ks=[1], samples=1, limit=2, progress=False)
    assert outcome.num_problems == 2 and 0.0 <= outcome.pass_at_k[1] <= 1.0


def test_full_model_checkpoint_and_base_evaluate(tmp_path, long_context_lm_dir, gsm8k_dir):
    config = math_config(long_context_lm_dir, gsm8k_dir, agents={"role_period": None}, env__roles=["pioneer"])
    train(config, tmp_path / "run")
    for checkpoint in ("base", tmp_path / "run" / "checkpoints" / "llm1"):
        outcome = evaluate_pass_at_k(config, checkpoint, ks=[1, 2], samples=2, limit=2, progress=False)
        assert set(outcome.pass_at_k) == {1, 2} and outcome.samples_per_problem == 2


def test_pass_at_k_counts_correct_samples(monkeypatch, long_context_lm_dir, gsm8k_dir):
    """A scripted generator: problem 0 right on its first sample only, problem 1 always right, the rest wrong."""
    config = math_config(long_context_lm_dir, gsm8k_dir)
    problems = config.task.load_split("test")
    truths = {problems[i]["question"]: (i, problems[i]["ground_truth"]) for i in range(len(problems))}
    seen: dict[int, int] = {}

    def scripted(model, tokenizer, prompts, budget, generation, context=None, owner=""):
        texts = []
        for prompt in prompts:
            question = prompt.rsplit("Question: ", 1)[1].rsplit("\nAnswer:", 1)[0]
            index, truth = truths[question]
            attempt = seen.get(index, 0)
            seen[index] = attempt + 1
            right = index == 1 or (index == 0 and attempt == 0)
            texts.append(f" so the answer is {truth if right else int(truth) + 1}.")
        return GeneratedBatch(tuple(texts), None, None, None, None)

    monkeypatch.setattr(deployed, "generate_responses", scripted)
    outcome = evaluate_pass_at_k(config, "base", ks=[1, 2], samples=2, batch_size=3, progress=False)
    assert outcome.correct_counts == [1, 2, 0, 0]
    assert outcome.pass_at_k[1] == pytest.approx((0.5 + 1.0) / 4)
    assert outcome.pass_at_k[2] == pytest.approx((1.0 + 1.0) / 4)


def test_eval_cli_writes_results_and_rejects_bad_k(tmp_path, long_context_lm_dir, gsm8k_dir, capsys):
    config_path = tmp_path / "math.yaml"
    config = math_config(long_context_lm_dir, gsm8k_dir)
    import yaml

    config_path.write_text(yaml.safe_dump(config.to_dict()))
    out = tmp_path / "passk.json"
    code = cli_main(["eval", str(config_path), "--pass-k", "1,2", "--samples", "2", "--limit", "2", "--out", str(out)])
    assert code == 0
    results = json.loads(out.read_text())
    assert results[0]["model"] == "base" and {"pass@1", "pass@2"} <= set(results[0])
    assert cli_main(["eval", str(config_path), "--pass-k", "5", "--samples", "2"]) == 1
    assert "1 <= k <= samples (2)" in capsys.readouterr().err
    assert cli_main(["eval", str(config_path), "--pass-k", "one"]) == 2


def test_pass_at_k_needs_a_binary_task(tiny_lm_dir, reviews_file):
    config = config_from_dict(
        {"model": {"name_or_path": str(tiny_lm_dir)}, "task": {"dataset": str(reviews_file), "eval_split": None}}
    )
    with pytest.raises(ValueError, match="0/1 reward"):
        evaluate_pass_at_k(config, "base", ks=[1], samples=1, progress=False)


def test_lora_and_4bit_input_errors(long_context_lm_dir, gsm8k_dir):
    with pytest.raises(ValueError, match=r"target_modules \['q_proj'\] are not modules of GPT2LMHeadModel.*c_attn"):
        build(math_config(long_context_lm_dir, gsm8k_dir, model__lora={"target_modules": ["q_proj"]}))
    with pytest.raises(ConfigError, match="load_in_4bit needs model.lora"):
        math_config(long_context_lm_dir, gsm8k_dir, model__load_in_4bit=True)
    if not torch.cuda.is_available():
        config = math_config(long_context_lm_dir, gsm8k_dir, model__load_in_4bit=True, model__lora={"r": 2})
        with pytest.raises(RuntimeError, match="load_in_4bit needs a CUDA GPU"):
            build(config)
    with pytest.raises(ConfigError, match="lora.r must be >= 1"):
        math_config(long_context_lm_dir, gsm8k_dir, model__lora={"r": 0})


def test_gsm8k_example_configs_are_the_papers_table_2():
    from pathlib import Path

    from marllm.config import load_config

    root = Path(__file__).resolve().parents[1]
    cory, ppo = load_config(root / "examples/cory_gsm8k.yaml"), load_config(root / "examples/ppo_gsm8k.yaml")
    for config in (cory, ppo):
        assert config.model.name_or_path == "meta-llama/Llama-2-7b-chat-hf" and config.model.load_in_4bit
        assert config.model.lora is not None and config.task.name == "gsm8k"
        assert (
            config.env.batch_size,
            config.ppo.batching.mini_batch_size,
            config.ppo.batching.gradient_accumulation_steps,
        ) == (
            32,
            2,
            16,
        )
        assert (config.ppo.kl.init_kl_coef, config.ppo.gamma, config.ppo.lam) == (0.01, 1.0, 0.95)
        assert (config.ppo.clip_range, config.ppo.clip_range_value, config.ppo.vf_coef) == (0.2, 0.2, 0.1)
        assert config.iterations == 100
    assert cory.ppo.optimiser.learning_rate == pytest.approx(1e-4) and ppo.ppo.optimiser.learning_rate == pytest.approx(
        1e-5
    )
    assert cory.agents.role_period == 5 and len(cory.learner_ids) == 2 and len(ppo.learner_ids) == 1


def test_training_measures_pass_at_k_before_and_after_and_reports_it(tmp_path, long_context_lm_dir, gsm8k_dir):
    from marllm.reporting import build_report
    from marllm.reporting.tables import fmt

    config = math_config(
        long_context_lm_dir,
        gsm8k_dir,
        logging={
            "pass_at_k": [1, 2],
            "pass_at_k_samples": 2,
            "pass_at_k_problems": 3,
            "progress": False,
            "tensorboard": False,
            "save_checkpoint": False,
            "eval_queries": 2,
        },
    )
    train(config, tmp_path / "run")
    results = json.loads((tmp_path / "run" / "pass_at_k.json").read_text())
    assert [r["model"] for r in results] == ["base", "llm1", "llm2"]
    assert all(r["num_problems"] == 3 and r["samples_per_problem"] == 2 for r in results)
    assert all(0.0 <= r["pass@1"] <= r["pass@2"] <= 1.0 for r in results)
    report = build_report([tmp_path / "run"], tmp_path / "report").read_text()
    section = report.split("## pass@k", 1)[1]
    for row in results:
        assert f"| {row['model']} | {fmt(row['pass@1'])} | {fmt(row['pass@2'])} |" in section


def test_pass_at_k_logging_settings_are_checked(long_context_lm_dir, gsm8k_dir, tiny_lm_dir, reviews_file):
    with pytest.raises(ConfigError, match=r"1 <= k <= logging.pass_at_k_samples \(2\)"):
        math_config(long_context_lm_dir, gsm8k_dir, logging={"pass_at_k": [5], "pass_at_k_samples": 2})
    with pytest.raises(ConfigError, match="needs a task with a 0/1 reward, not 'sentiment'"):
        config_from_dict({"model": {"name_or_path": str(tiny_lm_dir)}, "logging": {"pass_at_k": [1]}})


def test_eval_cli_cross_play_matrix_of_a_trained_run(tmp_path, long_context_lm_dir, gsm8k_dir, capsys):
    import yaml

    config = math_config(long_context_lm_dir, gsm8k_dir)
    train(config, tmp_path / "cory")
    config_path = tmp_path / "math.yaml"
    config_path.write_text(yaml.safe_dump(config.to_dict()))
    out = tmp_path / "cross_play.json"
    args = ["eval", str(config_path), "--cross-play", "--checkpoint", "base", "--checkpoint", str(tmp_path / "cory")]
    assert cli_main([*args, "--limit", "3", "--batch-size", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "over 3 held-out queries" in printed and "| | base | cory/llm1 | cory/llm2 |" in printed
    result = json.loads(out.read_text())
    assert result["models"] == ["base", "cory/llm1", "cory/llm2"] and result["num_queries"] == 3
    rows = [cell["row"] for cell in result["cells"]]
    assert rows == ["alone"] * 3 + [f"observer after {m}" for m in result["models"] for _ in range(3)]
    # gsm8k's reward is 0/1, so each mean over 3 queries is a multiple of 1/3
    assert all(round(cell["task_reward"] * 3, 6) in (0, 1, 2, 3) for cell in result["cells"])
    assert cli_main([*args, "--pass-k", "1"]) == 2
    assert "--pass-k and --samples belong to pass@k" in capsys.readouterr().err
