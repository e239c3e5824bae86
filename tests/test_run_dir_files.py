"""marllm writes over no file it did not write (issue 35, item 1): a fresh --run-dir holding files under marllm's
names is refused, --overwrite says what it deletes first, keeps or refuses over a user's files (inside a learner's
export too) and removes the old run's report."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import yaml

from marllm.cli import main
from marllm.config import config_from_dict
from marllm.reporting import build as report_build
from marllm.reporting import build_report
from marllm.run.run_dir import RunDirError, check_can_overwrite, overwrite_run_files, read_run_state
from marllm.run.run_files import REPORT_ENTRIES, foreign_export_files, remove_run_files, run_entries
from marllm.run.train import train
from tests.test_durable_runs import cory_data, lines
from tests.test_run_dir_ownership import snapshot
from tests.test_train import ROOT

CONFIG = ROOT / "examples" / "cory_offline.yaml"


@pytest.fixture
def cory(tiny_lm_dir, tiny_classifier_dir, reviews_file):
    def make(**top):
        return config_from_dict(cory_data(tiny_lm_dir, tiny_classifier_dir, reviews_file, **top))

    return make


@pytest.mark.parametrize("name", ["config.yaml", "samples.jsonl", "pass_at_k.json"])
@pytest.mark.parametrize("flag", [[], ["--overwrite"]])
def test_a_users_file_under_a_name_marllm_writes_is_refused_not_overwritten(tmp_path, capsys, name, flag):
    project = tmp_path / "proj"
    project.mkdir()
    (project / name).write_text("my: own config\n")
    (project / "notes.txt").write_text("mine")
    before = snapshot(project)
    assert main(["train", str(CONFIG), "--run-dir", str(project), *flag, "iterations=1"]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert error == [
        f"marllm: error: {project} holds {name} but no run.json: not a run marllm wrote, and marllm train writes "
        f"over no file it did not write; move them out of {project}, or train into another --run-dir"
    ]
    assert snapshot(project) == before


def test_an_empty_directory_under_a_name_marllm_writes_is_not_in_the_way(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    check_can_overwrite(tmp_path)  # nothing to refuse, nothing to delete


def test_overwrite_refuses_over_a_users_file_inside_an_export_and_removes_the_old_report(cory, tmp_path):
    run_dir = tmp_path / "run"
    train(cory(iterations=1, logging__save_checkpoint=True), run_dir)
    build_report([run_dir], run_dir / "report")
    (run_dir / "report" / "mine.txt").write_text("mine")
    readme = run_dir / "checkpoints" / "llm1" / "policy" / "my_readme.txt"
    readme.write_text("mine")
    before = snapshot(run_dir)
    with pytest.raises(RunDirError) as refused:
        train(cory(iterations=1), run_dir, overwrite=True)
    assert str(refused.value) == (
        f"--overwrite would delete the learners' exports in {run_dir / 'checkpoints'}, which hold files marllm did "
        f"not write: checkpoints/llm1/policy/my_readme.txt; move them out of {run_dir / 'checkpoints'} and run again"
    )
    assert snapshot(run_dir) == before

    readme.unlink()
    with warnings.catch_warnings():  # said before anything is deleted: as an error, the warning stops the deletion
        warnings.filterwarnings("error", message="--overwrite deletes")
        with pytest.raises(UserWarning) as said:
            overwrite_run_files(run_dir)
    assert str(said.value).startswith(f"--overwrite deletes the run in {run_dir} (1 of 1 iterations, finished): ")
    for named in ("config.yaml", "run.json", "metrics.jsonl", "training_state/ (1 entries)", "checkpoints/llm1",
                  "checkpoints/llm2", "report/ ("):
        assert named in str(said.value)
    assert (run_dir / "report" / "report.md").is_file() and (run_dir / "checkpoints" / "llm1").is_dir()

    with pytest.warns(UserWarning, match="kept what is not marllm's in its directories: report/mine.txt$"):
        train(cory(iterations=1), run_dir, overwrite=True)
    assert sorted(path.name for path in (run_dir / "report").iterdir()) == ["mine.txt"]  # the stale report is gone
    assert not (run_dir / "checkpoints").exists() and read_run_state(run_dir).finished
    assert len(lines(run_dir / "metrics.jsonl")) == 1


def test_a_users_file_in_an_exports_policy_is_not_marllms(tmp_path):
    learner = tmp_path / "checkpoints" / "llm1"
    (learner / "policy").mkdir(parents=True)
    (learner / "policy" / "model.safetensors").write_text("w")
    (learner / "learner_state.json").write_text("{}")
    manifest = {"format": "x", "sha256": {"policy/model.safetensors": "0", "learner_state.json": "0"}}
    (learner / "manifest.json").write_text(json.dumps(manifest))
    (learner / "policy" / "my_readme.txt").write_text("mine")
    assert foreign_export_files(tmp_path) == [learner / "policy" / "my_readme.txt"]
    assert learner / "policy" / "my_readme.txt" not in run_entries(tmp_path)
    assert remove_run_files(tmp_path) == [learner / "policy" / "my_readme.txt"]
    assert sorted(path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*")) == [
        "checkpoints", "checkpoints/llm1", "checkpoints/llm1/policy", "checkpoints/llm1/policy/my_readme.txt"
    ]


def test_the_report_entries_are_the_files_build_report_writes(tmp_path):
    names = {report_build.REPORT_FILE, report_build.SUMMARY_FILE, report_build.BY_ROLE_FILE,
             report_build.SCATTER_FILE, report_build.COLLAPSE_FILE}
    names |= {f"{metric}.png" for metric, _ in report_build.CURVE_METRICS}
    assert names == set(REPORT_ENTRIES)


def test_a_saved_config_in_a_run_dir_is_still_refused_as_a_run(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"name": "x"}))
    (run_dir / "run.json").write_text(json.dumps({"iterations": 2, "status": "finished"}))
    (run_dir / "metrics.jsonl").write_text('{"iteration": 0}\n{"iteration": 1}\n')
    assert main(["train", str(CONFIG), "--run-dir", str(run_dir), "iterations=1"]) == 1
    assert "already holds a run (2 of 2 iterations, finished); continue it from its latest checkpoint with --resume, " \
           "or delete its files and start again with --overwrite" in capsys.readouterr().err
    assert Path(run_dir / "config.yaml").read_text() == "name: x\n"
