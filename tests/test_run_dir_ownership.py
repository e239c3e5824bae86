"""Run, study and main-job directories are owned by one process at a time; --overwrite removes only marllm's files."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import marllm.cli.main_job as main_job
from marllm.cli import main
from marllm.config import config_from_dict
from marllm.run.run_dir import (
    LOCK_FILE,
    RUN_FILES,
    DirectoryInUseError,
    RunDirError,
    hold_run_dir,
    holds_run,
    read_run_state,
    remove_run_files,
)
from marllm.run.train import train
from marllm.studies.execute import run_one, run_study
from marllm.studies.files import ERROR_FILE
from marllm.studies.spec import study_from_dict
from marllm.utils.files import LockHeldError, exclusive_lock
from tests.test_durable_runs import SUBPROCESS_ENV, cory_data, lines
from tests.test_train import ROOT

HOLD = """
import sys, time
from pathlib import Path
from marllm.run.run_dir import hold_directory
with hold_directory(Path(sys.argv[1]), "directory", "wait"):
    print("held", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def cory(tiny_lm_dir, tiny_classifier_dir, reviews_file):
    def make(**top):
        return config_from_dict(cory_data(tiny_lm_dir, tiny_classifier_dir, reviews_file, **top))

    return make


@pytest.fixture
def processes():
    """Processes a test starts, killed (SIGKILL) at its end."""
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=60)


def hold_elsewhere(directory: Path, processes: list) -> subprocess.Popen:
    """Another process that owns ``directory`` (holds its lock) until it is killed."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(directory)], cwd=ROOT, env=SUBPROCESS_ENV, stdout=subprocess.PIPE, text=True
    )
    processes.append(process)
    assert process.stdout.readline() == "held\n"
    return process


def kill(process: subprocess.Popen) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=60)


def snapshot(directory: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under ``directory`` with its modification time and (for a file) its bytes."""
    return {
        path.relative_to(directory).as_posix(): (path.stat().st_mtime_ns, path.read_bytes() if path.is_file() else None)
        for path in sorted(directory.rglob("*"))
    }


# --- the lock ---------------------------------------------------------------------------------------------------


def test_a_run_directory_held_by_another_process_is_refused_until_that_process_is_killed(tmp_path, processes):
    run_dir = tmp_path / "run"
    holder = hold_elsewhere(run_dir, processes)
    lock = run_dir / LOCK_FILE
    assert lock.read_text().splitlines()[0] == str(holder.pid)
    assert not holds_run(run_dir) and read_run_state(run_dir) is None  # the lock does not make it a run
    in_use = rf"run directory {re.escape(str(run_dir))} is in use by process {holder.pid}\b"
    with pytest.raises(DirectoryInUseError, match=in_use) as refused, hold_run_dir(run_dir):
        pytest.fail("locked twice")
    assert refused.value.pid == holder.pid
    assert f"kill {holder.pid}" in str(refused.value) and "--run-dir" in str(refused.value)
    assert lock.read_text().splitlines()[0] == str(holder.pid)  # a refused caller changes nothing
    with pytest.raises(LockHeldError, match=f"locked by process {holder.pid}"), exclusive_lock(lock):
        pass

    kill(holder)
    assert lock.is_file()  # a killed holder leaves its file, but no lock
    with hold_run_dir(run_dir), hold_run_dir(run_dir):  # free again; one thread may nest
        assert lock.read_text().splitlines()[0] == str(os.getpid())
    assert sorted(run_dir.iterdir()) == []  # let go, the lock file goes


def test_training_into_a_directory_another_run_trains_in_is_refused_before_touching_it(
    cory, tmp_path, processes, capsys
):
    config_path = tmp_path / "cory.yaml"
    config_path.write_text(yaml.safe_dump(cory(iterations=1000).to_dict()))
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "marllm.cli", "train", str(config_path), "--run-dir", str(run_dir)]
    owner = subprocess.Popen(command, cwd=ROOT, env=SUBPROCESS_ENV, stderr=subprocess.DEVNULL)
    processes.append(owner)
    deadline = time.monotonic() + 300
    while not (run_dir / "metrics.jsonl").is_file() or not (run_dir / "metrics.jsonl").read_text():
        assert owner.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(owner.pid, signal.SIGSTOP)  # it still owns the directory, and writes nothing meanwhile
    before = snapshot(run_dir)
    for flag in ("--overwrite", "--resume"):
        assert main(["train", str(config_path), "--run-dir", str(run_dir), flag, "iterations=1"]) == 2
        error = capsys.readouterr().err
        assert f"marllm: error: run directory {run_dir} is in use by process {owner.pid}" in error
        assert f"kill {owner.pid}" in error and error.count("\n") == 1
        assert snapshot(run_dir) == before

    kill(owner)  # SIGKILL: its lock goes with it
    assert main(["train", str(config_path), "--run-dir", str(run_dir), "--overwrite", "iterations=1"]) == 0
    assert len(lines(run_dir / "metrics.jsonl")) == 1 and read_run_state(run_dir).finished
    assert not (run_dir / LOCK_FILE).exists()


def test_a_study_run_another_process_owns_is_refused_and_left_alone(cory, tmp_path, processes):
    run_dir = tmp_path / "study" / "runs" / "cory__seed0"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"iteration": 0}\n')
    holder = hold_elsewhere(run_dir, processes)  # an orphan worker of an earlier `marllm study`
    before = snapshot(run_dir)
    outcome = run_one(cory(iterations=1).to_dict(), str(run_dir), "start")
    assert outcome.status == "failed" and f"in use by process {holder.pid}" in outcome.error
    assert snapshot(run_dir) == before and not (run_dir / ERROR_FILE).exists()


