"""Studies: study files read strictly, expanded into validated runs, run by a process pool, and resumed."""

import json
import shutil
import signal
from pathlib import Path

import pytest
import yaml

from marllm.cli import main
from marllm.config import load_config
from marllm.config.loading import ConfigError
from marllm.run.run_dir import update_run_info
from marllm.studies.execute import LocalExecutor, plan, prepare_study_dir, run_study
from marllm.studies.spec import load_study, run_name, study_from_dict

from .test_train import ROOT, merge_settings, tiny_overrides

PPO = [
    "env.roles=[pioneer]",
    "env.templates=null",
    "agents.learners=[llm1]",
    "agents.reward_coefficients=null",
    "agents.role_period=null",
]


def write_base(tmp_path: Path, lm: Path, classifier: Path, reviews: Path) -> Path:
    """A tiny CORY config (2 iterations, batch 4) written as YAML, as a study's ``base``."""
    data = yaml.safe_load((ROOT / "examples" / "cory_imdb.yaml").read_text())
    merge_settings(data, tiny_overrides(lm, classifier, reviews))
    data["iterations"] = 2
    data["logging"]["checkpoint_every"] = 1
    path = tmp_path / "configs" / "base.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def write_study(tmp_path: Path, study: dict) -> Path:
    path = tmp_path / "studies" / "study.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


@pytest.fixture
def base_file(tmp_path, tiny_lm_dir, tiny_classifier_dir, reviews_file):
    return write_base(tmp_path, tiny_lm_dir, tiny_classifier_dir, reviews_file)


def test_expansion_crosses_variants_grid_and_seeds(tmp_path, base_file):
    path = write_study(
        tmp_path,
        {
            "name": "cory_vs_ppo",
            "base": "../configs/base.yaml",
            "overrides": ["iterations=3"],
            "variants": {"ppo": PPO, "cory": []},
            "grid": {"ppo.optimiser.learning_rate": [1e-3, 5e-4], "env.batch_size": [4]},
            "seeds": [0, 1],
            "compare": [["cory", "ppo"]],
            "resources": {"cpus": 1, "gpus": 0},
        },
    )
    study = load_study(path)
    runs = study.runs()
    assert len(runs) == 2 * 2 * 1 * 2
    assert [r.name for r in runs][:2] == [
        "ppo__ppo.optimiser.learning_rate=0.001__env.batch_size=4__seed0",
        "ppo__ppo.optimiser.learning_rate=0.001__env.batch_size=4__seed1",
    ]
    assert len({r.name for r in runs}) == len(runs)
    ppo, cory = runs[0], runs[-1]
    assert (
        ppo.variant == "ppo"
        and ppo.axes == {"ppo.optimiser.learning_rate": 1e-3, "env.batch_size": 4}
        and ppo.seed == 0
    )
    assert ppo.config.env.roles == ["pioneer"] and ppo.config.agents.learners == ["llm1"]
    assert ppo.config.iterations == 3 and ppo.config.logging.progress is False
    assert cory.config.env.roles == ["pioneer", "observer"] and cory.config.ppo.optimiser.learning_rate == 5e-4
    assert cory.config.seed == 1 and cory.overrides[-2:] == ["seed=1", "logging.progress=false"]
    expansion = study.expansion(runs)
    assert expansion["compare"] == [["cory", "ppo"]]
    assert expansion["runs"][0]["run_dir"] == f"runs/{ppo.name}"


def test_a_variant_setting_a_grid_key_is_not_crossed_with_it(tmp_path, base_file):
    text = """
name: lambdas
base: ../configs/base.yaml
overrides: {iterations: 3}
variants:
  ppo: {env.roles: [pioneer], env.templates: null, agents.learners: [llm1], agents.reward_coefficients: null}
  cory: []
grid:
  agents.reward_coefficients: [-0.5, 1]
seeds: [1]
"""
    path = tmp_path / "studies" / "lambdas.yaml"
    path.parent.mkdir()
    path.write_text(text)
    runs = load_study(path).runs()
    assert [run.name for run in runs] == [
        "ppo__seed1",
        "cory__agents.reward_coefficients=-0.5__seed1",
        "cory__agents.reward_coefficients=1__seed1",
    ]
    assert runs[0].config.agents.reward_coefficients is None and runs[0].config.iterations == 3
    assert runs[1].config.agents.reward_coefficients == -0.5 and runs[1].axes == {"agents.reward_coefficients": -0.5}


