"""The Ray engine of studies: the same run directories as the local pool, resources checked against the cluster,
a run whose worker dies retried once, and resumed studies."""

import functools
import json
import math
from pathlib import Path

import pytest
import yaml

from marllm.cli import main
from marllm.config.loading import ConfigError
from marllm.studies.execute import LocalExecutor, run_study
from marllm.studies.spec import load_study

from .ray_hooks import dying_attempts
from .test_study_run import write_base, write_study

ray = pytest.importorskip("ray")
from marllm.studies.ray_executor import RayExecutor  # noqa: E402 - needs ray


@pytest.fixture
def base_file(tmp_path, tiny_lm_dir, tiny_classifier_dir, reviews_file):
    """The tiny CORY config of the local pool's study tests (2 iterations, a checkpoint after each)."""
    return write_base(tmp_path, tiny_lm_dir, tiny_classifier_dir, reviews_file)


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance of 2 CPUs for the module (the executors use it as it is and leave it running)."""
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, logging_level="warning")
    yield ray
    ray.shutdown()


def study_file(tmp_path: Path, **extra) -> Path:
    return write_study(tmp_path, {"name": "tiny", "base": "../configs/base.yaml", "seeds": [0, 1], **extra})


def final_metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])


def test_sigterm_cancels_the_tasks_which_checkpoint_and_the_resume_command_names_the_engine(tmp_path, base_file):
    """What a batch scheduler's SIGTERM does to `marllm study --engine ray` (its own local Ray, before the module's
    starts): the running run gets one SIGINT from ray.cancel, checkpoints and stops; the resume command names the
    engine."""
    import signal
    import subprocess
    import sys
    import time

    from tests.test_durable_runs import SUBPROCESS_ENV

    from .test_train import ROOT

    path = write_study(tmp_path, {"name": "long", "base": "../configs/base.yaml", "overrides": ["iterations=200"]})
    out = tmp_path / "study"
    command = [sys.executable, "-m", "marllm.cli", "study", str(path), "--engine", "ray", "--out", str(out)]
    env = {**SUBPROCESS_ENV, "HOME": str(Path.home())}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    metrics = out / "runs" / "base__seed0" / "metrics.jsonl"
    # Generous: Ray's start, the model's load and a first iteration can take minutes on a loaded 2-core machine.
    deadline, signalled = time.monotonic() + 600, False
    while process.poll() is None and time.monotonic() < deadline:
        if metrics.is_file() and metrics.read_text().count("\n") >= 1:
            process.send_signal(signal.SIGTERM)
            signalled = True
            break
        time.sleep(0.05)
    if not signalled:
        process.kill()
        pytest.fail(f"no iteration logged before the study ended or 600 s passed: {process.communicate()[1][-3000:]}")
    stderr = process.communicate(timeout=600)[1]
    assert process.returncode == 143, stderr  # 128 + SIGTERM
    assert "interrupted by SIGTERM" in stderr
    info = json.loads((metrics.parent / "run.json").read_text())
    assert info["status"] == "interrupted" and 1 <= info["completed_iterations"] < 200, stderr
    assert (metrics.parent / "training_state").is_dir()
    assert "--engine ray" in stderr.split("resume from their checkpoints with:")[1]


def test_ray_study_writes_what_the_local_pool_writes_and_skips_finished_runs(tmp_path, base_file, local_ray, capsys):
    path = study_file(tmp_path)
    out = tmp_path / "ray"
    assert main(["study", str(path), "--engine", "ray", "--out", str(out)]) == 0
    assert "2 of 2 runs finished, 0 failed" in capsys.readouterr().out
    local = tmp_path / "local"
    outcomes = run_study(load_study(path), local, LocalExecutor(2), progress=False)
    assert [outcome.status for outcome in outcomes] == ["finished", "finished"]

    assert (out / "study.json").read_text() == (local / "study.json").read_text()
    assert (out / "report" / "report.md").is_file()
    for name in ("base__seed0", "base__seed1"):
        ray_run, local_run = out / "runs" / name, local / "runs" / name
        assert sorted(p.name for p in ray_run.iterdir()) == sorted(p.name for p in local_run.iterdir())
        info = json.loads((ray_run / "run.json").read_text())
        assert info["status"] == "finished" and info["completed_iterations"] == 2
        ray_final, local_final = final_metrics(ray_run), final_metrics(local_run)
        for key, value in local_final.items():  # one torch thread each: the same numbers
            if isinstance(value, float) and not key.startswith("time/"):
                assert math.isclose(ray_final[key], value, rel_tol=1e-5, abs_tol=1e-7), key

    mtimes = {p.name: (p / "metrics.jsonl").stat().st_mtime_ns for p in (out / "runs").iterdir()}
    outcomes = run_study(load_study(path), out, RayExecutor(), progress=False)
    assert [outcome.status for outcome in outcomes] == ["skipped", "skipped"]
    assert {p.name: (p / "metrics.jsonl").stat().st_mtime_ns for p in (out / "runs").iterdir()} == mtimes


@pytest.mark.parametrize(
    ("resources", "words"),
    [({"cpus": 3}, "resources.cpus=3 but the local Ray instance has 2 CPU"), ({"gpus": 1}, "has 0 GPU")],
)
def test_a_run_asking_more_than_the_cluster_has_fails_before_it_waits(tmp_path, base_file, local_ray, resources, words):
    study = load_study(study_file(tmp_path, resources=resources))
    with pytest.raises(ConfigError) as caught:
        run_study(study, tmp_path / "out", RayExecutor(), progress=False)
    message = str(caught.value)
    assert words in message and "could never start" in message, message
    assert not (tmp_path / "out" / "runs").exists()


def test_a_dead_worker_is_retried_once_then_recorded_failed_and_redone_by_the_next_study(
    tmp_path, base_file, local_ray
):
    study = load_study(study_file(tmp_path, resources={"cpus": 1}))
    out, counts = tmp_path / "study", tmp_path / "attempts"
    counts.mkdir()
    dies = functools.partial(dying_attempts, deaths={"base__seed0": 1, "base__seed1": 2}, count_dir=str(counts))
    outcomes = run_study(study, out, RayExecutor(run_function=dies), progress=False)
    assert [outcome.status for outcome in outcomes] == ["finished", "failed"]
    # the retry of base__seed0 resumed from the checkpoint its first attempt wrote before its worker died
    assert (counts / "base__seed0").read_text().split() == ["start", "resume"]
    info = json.loads((out / "runs" / "base__seed0" / "run.json").read_text())
    assert info["status"] == "finished" and info["completed_iterations"] == 2 and info["resumed_from"] == [1]
    # base__seed1 died in both attempts: recorded as a local failure is
    assert (counts / "base__seed1").read_text().split() == ["start", "resume"]
    failed = out / "runs" / "base__seed1"
    assert "worker failed in each of 2 attempts: WorkerCrashedError" in outcomes[1].error
    assert (failed / "error.txt").read_text().strip() == outcomes[1].error
    assert json.loads((failed / "run.json").read_text())["status"] == "failed"

    finished = (out / "runs" / "base__seed0" / "metrics.jsonl").stat().st_mtime_ns
    outcomes = run_study(study, out, RayExecutor(run_function=dies), progress=False)
    assert [outcome.status for outcome in outcomes] == ["skipped", "finished"]
    assert (counts / "base__seed1").read_text().split() == ["start", "resume", "start"]  # a failed run starts over
    assert (out / "runs" / "base__seed0" / "metrics.jsonl").stat().st_mtime_ns == finished
    assert not (failed / "error.txt").exists()
    assert json.loads((failed / "run.json").read_text())["status"] == "finished"


def test_engine_options_are_checked(tmp_path):
    path = write_study(tmp_path, {"name": "s", "base": {"iterations": 2}})
    assert main(["study", str(path), "--engine", "ray", "--workers", "2"]) == 2
    assert main(["study", str(path), "--address", "auto"]) == 2
    assert main(["study", "report", str(tmp_path), "--engine", "ray"]) == 2


@pytest.mark.parametrize(
    ("resources", "words"),
    [({"cpus": 0}, "resources.cpus must be > 0"), ({"gpus": 1.5}, "resources.gpus must be 0, a fraction")],
)
def test_bad_resources_are_refused(tmp_path, resources, words):
    with pytest.raises(ConfigError, match=words):
        load_study(write_study(tmp_path, {"name": "s", "base": {"iterations": 2}, "resources": resources}))


def test_resources_default_to_one_cpu(tmp_path):
    study = load_study(write_study(tmp_path, {"name": "s", "base": {"iterations": 2}, "resources": {"gpus": 0.5}}))
    assert study.run_resources == {"cpus": 1.0, "gpus": 0.5}
    assert yaml.safe_load(yaml.safe_dump(study.to_file_dict()))["resources"] == {"gpus": 0.5}
