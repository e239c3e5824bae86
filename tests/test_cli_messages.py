"""The directory, study and template mistakes of issue 21: each is one ``marllm: …`` line, exit status 2, saying what
was given, what is missing and what to give; nothing is written and no model loads.

A directory given as the config or study file; a directory that is not a run's given to ``marllm report`` (a stray
``metrics.jsonl``); a study directory given as a run directory; a directory that is not a study's given to ``marllm
study report``; a study without runs; a study file changed since its directory was written; a template field that
no turn can have.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marllm.cli import main
from marllm.config import config_from_dict, load_config
from marllm.config.loading import ConfigError
from marllm.run.run_dir import RunDirError, WrongDirectoryError, check_can_start
from marllm.studies.report import build_study_report
from marllm.studies.spec import Study, expansion_changed, study_from_dict

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "cory_offline.yaml"


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The single line ``marllm`` wrote to stderr."""
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def stray_metrics(path: Path) -> Path:
    """A directory holding a ``metrics.jsonl`` and nothing else of a run."""
    path.mkdir()
    (path / "metrics.jsonl").write_text(json.dumps({"iteration": 0, "llm1/task_reward": 1.0}) + "\n")
    return path


def test_a_directory_given_as_the_config_file_says_it_is_a_directory(tmp_path, capsys):
    assert main(["train", str(tmp_path)]) == 2
    assert one_error_line(capsys) == (
        f"marllm: config error: config file '{tmp_path}' is a directory; give a YAML config file, e.g. "
        "examples/cory_offline.yaml"
    )
    (tmp_path / "config.yaml").write_text("name: run\n")  # a run directory: its config is named
    assert main(["train", str(tmp_path)]) == 2
    assert one_error_line(capsys).endswith(f"is a directory; give a YAML config file, e.g. examples/cory_offline.yaml "
                                           f"(in it: {tmp_path / 'config.yaml'})")
    assert main(["study", str(tmp_path)]) == 2
    assert f"study file '{tmp_path}' is a directory; give a YAML study file" in one_error_line(capsys)


def test_a_stray_metrics_file_does_not_make_a_run(tmp_path, capsys):
    stray = stray_metrics(tmp_path / "stray")
    assert main(["report", str(stray), "--out", str(tmp_path / "out")]) == 2
    assert one_error_line(capsys) == (
        f"marllm: error: {stray} is not a run directory: it has no run.json or config.yaml, which marllm train writes "
        "into every run directory (of a run's files it holds only metrics.jsonl); give a directory marllm train wrote "
        "(its --run-dir)"
    )
    assert not (tmp_path / "out").exists()
    with pytest.raises(RunDirError) as refused:  # nor is training into it taken for a finished run to resume
        check_can_start(stray)
    assert "already holds a run" not in str(refused.value)
    assert f"{stray} holds metrics.jsonl but no run.json: not a run marllm wrote" in str(refused.value)


@pytest.mark.parametrize("option", ["--run-dir", "--resume"])
def test_a_study_directory_is_refused_as_a_run_directory(tmp_path, capsys, option):
    study = tmp_path / "study"
    study.mkdir()
    (study / "study.yaml").write_text("name: s\n")
    (study / "study.json").write_text(json.dumps({"name": "s", "runs": []}))
    assert main(["train", str(CONFIG), option, str(study), "iterations=1"]) == 2
    assert one_error_line(capsys) == (
        f"marllm: error: run directory {study} is a study directory (it holds study.yaml and study.json): marllm study "
        f"trains its runs, in {study / 'runs'}/NAME; train into a run directory of its own (--run-dir)"
    )
    assert sorted(path.name for path in study.iterdir()) == ["study.json", "study.yaml"]


def test_study_report_of_a_directory_that_is_not_a_study_says_what_to_give(tmp_path, capsys):
    give = "give the directory marllm study wrote (its --out, by default runs/studies/NAME)"
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: run\n")
    assert main(["study", "report", str(run)]) == 2
    assert one_error_line(capsys) == (
        f"marllm: error: {run} is not a study directory: marllm study writes study.yaml and study.json there, and it "
        f"has neither (it is a run directory: marllm report {run}); {give}"
    )
    assert main(["study", "report", str(tmp_path / "nowhere")]) == 2
    assert one_error_line(capsys) == f"marllm: error: study directory {tmp_path / 'nowhere'} does not exist; {give}"
    study_file = tmp_path / "s.yaml"
    study_file.write_text("name: s\n")
    assert main(["study", "report", str(study_file)]) == 2
    assert f"is a file, not a directory (to run that study file: marllm study {study_file})" in one_error_line(capsys)
    assert not (run / "report").exists()