def test_run_names_are_filesystem_safe_and_unique():
    assert run_name("cory", {"agents.reward_coefficients": -0.5}, 1) == "cory__agents.reward_coefficients=-0.5__seed1"
    assert "/" not in run_name("a/b", {"env.roles": ["pioneer", "observer"]}, 0)
    study = study_from_dict(
        {"name": "s", "base": {"iterations": 2}, "variants": {"a/b": [], "a_b": []}, "seeds": [0]},
    )
    names = [run.name for run in study.runs()]
    assert names == ["a_b__seed0", "a_b__seed0_2"]


def test_bad_override_fails_before_any_run_naming_variant_and_key(tmp_path, base_file):
    study = load_study(
        write_study(
            tmp_path,
            {
                "name": "cory_vs_ppo",
                "base": "../configs/base.yaml",
                "variants": {"cory": [], "ppo": ["ppo.learning_rat=1e-3"]},
                "seeds": [0],
            },
        )
    )
    study_dir = tmp_path / "out"
    with pytest.raises(ConfigError) as caught:
        run_study(study, study_dir, LocalExecutor(1), progress=False)
    message = str(caught.value)
    assert message.startswith("study cory_vs_ppo, variant 'ppo', seed 0: unknown config key 'ppo.learning_rat'")
    assert "did you mean 'ppo.optimiser.learning_rate'" in message
    assert not study_dir.exists()


def test_a_study_with_only_a_grid_names_no_variant_in_its_errors(tmp_path, base_file):
    """A study without variants runs the base config: its errors name the study, the grid values and the seed."""
    study = load_study(
        write_study(
            tmp_path,
            {"name": "grid_only", "base": "../configs/base.yaml", "grid": {"seed_offset_x": [1]}, "seeds": [0]},
        )
    )
    with pytest.raises(ConfigError) as caught:
        run_study(study, tmp_path / "out", LocalExecutor(1), progress=False)
    assert str(caught.value).startswith("study grid_only, seed_offset_x=1, seed 0: unknown config key 'seed_offset_x'")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"seed": [0]}, ["unknown study key 'seed'", "did you mean 'seeds'"]),
        ({"resources": {"gpu": 1}}, ["unknown study key 'resources.gpu'", "did you mean 'gpus'"]),
        ({"compare": [["cory", "dpo"]]}, ["variant 'dpo'"]),
        ({"seeds": [0, 0]}, ["distinct"]),
        ({"base": "missing.yaml"}, ["missing.yaml", "does not exist"]),
        ({"variants": {"cory": ["iterations"]}}, ["variants.cory", "dotted overrides"]),
    ],
)
def test_bad_study_files_name_the_key(tmp_path, change, words):
    data = {"name": "s", "base": {"iterations": 2}, "variants": {"cory": []}, **change}
    with pytest.raises(ConfigError) as caught:
        load_study(write_study(tmp_path, data))
    assert all(word in str(caught.value) for word in words), str(caught.value)