class NoRuns:
    def run(self, runs, study_dir, on_event, overwrite=False):
        raise AssertionError("a study ran in a directory another process owns")


def test_a_study_directory_has_one_owner(cory, tmp_path, processes):
    study_dir = tmp_path / "study"
    study_dir.mkdir()
    holder = hold_elsewhere(study_dir, processes)
    study = study_from_dict({"name": "s", "base": cory(iterations=1).to_dict(), "seeds": [0]})
    in_use = rf"study directory {re.escape(str(study_dir))} is in use by process {holder.pid}\b"
    with pytest.raises(DirectoryInUseError, match=in_use):
        run_study(study, study_dir, NoRuns(), progress=False)
    assert sorted(path.name for path in study_dir.iterdir()) == [LOCK_FILE]


def test_a_main_job_directory_has_one_owner(cory, tmp_path, processes, monkeypatch):
    out = tmp_path / "main"
    holder = hold_elsewhere(out, processes)
    monkeypatch.setattr("marllm.assets.offline.ensure_assets", lambda **kwargs: pytest.fail("prepared"))
    monkeypatch.setattr(main_job, "train", lambda *args, **kwargs: pytest.fail("trained"))
    config_path = tmp_path / "ppo.yaml"
    config_path.write_text(yaml.safe_dump(cory(iterations=1).to_dict()))
    in_use = rf"main job directory {re.escape(str(out))} is in use by process {holder.pid}\b"
    with pytest.raises(DirectoryInUseError, match=in_use):
        main_job.run_main_job(out, configs={"ppo": config_path})
    assert sorted(path.name for path in out.iterdir()) == [LOCK_FILE]


# --- overwrite --------------------------------------------------------------------------------------------------


def test_overwrite_removes_only_marllms_files_from_its_directories(cory, tmp_path):
    run_dir = tmp_path / "run"
    train(cory(iterations=2, logging__tensorboard=True, logging__save_checkpoint=True), run_dir)
    old_events = sorted(path.name for path in (run_dir / "tensorboard").iterdir())
    assert old_events and sorted(path.name for path in (run_dir / "checkpoints").iterdir()) == ["llm1", "llm2"]
    mine = {
        "tensorboard/mine.txt": "a",
        "training_state/mine.txt": "b",
        "checkpoints/mine.txt": "c",
        "checkpoints/mine/model.bin": "e",
        "notes.txt": "f",
    }
    for name, text in mine.items():
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text(text)

    (run_dir / "checkpoints" / "llm1" / "notes.txt").write_text("d")  # inside an export: refused, not deleted
    with pytest.raises(RunDirError, match="hold files marllm did not write: checkpoints/llm1/notes.txt; move them"):
        train(cory(iterations=1, logging__tensorboard=True), run_dir, overwrite=True)
    (run_dir / "checkpoints" / "llm1" / "notes.txt").rename(run_dir / "moved_notes.txt")
    with pytest.warns(UserWarning, match="kept what is not marllm's") as warned:
        result = train(cory(iterations=1, logging__tensorboard=True), run_dir, overwrite=True)
    kept = "checkpoints/mine, checkpoints/mine.txt, tensorboard/mine.txt, "
    messages = [str(warning.message) for warning in warned if "kept what" in str(warning.message)]
    assert len(messages) == 1 and messages[0].endswith(kept + "training_state/mine.txt")
    assert {name: (run_dir / name).read_text() for name in mine} == mine
    assert len(result.history) == 1 and read_run_state(run_dir).finished
    assert len(lines(run_dir / "metrics.jsonl")) == 1
    assert json.loads((run_dir / "run.json").read_text())["completed_iterations"] == 1
    assert sorted(path.name for path in (run_dir / "training_state").iterdir()) == ["iteration-000001", "mine.txt"]
    events = sorted(path.name for path in (run_dir / "tensorboard").iterdir() if path.name != "mine.txt")
    assert len(events) == 1 and events[0] not in old_events
    # this run exported nothing: the earlier export is gone, the user's files stay
    assert sorted(path.name for path in (run_dir / "checkpoints").iterdir()) == ["mine", "mine.txt"]
    assert not (run_dir / LOCK_FILE).exists()


def test_only_marllms_entries_make_a_run_and_go_with_remove_run_files(tmp_path):
    for name in RUN_FILES:
        (tmp_path / name).mkdir() if "." not in name else (tmp_path / name).write_text("x")
    (tmp_path / "training_state" / "mine.txt").write_text("mine")
    (tmp_path / "tensorboard" / "events.out.tfevents.1.host.2.0").write_text("x")
    (tmp_path / "checkpoints" / "llm1" / "policy").mkdir(parents=True)
    (tmp_path / "checkpoints" / "llm1" / "learner_state.json").write_text("{}")
    (tmp_path / "training_state" / ".tmp-iteration-000002-7").mkdir()
    assert remove_run_files(tmp_path) == [tmp_path / "training_state" / "mine.txt"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["training_state"]
    assert not holds_run(tmp_path)  # a user's file in training_state/ is no checkpoint
    (tmp_path / "training_state" / "iteration-000001").mkdir()
    assert holds_run(tmp_path)