def test_a_study_without_runs_says_it_has_none(tmp_path, capsys):
    base = {"name": "s", "base": {"iterations": 2}}
    with pytest.raises(ConfigError, match=r"^study variants is empty \(\{\}\): a study runs each variant once per "
                                          r"seed, so it would have no runs; give one variant or more"):
        study_from_dict({**base, "variants": {}})
    with pytest.raises(ConfigError, match=r"^study seeds is empty \(null\): .* e.g. seeds: \[0\]"):
        study_from_dict({**base, "seeds": None})
    with pytest.raises(ConfigError, match=r"^study s has no runs: variants \[\] × grid \{\} × seeds \[0\]"):
        Study("s", {"iterations": 2}, variants={}).runs()
    (tmp_path / "study.json").write_text(json.dumps({"name": "s", "runs": []}))
    assert main(["study", "report", str(tmp_path)]) == 2
    assert one_error_line(capsys) == (
        f"marllm: error: the study in {tmp_path} has no runs (study.json lists none): nothing to report; run a study "
        f"into it first (marllm study STUDY.yaml --out {tmp_path})"
    )
    with pytest.raises(WrongDirectoryError):
        build_study_report(tmp_path)
    assert not (tmp_path / "report").exists()


def test_a_changed_study_names_the_run_and_the_key_that_changed():
    before = study_from_dict({"name": "s", "base": {"iterations": 2}, "overrides": ["iterations=50"], "seeds": [0]})
    after = study_from_dict({"name": "s", "base": {"iterations": 2}, "overrides": ["iterations=60"], "seeds": [0, 1]})
    assert expansion_changed(Path("out"), "s", before.expansion(), after.expansion()) == (
        "out holds a study whose runs differ from study s's (new runs: base__seed1; run base__seed0 changed "
        "iterations: 50 -> 60); give another --out, or start every run again with --overwrite"
    )
    variants = {"cory": ["ppo.optimiser.learning_rate=1e-3"], "ppo": []}
    changed = {"cory": ["ppo.optimiser.learning_rate=5e-4", "name=cory"], "ppo": []}
    before = study_from_dict({"name": "s", "base": {"iterations": 2}, "variants": variants, "seeds": [0, 1]})
    after = study_from_dict({"name": "s", "base": {"iterations": 2}, "variants": changed, "seeds": [0, 1]})
    changes = "ppo.optimiser.learning_rate: 1e-3 -> 5e-4, name: (absent) -> cory; 1 more run changed"
    assert f"(run cory__seed0 changed {changes})" in (
        expansion_changed(Path("out"), "s", before.expansion(), after.expansion())
    )
    assert "(its study.json does not list runs as marllm study writes them)" in (
        expansion_changed(Path("out"), "s", {"runs": "?"}, after.expansion())
    )


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (
            "observer: 'Improve {query}{pionner}'",
            "env.templates.observer: field {pionner} is not available to role 'observer' (did you mean {pioneer}?); "
            "its template may use {query}, the earlier roles and turns ['pioneer', 'pioneer_1'] and the dataset's "
            "columns",
        ),
        (
            "pioneer: '{query} {observer}'",
            "env.templates.pioneer: field {observer} is not available to role 'pioneer' (observer has not spoken yet); "
            "its template may use {query}, the earlier roles and turns [] and the dataset's columns",
        ),
        ("observer: '{qeury}'", "field {qeury} is not available to role 'observer' (did you mean {query}?)"),
        ("observer: '{query} {'", "env.templates.observer: prompt template '{query} {' is malformed"),
    ],
)
def test_a_template_field_no_turn_can_have_is_a_config_error(template, message, capsys, tmp_path):
    override = f"env.templates.{template.replace(': ', '=', 1)}"
    with pytest.raises(ConfigError) as error:
        load_config(CONFIG, [override])
    assert message in str(error.value)
    assert main(["train", str(CONFIG), "--run-dir", str(tmp_path / "run"), override]) == 2  # before any model loads
    assert one_error_line(capsys).startswith("marllm: config error: config: env.templates.")
    assert not (tmp_path / "run").exists()


def test_a_dataset_column_in_a_template_is_left_to_the_environment():
    data = load_config(CONFIG).to_dict()
    data["env"]["templates"]["observer"] = "{label}: {query}{pioneer}"  # a column of the reviews: known when loaded
    assert config_from_dict(data).env.templates["observer"] == "{label}: {query}{pioneer}"
