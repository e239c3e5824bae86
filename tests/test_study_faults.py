"""Faults of a local study's processes: a worker killed by a signal fails only its run, which is tried once more from
its checkpoint while the other runs go on; a study parent killed with SIGKILL leaves no worker behind."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .ray_hooks import dying_attempts, sigkill_self

on_linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: /proc")


@pytest.fixture
def base_file(tmp_path, tiny_lm_dir, tiny_classifier_dir, reviews_file):
    from .test_study_run import write_base

    return write_base(tmp_path, tiny_lm_dir, tiny_classifier_dir, reviews_file)


def gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie that nobody has reaped yet counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@on_linux
def test_a_killed_worker_fails_only_its_run_which_is_retried_once_from_its_checkpoint(
    tmp_path, base_file, monkeypatch, capsys
):
    import marllm.studies.report as report
    from marllm.cli import main
    from marllm.studies import execute

    from .test_study_run import write_study

    monkeypatch.setattr(report, "build_study_report", lambda path: path / "report" / "report.md")
    study_file = write_study(tmp_path, {"name": "faults", "base": "../configs/base.yaml", "seeds": [0, 1, 2]})
    counts = tmp_path / "attempts"
    counts.mkdir()
    deaths = {"base__seed1": 1, "base__seed2": 2}
    kills = functools.partial(dying_attempts, deaths=deaths, count_dir=str(counts), die=sigkill_self)
    monkeypatch.setattr(execute, "LocalExecutor", functools.partial(execute.LocalExecutor, run_function=kills))
    out = tmp_path / "study"
    assert main(["study", str(study_file), "--workers", "2", "--out", str(out)]) == 1
    captured = capsys.readouterr()
    runs = out / "runs"
    info = {name: json.loads((runs / name / "run.json").read_text()) for name in ("base__seed0", "base__seed1")}

    # the healthy run went on, undisturbed
    assert (counts / "base__seed0").read_text().split() == ["start"]
    assert info["base__seed0"]["status"] == "finished" and "resumed_from" not in info["base__seed0"]
    # killed once: tried again, resuming from the checkpoint its first attempt wrote
    assert (counts / "base__seed1").read_text().split() == ["start", "resume"]
    assert info["base__seed1"]["status"] == "finished" and info["base__seed1"]["completed_iterations"] == 2
    assert info["base__seed1"]["resumed_from"] == [1] and not (runs / "base__seed1" / "error.txt").exists()
    assert "run base__seed1: its worker process died (killed by SIGKILL" in captured.err
    # killed in both attempts: recorded failed, saying how its worker died
    assert (counts / "base__seed2").read_text().split() == ["start", "resume"]
    error = (runs / "base__seed2" / "error.txt").read_text().strip()
    assert error.startswith("worker process died in each of 2 attempts, the last killed by SIGKILL"), error
    assert json.loads((runs / "base__seed2" / "run.json").read_text())["status"] == "failed"
    assert f"marllm: run base__seed2 failed: {error}" in captured.err
    assert "study faults: 2 of 3 runs finished, 1 failed" in captured.out


@on_linux
def test_workers_die_with_a_study_killed_by_sigkill_and_checkpoint_first(tmp_path, base_file):
    from .test_durable_runs import SUBPROCESS_ENV
    from .test_study_resume import descendants
    from .test_study_run import write_study
    from .test_train import ROOT

    study_file = write_study(
        tmp_path, {"name": "long", "base": "../configs/base.yaml", "overrides": ["iterations=200"], "seeds": [0]}
    )
    out = tmp_path / "study"
    command = [sys.executable, "-m", "marllm.cli", "study", str(study_file), "--workers", "1", "--out", str(out)]
    with (tmp_path / "stderr.txt").open("w") as stderr:
        process = subprocess.Popen(command, cwd=ROOT, env=SUBPROCESS_ENV, stderr=stderr, text=True)
    metrics = out / "runs" / "base__seed0" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    try:
        while not (metrics.is_file() and metrics.read_text().count("\n") >= 1):
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr.txt").read_text()
            time.sleep(0.05)
        workers = descendants(process.pid)
        assert workers  # the run's worker, and multiprocessing's resource tracker
    finally:
        process.kill()  # SIGKILL: the study can tell its workers nothing
        process.wait(timeout=30)
    deadline = time.monotonic() + 30
    while not all(gone(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in workers if not gone(pid)]
    for pid in left:  # clean up before failing
        os.kill(pid, signal.SIGKILL)
    assert not left, (tmp_path / "stderr.txt").read_text()[-3000:]
    # the worker got SIGTERM: its run wrote a checkpoint and stopped, resumable, as a scheduler's SIGTERM leaves it
    info = json.loads((metrics.parent / "run.json").read_text())
    assert info["status"] == "interrupted" and 1 <= info["checkpoint_iteration"] < 200, info


@on_linux
def test_a_study_run_again_while_old_workers_hold_their_runs_is_refused_naming_them(tmp_path, base_file, capsys):
    """A worker of a killed study checkpoints for up to ~20 s holding its run's lock: a study run again meanwhile is
    refused before it writes or plans anything, naming the run and the holder's PID; once the holder is gone (its lock
    file left behind) the check passes."""
    from marllm.cli import main
    from marllm.studies.processes import check_runs_not_held

    from .test_study_run import write_study
    from .test_train import ROOT

    study_file = write_study(tmp_path, {"name": "held", "base": "../configs/base.yaml", "seeds": [0, 1]})
    out = tmp_path / "study"
    lock = out / "runs" / "base__seed1" / ".marllm.lock"
    lock.parent.mkdir(parents=True)
    code = (
        "import sys, time\nfrom marllm.utils.files import exclusive_lock\n"
        "with exclusive_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(lock)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert main(["study", str(study_file), "--workers", "1", "--out", str(out)]) == 2
        error = capsys.readouterr().err
        assert f"runs/base__seed1 (process {holder.pid})" in error and f"kill {holder.pid}" in error, error
        assert "up to about 20 s" in error and "base__seed0" not in error and error.count("\n") == 1
        assert not (out / "study.json").exists() and not (out / "runs" / "base__seed0").exists()
    finally:
        holder.kill()  # the process this test started
        holder.wait(timeout=10)
    assert lock.is_file()  # a killed holder leaves its file, not its lock
    check_runs_not_held(out, ["runs/base__seed0", "runs/base__seed1"])


def test_a_worker_ends_itself_once_its_lifeline_ends():
    """A lifeline whose writing end is closed (the study's process is gone, even before the worker started watching)
    has the worker send itself SIGTERM; one whose writing end is still held leaves it be."""
    from .test_train import ROOT

    code = (
        "import time; from multiprocessing import Pipe; from marllm.studies.processes import die_with_study\n"
        "lifeline, study = Pipe(duplex=False)\n{ended}\ndie_with_study(lifeline)\ntime.sleep({wait})\nprint('on')"
    )
    ended = subprocess.run(
        [sys.executable, "-c", code.format(ended="study.close()", wait=30)], cwd=ROOT, capture_output=True, timeout=60
    )
    assert ended.returncode == -signal.SIGTERM and not ended.stdout, ended.stderr
    held = subprocess.run(
        [sys.executable, "-c", code.format(ended="", wait=1)], cwd=ROOT, capture_output=True, timeout=60
    )
    assert held.returncode == 0 and held.stdout.strip() == b"on", held.stderr


def test_how_a_worker_ended_is_said_plainly():
    from marllm.studies.processes import exit_description

    assert exit_description(-signal.SIGKILL).startswith("killed by SIGKILL (as the out-of-memory killer")
    assert exit_description(-signal.SIGSEGV) == "killed by SIGSEGV"
    assert exit_description(3) == "exited with status 3 without a result"