def test_unquoted_brackets_in_an_override_list_say_how_to_write_it(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text("name: s\nbase: {iterations: 2}\nvariants:\n  ppo: [env.roles=[pioneer]]\n")
    with pytest.raises(ConfigError) as caught:
        load_study(path)
    assert "quote an override" in " ".join(caught.value.__notes__)


def test_study_dir_refuses_another_expansion(tmp_path):
    first = study_from_dict({"name": "s", "base": {"iterations": 2}, "seeds": [0]})
    second = study_from_dict({"name": "s", "base": {"iterations": 2}, "seeds": [0, 1]})
    prepare_study_dir(first, first.runs(), tmp_path)
    prepare_study_dir(first, first.runs(), tmp_path)  # the same expansion again is fine
    with pytest.raises(ConfigError, match="runs differ"):
        prepare_study_dir(second, second.runs(), tmp_path)
    prepare_study_dir(second, second.runs(), tmp_path, overwrite=True)
    assert len(json.loads((tmp_path / "study.json").read_text())["runs"]) == 2
    copied = yaml.safe_load((tmp_path / "study.yaml").read_text())
    assert copied["base"] == {"iterations": 2}
    assert [run.name for run in study_from_dict(copied).runs()] == [run.name for run in second.runs()]


def test_study_runs_in_two_workers_then_redoes_only_failed_runs(
    tmp_path, base_file, tiny_classifier_dir, capsys, monkeypatch
):
    import marllm.studies.report as report

    reports = []
    monkeypatch.setattr(
        report, "build_study_report", lambda path: reports.append(path) or path / "report" / "report.md"
    )
    # The cory runs' reward model: a directory whose config.json is empty at first, so that it passes the check
    # made before the study starts and fails when a run loads it.
    late = tmp_path / "late_classifier"
    late.mkdir()
    (late / "config.json").write_text("{}")
    study_file = write_study(
        tmp_path,
        {
            "name": "tiny",
            "base": "../configs/base.yaml",
            "variants": {"ppo": PPO, "cory": [f"task.reward_model={late}"]},
            "seeds": [0, 1],
            "compare": [["cory", "ppo"]],
        },
    )
    out = tmp_path / "study"
    argv = ["study", str(study_file), "--workers", "2", "--out", str(out)]
    assert main(argv) == 1
    expansion = json.loads((out / "study.json").read_text())
    names = [run["name"] for run in expansion["runs"]]
    assert names == ["ppo__seed0", "ppo__seed1", "cory__seed0", "cory__seed1"]
    for name in names[:2]:
        info = json.loads((out / "runs" / name / "run.json").read_text())
        assert info["status"] == "finished" and info["completed_iterations"] == 2
        assert yaml.safe_load((out / "runs" / name / "config.yaml").read_text())["logging"]["progress"] is False
    for name in names[2:]:
        assert "late_classifier" in (out / "runs" / name / "error.txt").read_text()
    assert "run cory__seed0 failed" in capsys.readouterr().err
    finished = {name: (out / "runs" / name / "metrics.jsonl").stat().st_mtime_ns for name in names[:2]}

    shutil.copytree(tiny_classifier_dir, late, dirs_exist_ok=True)  # fixed: only the failed runs run again
    assert main(argv) == 0
    for name in names:
        assert json.loads((out / "runs" / name / "run.json").read_text())["status"] == "finished"
        assert not (out / "runs" / name / "error.txt").exists()
    assert {name: (out / "runs" / name / "metrics.jsonl").stat().st_mtime_ns for name in names[:2]} == finished
    assert "4 of 4 runs finished, 0 failed" in capsys.readouterr().out

    # what a third run of the study would do with each run
    runs = {run.name: run for run in load_study(study_file).runs()}
    assert plan(runs["ppo__seed0"], out / "runs" / "ppo__seed0") == "skip"
    update_run_info(out / "runs" / "ppo__seed1", status="interrupted", completed_iterations=1)
    assert plan(runs["ppo__seed1"], out / "runs" / "ppo__seed1") == "resume"
    update_run_info(out / "runs" / "cory__seed0", status="failed")
    assert plan(runs["cory__seed0"], out / "runs" / "cory__seed0") == "start"
    assert plan(runs["ppo__seed0"], out / "runs" / "ppo__seed0", overwrite=True) == "start"
    assert plan(runs["cory__seed1"], out / "runs" / "missing") == "start"
    assert main(argv) == 0  # ppo__seed1 resumes from its checkpoint, cory__seed0 starts over
    info = {name: json.loads((out / "runs" / name / "run.json").read_text()) for name in names}
    assert info["ppo__seed1"]["resumed_from"] == [2] and info["ppo__seed1"]["status"] == "finished"
    assert "resumed_from" not in info["cory__seed0"] and info["cory__seed0"]["status"] == "finished"
    assert {name: (out / "runs" / name / "metrics.jsonl").stat().st_mtime_ns for name in names[:1]} == {
        names[0]: finished[names[0]]
    }
    assert reports == [out, out, out]  # the study's report is built after each run of the study

    base = yaml.safe_load(base_file.read_text())
    base["ppo"]["optimiser"]["learning_rate"] = (
        5e-4  # the finished runs were trained otherwise: refused before anything runs
    )
    base_file.write_text(yaml.safe_dump(base))
    assert main(argv) == 2
    assert "ppo.optimiser.learning_rate: 0.001 -> 0.0005" in capsys.readouterr().err
    assert reports == [out, out, out]


def test_study_report_action_is_parsed(tmp_path, monkeypatch):
    import marllm.studies.report as report

    seen = []
    monkeypatch.setattr(report, "build_study_report", lambda path: seen.append(path) or path / "report" / "report.md")
    assert main(["study", "report", str(tmp_path)]) == 0
    assert seen == [tmp_path]
    assert main(["study", "report"]) == 2


@pytest.mark.parametrize("path", sorted((ROOT / "examples" / "studies").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_built_in_study_expands_to_valid_configs(path):
    study = load_study(path)
    runs = study.runs()  # builds and checks every run's config
    assert len(runs) == len({run.name for run in runs}) >= 6
    assert all(run.config.logging.progress is False for run in runs)
    for run in runs:
        assert run.config.seed == run.seed
        if run.variant in ("ppo", "one"):  # the single-agent baseline of a study is examples/ppo_offline.yaml's
            assert run.config.env.roles == ["pioneer"] and run.config.agents.reward_coefficients is None


def test_the_arithmetic_study_runs_the_arithmetic_examples():
    """Its ppo and cory runs are examples/ppo_arith_offline.yaml and cory_arith_offline.yaml (but the progress bar)."""
    study = load_study(ROOT / "examples" / "studies" / "arith_algorithms.yaml")
    runs = {(run.variant, run.seed): run.config for run in study.runs()}
    for variant, example in (("ppo", "ppo_arith_offline"), ("cory", "cory_arith_offline")):
        expected = load_config(ROOT / "examples" / f"{example}.yaml")
        expected.logging.progress = False
        assert runs[(variant, 0)].to_dict() == expected.to_dict()
    grpo = runs[("grpo", 1)]
    assert grpo.learner_algorithms() == {"llm1": "grpo"} and grpo.env.group_size == 4 and grpo.seed == 1


def test_a_missing_model_fails_before_any_run_naming_the_variant_and_key(tmp_path, base_file):
    study = load_study(
        write_study(
            tmp_path,
            {
                "name": "bases",
                "base": "../configs/base.yaml",
                "variants": {"cory": [], "other_base": [f"model.name_or_path={tmp_path / 'no-such-model'}"]},
                "seeds": [0, 1],
            },
        )
    )
    study_dir = tmp_path / "out"
    with pytest.raises(ConfigError) as caught:
        run_study(study, study_dir, LocalExecutor(1), progress=False)
    message = str(caught.value)
    assert message.startswith("study bases, variant 'other_base', seed 0: model.name_or_path")
    assert "no-such-model" in message and not study_dir.exists()


def test_sigterm_stops_a_study_with_checkpoints_and_starts_no_further_run(tmp_path, base_file):
    """What a batch scheduler's SIGTERM does to `marllm study`: the running run checkpoints, the queued one never
    starts, the parent exits with the interrupt status and the command that resumes."""
    import subprocess
    import sys
    import time

    from tests.test_durable_runs import SUBPROCESS_ENV

    study_file = write_study(
        tmp_path, {"name": "long", "base": "../configs/base.yaml", "overrides": ["iterations=200"], "seeds": [0, 1]}
    )
    out = tmp_path / "study"
    command = [sys.executable, "-m", "marllm.cli", "study", str(study_file), "--workers", "1", "--out", str(out)]
    process = subprocess.Popen(command, cwd=ROOT, env=SUBPROCESS_ENV, stderr=subprocess.PIPE, text=True)
    first = out / "runs" / "base__seed0"
    deadline = time.monotonic() + 120
    while process.poll() is None and time.monotonic() < deadline:
        if (first / "metrics.jsonl").is_file() and (first / "metrics.jsonl").read_text().count("\n") >= 1:
            process.send_signal(signal.SIGTERM)
            break
        time.sleep(0.05)
    stderr = process.communicate(timeout=120)[1]
    assert process.returncode == 143, stderr  # 128 + SIGTERM
    assert "interrupted by SIGTERM" in stderr
    info = json.loads((first / "run.json").read_text())
    assert info["status"] == "interrupted" and 1 <= info["completed_iterations"] < 200
    assert (first / "training_state").is_dir()
    assert not (out / "runs" / "base__seed1" / "metrics.jsonl").exists()
    assert "interrupted by SIGTERM; finished runs are kept" in stderr


@pytest.mark.parametrize(
    ("where", "study_part"),
    [
        ("variants.ppo", {"variants": {"cory": [], "ppo": ["seed=3"]}}),
        ("variants.ppo", {"variants": {"cory": [], "ppo": {"run_dir": "runs/x"}}}),
        ("overrides", {"overrides": ["run_dir=runs/x"]}),
        ("grid", {"grid": {"seed": [1, 2]}}),
    ],
)
def test_a_study_refuses_seeds_and_run_dirs_it_would_override(tmp_path, base_file, where, study_part):
    study = {"name": "s", "base": "../configs/base.yaml", "seeds": [0], **study_part}
    with pytest.raises(ConfigError, match=rf"study {where} sets '(seed|run_dir)', which the study decides"):
        load_study(write_study(tmp_path, study))
