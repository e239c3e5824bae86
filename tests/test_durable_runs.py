"""Durable runs: checkpoints, exact resume after a kill, clean interrupts, honest run directories, non-finite skips."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import marllm.run.train as train_module
from marllm.algorithms import GenerationConfig, NonFiniteLossError, PPOConfig, PPOLearner
from marllm.cli import main
from marllm.cli.main_job import run_main_job
from marllm.config import config_from_dict, flatten, load_config, resume_differences
from marllm.config.loading import ConfigError
from marllm.reporting import build_report, load_run
from marllm.run.checkpoint import CHECKPOINTS_DIR, latest_checkpoint
from marllm.run.interrupts import StopSignals, TrainingInterrupted
from marllm.run.run_dir import (
    RUN_FILES,
    TRAINING_STATE_DIR,
    RunDirError,
    keep_iterations_before,
    read_run_state,
    remove_run_files,
    write_run_info,
)
from marllm.run.train import train
from tests.conftest import make_tiny_gpt2
from tests.test_train import ROOT, merge_settings, tiny_overrides

SUBPROCESS_ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PATH": "/usr/bin:/bin"}


def cory_data(lm, classifier, reviews, **top) -> dict:
    """The tiny CORY config as YAML data: two learners whose roles swap every 2 iterations, no eval at the end."""
    data = yaml.safe_load((ROOT / "examples" / "cory_imdb.yaml").read_text())
    merge_settings(data, tiny_overrides(lm, classifier, reviews))
    data["agents"]["role_period"] = 2
    data["logging"].update({"eval_queries": 0, "checkpoint_every": 1})
    return with_settings(data, top)


def with_settings(data: dict, top: dict) -> dict:
    """``data`` with each ``section__key=value`` of ``top`` set at its place (sections made where missing)."""
    for key, value in top.items():
        *sections, name = key.split("__")
        node = data
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = value
    return data


@pytest.fixture
def cory(tiny_lm_dir, tiny_classifier_dir, reviews_file):
    def make(**top):
        return config_from_dict(cory_data(tiny_lm_dir, tiny_classifier_dir, reviews_file, **top))

    return make


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def without_time(metrics: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith("time/")} for m in metrics]


# --- exact resume after SIGKILL, and SIGINT, in real processes ----------------------------------------------------


def start_training(*args: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "marllm.cli", "train", *args]
    return subprocess.Popen(command, cwd=ROOT, env=SUBPROCESS_ENV, stderr=subprocess.PIPE, text=True)


def signal_at(process: subprocess.Popen, run_dir: Path, count: int, number: int, resumes: int = 0) -> str:
    """Send ``number`` to ``process`` once it has logged ``count`` metric lines, as the run's ``resumes``-th resume
    (so that lines an earlier process left are not counted); return its stderr once it has ended."""
    deadline = time.monotonic() + 120
    while process.poll() is None and time.monotonic() < deadline:
        info = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").is_file() else {}
        metrics = run_dir / "metrics.jsonl"
        started = len(info.get("resumed_from", [])) == resumes and metrics.is_file()
        if started and len(metrics.read_text().splitlines()) >= count:
            os.kill(process.pid, number)
            break
        time.sleep(0.01)
    return process.communicate(timeout=120)[1]


def test_killed_and_interrupted_runs_resume_to_the_same_metrics(
    tmp_path, tiny_lm_dir, tiny_classifier_dir, reviews_file
):
    data = cory_data(tiny_lm_dir, tiny_classifier_dir, reviews_file, iterations=10, logging__checkpoint_every=2)
    config_path = tmp_path / "cory.yaml"
    config_path.write_text(yaml.safe_dump(data))
    reference = train(config_from_dict(data), tmp_path / "reference")

    seed = random.randrange(1000)
    rng = random.Random(seed)
    first = rng.randint(3, 4)  # a checkpoint (every 2) exists once 3 lines are logged
    second = rng.randint(first + 1, 7)
    where = f"kill points {first}, {second} (seed {seed})"
    run_dir = tmp_path / "run"
    metrics = run_dir / "metrics.jsonl"

    process = start_training(str(config_path), "--run-dir", str(run_dir))
    signal_at(process, run_dir, first, signal.SIGKILL)
    assert process.returncode == -signal.SIGKILL, where
    assert read_run_state(run_dir).status == "running"  # killed: nobody could record anything else

    process = start_training(str(config_path), "--resume", str(run_dir))
    signal_at(process, run_dir, second, signal.SIGKILL, resumes=1)
    assert process.returncode == -signal.SIGKILL, where

    process = start_training(str(config_path), "--resume", str(run_dir))
    stderr = signal_at(process, run_dir, second + 1, signal.SIGINT, resumes=2)
    assert process.returncode == 130, (where, stderr[-2000:])
    assert "Traceback" not in stderr
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "interrupted" and info["completed_iterations"] == len(lines(metrics)) < 10, where
    assert latest_checkpoint(run_dir).iteration == info["completed_iterations"]
    told = [line for line in stderr.splitlines() if "stopped by SIGINT" in line]
    assert told == [
        f"marllm: stopped by SIGINT after {info['completed_iterations']} of 10 iterations; checkpoint written at "
        f"iteration {info['completed_iterations']}; resume with: marllm train {config_path} --resume {run_dir}"
    ]

    assert main(["train", str(config_path), "--resume", str(run_dir)]) == 0
    assert without_time(lines(metrics)) == without_time(reference.history), where
    assert (run_dir / "samples.jsonl").read_text() == (tmp_path / "reference" / "samples.jsonl").read_text()
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished" and info["completed_iterations"] == 10
    assert len(info["resumed_from"]) == 3


# --- signals, in this process -----------------------------------------------------------------------------------


def test_a_second_signal_stops_at_once_and_handlers_are_restored(capsys):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.received == signal.SIGTERM
        assert "stopping after the current iteration" in capsys.readouterr().err
        with pytest.raises(TrainingInterrupted) as stopped:
            os.kill(os.getpid(), signal.SIGINT)
        assert stopped.value.exit_status == 130 and stopped.value.at_once
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    with StopSignals() as stop:
        stop.graceful = False  # after training: the first signal stops at once
        with pytest.raises(TrainingInterrupted) as stopped:
            os.kill(os.getpid(), signal.SIGTERM)
    assert stopped.value.exit_status == 143


def interrupt_at(monkeypatch, iteration: int, number: int = signal.SIGINT, times: int = 1) -> None:
    """Deliver ``number`` (``times`` times) to this process during iteration ``iteration`` of the next run."""
    real = train_module.run_iteration
    calls = iter(range(10_000))

    def run_iteration(env, learners, seed=None, concurrent_updates=False, names=None):
        result = real(env, learners, seed, concurrent_updates, names)
        if next(calls) == iteration:
            for _ in range(times):
                os.kill(os.getpid(), number)
        return result

    monkeypatch.setattr(train_module, "run_iteration", run_iteration)


def test_sigterm_finishes_the_iteration_writes_a_checkpoint_and_exits_143(cory, monkeypatch, tmp_path, capsys):
    config = cory(iterations=6, logging__checkpoint_every=None)
    before = signal.getsignal(signal.SIGTERM)
    interrupt_at(monkeypatch, 2, signal.SIGTERM)
    with pytest.raises(TrainingInterrupted) as stopped:
        train(config, tmp_path / "run")
    assert stopped.value.exit_status == 143 and not stopped.value.at_once
    assert (stopped.value.completed, stopped.value.checkpoint) == (3, 3)
    assert latest_checkpoint(tmp_path / "run").iteration == 3
    assert read_run_state(tmp_path / "run").describe() == "3 of 6 iterations, interrupted"
    assert signal.getsignal(signal.SIGTERM) is before


def test_two_ctrl_c_stop_at_once_with_one_line(cory, monkeypatch, tmp_path, capsys):
    config_path = tmp_path / "cory.yaml"
    config_path.write_text(yaml.safe_dump(cory(iterations=6).to_dict()))
    interrupt_at(monkeypatch, 2, times=2)
    assert main(["train", str(config_path), "--run-dir", str(tmp_path / "run")]) == 130
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("marllm: stopped")]
    # the second Ctrl-C came inside iteration 2: iterations 0 and 1 are checkpointed (every iteration)
    assert err == [
        "marllm: stopped at once by SIGINT after 2 of 6 iterations; its latest checkpoint (iteration 2) stays; "
        f"resume with: marllm train {config_path} --resume {tmp_path / 'run'}"
    ]
    assert read_run_state(tmp_path / "run").status == "interrupted"


# --- run directories --------------------------------------------------------------------------------------------


def test_training_again_into_a_run_directory_needs_resume_or_overwrite(cory, tmp_path):
    run_dir = tmp_path / "run"
    train(cory(iterations=2), run_dir)
    (run_dir / "notes.txt").write_text("mine")
    (run_dir / "eval_samples.jsonl").write_text("{}\n")
    held = r"already holds a run \(2 of 2 iterations, finished\).*--resume.*--overwrite"
    with pytest.raises(RunDirError, match=held):
        train(cory(iterations=2), run_dir)
    result = train(cory(iterations=1), run_dir, overwrite=True)
    assert len(result.history) == 1 and len(lines(run_dir / "metrics.jsonl")) == 1
    assert (run_dir / "notes.txt").read_text() == "mine" and not (run_dir / "eval_samples.jsonl").exists()
    assert [p.name for p in (run_dir / CHECKPOINTS_DIR).iterdir()] == ["iteration-000001"]
    with pytest.raises(RunDirError, match="exclude each other"):
        train(cory(iterations=1), run_dir, resume=True, overwrite=True)


def test_remove_run_files_leaves_other_files(tmp_path):
    for name in RUN_FILES:
        (tmp_path / name).mkdir() if "." not in name else (tmp_path / name).write_text("x")
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "plots").mkdir()
    remove_run_files(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "plots"]
    assert TRAINING_STATE_DIR == CHECKPOINTS_DIR


def test_resume_checks_the_config_and_the_checkpoint(cory, tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(RunDirError, match="nothing to resume: run directory .* does not exist"):
        train(cory(iterations=2), run_dir, resume=True)
    train(cory(iterations=3, logging__checkpoint_every=None), run_dir)
    changed = cory(iterations=3, seed=5)
    changed.ppo.optimiser.learning_rate = 0.5
    with pytest.raises(ConfigError, match=r"ppo.optimiser.learning_rate: 0.001 -> 0.5; seed: 0 -> 5\. Resume with"):
        train(changed, run_dir, resume=True)
    with pytest.raises(ConfigError, match="iterations=2 is fewer than the 3 iterations"):
        train(cory(iterations=2), run_dir, resume=True)
    # logging, run_dir and a longer run may change: the run goes on from iteration 3 to 5
    result = train(cory(iterations=5, logging__eval_queries=2, logging__samples_per_iteration=1), run_dir, resume=True)
    assert [m["iteration"] for m in result.history] == list(range(5))
    assert len(lines(run_dir / "eval_samples.jsonl")) == 2 * 3
    assert json.loads((run_dir / "run.json").read_text())["resumed_from"] == [3]


def test_a_run_on_the_offline_assets_resumes_on_the_same_recipe_only(tmp_path, monkeypatch):
    """The recipe of ``marllm:offline-*`` is in run.json and the checkpoint; resuming under another is refused before
    anything is built (the other recipe's assets are not prepared)."""
    from marllm.assets.offline.recipe import RECIPE_ENV, RECIPES

    monkeypatch.setenv(RECIPE_ENV, "small")
    run_dir, config = tmp_path / "run", str(ROOT / "examples" / "games" / "tictactoe_offline.yaml")
    assert main(["train", config, "--run-dir", str(run_dir), "iterations=1", "logging.progress=false"]) == 0
    recorded = {"recipe": "small", "directory": RECIPES["small"].directory_name}
    assert json.loads((run_dir / "run.json").read_text())["offline_assets"] == recorded
    monkeypatch.setenv(RECIPE_ENV, "full")
    monkeypatch.setattr(train_module, "build", lambda *args: pytest.fail("built before the recipe was checked"))
    with pytest.raises(ConfigError, match=rf"recipe 'small' \({recorded['directory']}\), but \${RECIPE_ENV} now "
                       rf"names 'full' .*: resume it with {RECIPE_ENV}=small"):
        train(load_config(config, ["iterations=2"]), run_dir, resume=True)
    monkeypatch.undo()
    monkeypatch.setenv(RECIPE_ENV, "small")
    result = train(load_config(config, ["iterations=2", "logging.progress=false"]), run_dir, resume=True)
    assert [m["iteration"] for m in result.history] == [0, 1]


def test_resume_differences_leave_out_what_may_change(cory):
    base = cory(iterations=3)
    saved = base.to_dict()
    other = cory(iterations=30, run_dir="elsewhere", logging__progress=True, logging__checkpoint_every=5)
    other.ppo.guards.on_nonfinite = "skip"
    assert resume_differences(saved, other) == []
    other.env.batch_size, other.model.dtype = 8, "float64"
    assert resume_differences(saved, other) == ["env.batch_size: 4 -> 8", "model.dtype: 'float32' -> 'float64'"]
    del saved["ppo"]["optimiser"]["max_grad_norm"]  # a key added since: compares as its default
    assert "ppo.optimiser.max_grad_norm" not in " ".join(resume_differences(saved, other))
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": {}}) == {"a.b": 1, "a.c": [1, 2], "d": {}}


def test_logs_are_cut_back_to_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"iteration": 0, "x": NaN}\n{"iteration": 1}\n{"iteration": 2}\n{"iteration": 3, "x"')
    assert [m["iteration"] for m in keep_iterations_before(path, 2)] == [0, 1]
    assert path.read_text() == '{"iteration": 0, "x": NaN}\n{"iteration": 1}\n'
    assert not list(tmp_path.glob(".*.tmp"))


def test_weights_are_saved_before_the_end_of_run_evaluation(cory, monkeypatch, tmp_path):
    run_dir = tmp_path / "run"
    seen = {}

    def evaluate(config, task, learners, num_queries, seed, *placement):
        seen["export"] = (run_dir / "checkpoints" / "llm1" / "policy").is_dir()
        seen["checkpoint"] = latest_checkpoint(run_dir).iteration
        seen["status"] = read_run_state(run_dir).status
        raise RuntimeError("evaluation failed")

    monkeypatch.setattr(train_module, "evaluate_alone", evaluate)
    config = cory(iterations=3, logging__eval_queries=2, logging__save_checkpoint=True, logging__checkpoint_every=2)
    with pytest.raises(RuntimeError, match="evaluation failed"):
        train(config, run_dir)
    assert seen == {"export": True, "checkpoint": 3, "status": "running"}
    info = json.loads((run_dir / "run.json").read_text())
    assert (info["status"], info["completed_iterations"]) == ("failed", 3)
    assert info["error"] == "RuntimeError: evaluation failed"
    monkeypatch.undo()
    # resuming a run whose training ended only runs what is left: the evaluation
    result = train(config, run_dir, resume=True)
    assert len(result.history) == 3 and read_run_state(run_dir).finished
    assert len(lines(run_dir / "eval_samples.jsonl")) == 3 * 2


def test_a_new_run_stopped_before_its_first_iteration_leaves_nothing(cory, monkeypatch, tmp_path):
    interrupt_at(monkeypatch, 0, times=2)
    with pytest.raises(TrainingInterrupted) as stopped:
        train(cory(iterations=3), tmp_path / "new" / "run")
    assert stopped.value.checkpoint is None and not (tmp_path / "new").exists()


# --- report -----------------------------------------------------------------------------------------------------


def write_run(run_dir: Path, n_lines: int, **info) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text(
        "".join(json.dumps({"iteration": i, "llm1/task_reward": i / 10, "llm1/kl": 0.1}) + "\n" for i in range(n_lines))
    )
    write_run_info(run_dir, {"name": "cory", "learners": ["llm1"], **info})
    return run_dir


def test_the_report_marks_unfinished_runs(tmp_path):
    unfinished = write_run(tmp_path / "a", 5, iterations=20, status="interrupted", completed_iterations=5)
    finished = write_run(tmp_path / "b", 4, iterations=4, status="finished", completed_iterations=4)
    report = build_report([unfinished, finished], tmp_path / "report", smoothing=1).read_text()
    assert "| CORY (a; unfinished: 5 of 20 iterations, interrupted) | cory |" in report
    assert "| CORY (b) | cory |" in report and "| 4 of 4 | finished |" in report
    assert "**Unfinished runs**: CORY in " in report and "(5 of 20 iterations, interrupted)" in report
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert [(r["status"], r["finished"]) for r in summary["runs"]] == [("interrupted", False), ("finished", True)]
    killed = load_run(write_run(tmp_path / "c", 2, iterations=9, status="running"))
    assert killed.display == "CORY (unfinished: 2 of 9 iterations, running or killed)"


def test_runs_from_before_statuses_count_as_finished_when_complete(tmp_path):
    assert load_run(write_run(tmp_path / "old", 3, iterations=3)).finished
    short = load_run(write_run(tmp_path / "short", 2, iterations=3))
    assert short.status == "unknown"
    assert short.note == "unfinished: 2 of 3 iterations, stopped early (no status recorded)"


def test_the_report_leaves_out_a_metrics_line_cut_short(tmp_path):
    run_dir = write_run(tmp_path / "killed", 3, iterations=9, status="running")
    with (run_dir / "metrics.jsonl").open("a") as handle:
        handle.write('{"iteration": 3, "llm1/ta')
    with pytest.warns(UserWarning, match="leaving out a last line cut short"):
        run = load_run(run_dir)
    assert len(run.metrics) == 3


# --- the main job -----------------------------------------------------------------------------------------------


def test_main_job_resumes_an_unfinished_run_and_keeps_a_finished_one(cory, monkeypatch, tmp_path):
    import marllm.assets.offline

    monkeypatch.setattr(marllm.assets.offline, "ensure_assets", lambda **kwargs: None)
    config = cory(iterations=4, name="ppo", logging__checkpoint_every=2)
    config_path = tmp_path / "ppo.yaml"
    config_path.write_text(yaml.safe_dump(config.to_dict()))
    out = tmp_path / "main"
    interrupt_at(monkeypatch, 2)
    with pytest.raises(TrainingInterrupted):
        train(config, out / "ppo")
    monkeypatch.undo()
    monkeypatch.setattr(marllm.assets.offline, "ensure_assets", lambda **kwargs: None)

    def job(**kwargs):
        run_main_job(out, configs={"ppo": config_path}, **kwargs)
        return json.loads((out / "timings.json").read_text())

    timings = job()
    assert timings["runs"]["ppo"]["action"] == "resumed" and timings["runs"]["ppo"]["from_iteration"] == 3
    assert read_run_state(out / "ppo").finished and len(lines(out / "ppo" / "metrics.jsonl")) == 4
    assert (out / "report" / "report.md").is_file() and timings["ppo_s"] == timings["runs"]["ppo"]["wall_s"]
    assert job()["runs"]["ppo"]["action"] == "skipped"
    assert job(overwrite=True)["runs"]["ppo"]["action"] == "overwritten"
    with pytest.raises(ConfigError, match=r"finished run of another config \(seed: 0 -> 3\).*--overwrite"):
        config_path.write_text(yaml.safe_dump({**config.to_dict(), "seed": 3}))
        job()


# --- non-finite updates -----------------------------------------------------------------------------------------


def nan_losses_for(monkeypatch, learner_name: str, from_update: int, from_call: int = 0) -> None:
    """Make ``learner_name``'s PPO loss NaN from its update ``from_update`` on (from the ``from_call``-th loss of
    that update)."""
    real = PPOLearner._loss
    calls: dict[int, int] = {}

    def loss(self, mb, prompt_length, kl_coef):
        value, parts = real(self, mb, prompt_length, kl_coef)
        if self.name != learner_name or self.num_updates < from_update:
            return value, parts
        calls[self.num_updates] = calls.get(self.num_updates, 0) + 1
        return (value * float("nan"), parts) if calls[self.num_updates] > from_call else (value, parts)

    monkeypatch.setattr(PPOLearner, "_loss", loss)


def skip_learner(tokenizer) -> PPOLearner:
    settings = PPOConfig.from_flat(mini_batch_size=4, ppo_epochs=2, learning_rate=1e-2, on_nonfinite="skip")
    reference = make_tiny_gpt2(tokenizer).requires_grad_(False).eval()
    return PPOLearner(
        "llm1",
        model=make_tiny_gpt2(tokenizer),
        tokenizer=tokenizer,
        reference=reference,
        config=settings,
        generation=GenerationConfig(4, 8),
    )


def learner_state(learner: PPOLearner) -> tuple:
    weights = [p.detach().clone() for p in learner.model.parameters()]
    scores = learner.score_statistics
    return weights, float(learner.kl_controller.value), float(scores.mean), float(scores.var), scores.count


@pytest.mark.parametrize("from_call", [0, 1], ids=["first-step", "later-step"])
def test_a_skipped_update_leaves_the_controller_and_score_statistics(tokenizer, monkeypatch, from_call):
    learner = skip_learner(tokenizer)
    learner.act({"prompt": ["this movie was"] * 8})
    learner.finish(np.linspace(-1, 1, 8))
    learner.update()
    before = learner_state(learner)
    steps_before = learner.optimizer.state[next(learner.model.parameters())]["step"].item()
    nan_losses_for(monkeypatch, "llm1", from_update=1, from_call=from_call)
    learner.act({"prompt": ["this movie was"] * 8})
    learner.finish(np.linspace(0, 3, 8))
    stats = learner.update()
    assert stats["nonfinite_skipped"] == 1.0 and "non-finite PPO loss" in learner.last_nonfinite
    after = learner_state(learner)
    assert after[1:] == before[1:]  # KL coefficient and running score statistics untouched
    steps = learner.optimizer.state[next(learner.model.parameters())]["step"].item()
    # NaN at the first step: nothing applied; at the second: the first step (finite loss) stays
    assert steps == steps_before + from_call
    same = all(torch.equal(a, b) for a, b in zip(before[0], after[0], strict=True))
    assert same == (from_call == 0)


def test_too_many_skips_stop_the_run_and_keep_the_checkpoint_before_them(cory, monkeypatch, tmp_path, capsys):
    nan_losses_for(monkeypatch, "llm1", from_update=2)
    config = cory(iterations=8)
    config.ppo.guards.on_nonfinite, config.ppo.guards.max_consecutive_skips = "skip", 2
    with pytest.raises(NonFiniteLossError, match=r"\['llm1'\] skipped more than ppo.guards.max_consecutive_skips = 2"):
        train(config, tmp_path / "run")
    metrics = lines(tmp_path / "run" / "metrics.jsonl")
    assert [m["llm1/nonfinite_skipped"] for m in metrics] == [0, 0, 1, 1, 1]
    assert [m["llm2/nonfinite_skipped"] for m in metrics] == [0] * 5
    assert latest_checkpoint(tmp_path / "run").iteration == 2  # none written while llm1 skipped
    err = capsys.readouterr().err
    assert "marllm: iteration 2: learner 'llm1' skipped its update (1 in a row): learner 'llm1': non-finite" in err
    assert read_run_state(tmp_path / "run").status == "failed"


def test_non_finite_settings_are_checked():
    with pytest.raises(ValueError, match="ppo.guards.on_nonfinite must be one of"):
        PPOConfig.from_flat(on_nonfinite="ignore")
    with pytest.raises(ValueError, match="ppo.guards.max_consecutive_skips must be an integer >= 0"):
        PPOConfig.from_flat(max_consecutive_skips=-1)
    with pytest.raises(ConfigError, match="logging.checkpoint_every must be >= 1"):
        config_from_dict({"logging": {"checkpoint_every": 0}})
    with pytest.raises(ConfigError, match="logging.keep_checkpoints must be >= 1"):
        config_from_dict({"logging": {"keep_checkpoints": 0}})
    assert config_from_dict({"model": {"trust_remote_code": True}}).model.trust_remote_code


def test_cli_resume_takes_an_override_after_it(monkeypatch, tmp_path):
    from marllm.cli import _parse

    args = _parse(["train", "c.yaml", "--resume", "iterations=30"])
    assert args.resume is True and args.overrides == ["iterations=30"]
    args = _parse(["train", "c.yaml", "--resume", str(tmp_path), "iterations=30"])
    assert args.resume == str(tmp_path) and args.overrides == ["iterations=30"]
    with pytest.raises(SystemExit):
        _parse(["train", "c.yaml", "--resume", "--overwrite"])


def test_a_non_finite_loss_fails_the_run_with_one_line_and_how_to_resume(cory, monkeypatch, tmp_path, capsys):
    nan_losses_for(monkeypatch, "llm1", from_update=2)
    config_path, run_dir = tmp_path / "cory.yaml", tmp_path / "run"
    config_path.write_text(yaml.safe_dump(cory(iterations=4).to_dict()))
    assert main(["train", str(config_path), "--run-dir", str(run_dir)]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("marllm:")]
    assert err[0].startswith("marllm: error: learner 'llm1': non-finite PPO loss")
    assert err[1:] == [
        f"marllm: the run's latest checkpoint (iteration 2) stays; resume with: marllm train {config_path} --resume "
        f"{run_dir} ppo.guards.on_nonfinite=skip"
    ]
    assert read_run_state(run_dir).describe() == "2 of 4 iterations, failed"
    monkeypatch.undo()
    assert main(["train", str(config_path), "--resume", str(run_dir), "ppo.guards.on_nonfinite=skip"]) == 0
    assert read_run_state(run_dir).finished
