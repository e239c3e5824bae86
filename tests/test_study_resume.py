"""A study whose processes were killed mid-run, run again, resumes the run to the metrics of a study never
interrupted: the study-level counterpart of tests/test_durable_runs.py's kill-and-resume test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marllm.cli import main
from tests.test_durable_runs import SUBPROCESS_ENV, lines, without_time
from tests.test_study_run import write_base, write_study
from tests.test_train import ROOT

ITERATIONS, CHECKPOINT_EVERY, KILL_AFTER = 5, 2, 3  # killed once 3 iterations are logged: the checkpoint is at 2


def descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="finds the study's worker processes in /proc")
def test_a_killed_study_resumes_its_run_to_the_metrics_of_an_uninterrupted_study(
    tmp_path, tiny_lm_dir, tiny_classifier_dir, reviews_file, monkeypatch
):
    import marllm.studies.report as report

    monkeypatch.setattr(report, "build_study_report", lambda path: path / "report" / "report.md")
    write_base(tmp_path, tiny_lm_dir, tiny_classifier_dir, reviews_file)
    overrides = [f"iterations={ITERATIONS}", f"logging.checkpoint_every={CHECKPOINT_EVERY}", "logging.eval_queries=0"]
    study_file = write_study(tmp_path, {"name": "resume", "base": "../configs/base.yaml", "overrides": overrides})

    def study(out: Path) -> list[str]:
        return ["study", str(study_file), "--workers", "1", "--out", str(out)]

    whole = tmp_path / "whole"
    assert main(study(whole)) == 0
    (name,) = [run["name"] for run in json.loads((whole / "study.json").read_text())["runs"]]

    # The same study in another directory, killed (SIGKILL: the study and its worker, which cannot record anything)
    # once its run has logged KILL_AFTER iterations, after its checkpoint at CHECKPOINT_EVERY.
    out = tmp_path / "killed"
    run_dir = out / "runs" / name
    cli = "import sys; from marllm.cli import main; sys.exit(main(sys.argv[1:]))"  # `marllm study ...`
    command = [sys.executable, "-c", cli, *study(out)]
    process = subprocess.Popen(command, cwd=ROOT, env=SUBPROCESS_ENV, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    try:
        while process.poll() is None and time.monotonic() < deadline:
            metrics = run_dir / "metrics.jsonl"
            if metrics.is_file() and metrics.read_text().count("\n") >= KILL_AFTER:
                for pid in [*descendants(process.pid), process.pid]:
                    os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.01)
    finally:
        stderr = process.communicate(timeout=60)[1]
    assert process.returncode == -signal.SIGKILL, stderr[-3000:]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "running"  # killed: nobody could record anything else
    logged = len(lines(run_dir / "metrics.jsonl"))
    assert KILL_AFTER <= logged < ITERATIONS

    assert main(study(out)) == 0  # the run resumes from its latest checkpoint, cutting its logs back to it
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished" and info["completed_iterations"] == ITERATIONS
    assert len(info["resumed_from"]) == 1 and CHECKPOINT_EVERY <= info["resumed_from"][0] <= logged
    uninterrupted = whole / "runs" / name
    assert without_time(lines(run_dir / "metrics.jsonl")) == without_time(lines(uninterrupted / "metrics.jsonl"))
    assert (run_dir / "samples.jsonl").read_text() == (uninterrupted / "samples.jsonl").read_text()
