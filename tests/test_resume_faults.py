"""Faults around checkpoints: a resume from a damaged checkpoint changes nothing and says what can be done; a full
disk while checkpointing is one line, and the run's record says why it failed."""

from __future__ import annotations

import errno
import json
import os
import re
import warnings
from pathlib import Path

import pytest
import yaml
from safetensors import SafetensorError

import marllm.run.checkpoint as checkpoint_module
from marllm.cli import main
from marllm.config import config_from_dict
from marllm.run.checkpoint import CHECKPOINTS_DIR
from marllm.run.run_dir import RunDirError, read_run_state
from marllm.run.train import train
from tests.test_durable_runs import cory_data


@pytest.fixture
def cory_yaml(tiny_lm_dir, tiny_classifier_dir, reviews_file, tmp_path):
    """Write the tiny CORY config (a checkpoint every iteration) with ``top`` changes; return its path."""

    def make(**top) -> Path:
        path = tmp_path / "cory.yaml"
        path.write_text(yaml.safe_dump(cory_data(tiny_lm_dir, tiny_classifier_dir, reviews_file, **top)))
        return path

    return make


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file under ``run_dir`` with its bytes."""
    return {path.relative_to(run_dir).as_posix(): path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}


def flip_last_byte(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[-1] ^= 0xFF
    file.write_bytes(bytes(data))


def errors(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("marllm:")]


def test_a_resume_skips_a_changed_checkpoint_as_a_cut_short_one_with_a_warning(cory_yaml, tmp_path, capsys):
    config_path, run_dir = cory_yaml(iterations=3), tmp_path / "run"
    assert main(["train", str(config_path), "--run-dir", str(run_dir)]) == 0
    damaged = run_dir / CHECKPOINTS_DIR / "iteration-000003"
    flip_last_byte(damaged / "learner-llm1.safetensors")
    capsys.readouterr()
    with pytest.warns(RuntimeWarning, match=rf"skipping a damaged checkpoint: checkpoint {re.escape(str(damaged))} "
                                            r"is damaged: learner-llm1.safetensors does not match its sha256"):
        assert main(["train", str(config_path), "--resume", str(run_dir), "iterations=5"]) == 0
    info = json.loads((run_dir / "run.json").read_text())
    assert (info["status"], info["completed_iterations"], info["resumed_from"]) == ("finished", 5, [2])


def test_a_damaged_only_checkpoint_is_named_and_the_run_left_as_it_was(cory_yaml, tmp_path):
    config = config_from_dict(yaml.safe_load(cory_yaml(iterations=3, logging__keep_checkpoints=1).read_text()))
    run_dir = tmp_path / "run"
    train(config, run_dir)
    only = run_dir / CHECKPOINTS_DIR / "iteration-000003"
    flip_last_byte(only / "env.safetensors")
    before = snapshot(run_dir)
    config.iterations = 5
    message = "nothing to resume in .*env.safetensors does not match its sha256.*keeps no other checkpoint.*--overwrite"
    with pytest.raises(RunDirError, match=message):  # a changed file is found before anything loads, as a cut one
        train(config, run_dir, resume=True)
    assert snapshot(run_dir) == before
    (only / "env.safetensors").write_bytes(b"cut short")  # truncated: found before any model is loaded
    before = snapshot(run_dir)
    message = (
        rf"nothing to resume in {re.escape(str(run_dir))}: checkpoint {re.escape(str(only))} is damaged: "
        r"env.safetensors has 9 bytes, the manifest says \d+; it keeps no other checkpoint: start it again with "
        r"--overwrite"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, in the error
        with pytest.raises(RunDirError, match=message):
            train(config, run_dir, resume=True)
    assert snapshot(run_dir) == before


@pytest.mark.parametrize("raised", [OSError, SafetensorError])
def test_a_full_disk_while_checkpointing_fails_the_run_with_one_line(cory_yaml, monkeypatch, tmp_path, capsys, raised):
    real = checkpoint_module.write_tensors
    full = os.strerror(errno.ENOSPC)

    def write_tensors(path: Path, tensors: dict) -> None:
        if ".tmp-iteration-000002" not in str(path):  # the second checkpoint finds the disk full
            return real(path, tensors)
        path.write_bytes(b"the part that fitted")
        if raised is OSError:
            raise OSError(errno.ENOSPC, full, str(path))
        serializing = f'IoError(Os {{ code: 28, kind: StorageFull, message: "{full}" }})'
        raise SafetensorError(f"Error while serializing: {serializing}")

    monkeypatch.setattr(checkpoint_module, "write_tensors", write_tensors)
    config_path, run_dir = cory_yaml(iterations=4), tmp_path / "run"
    root = run_dir / CHECKPOINTS_DIR
    assert main(["train", str(config_path), "--run-dir", str(run_dir)]) == 1
    err = errors(capsys)
    pattern = (
        rf"marllm: error: cannot write checkpoint {re.escape(str(root / 'iteration-000002'))}: the disk is full "
        r"\([\d.]+ [kMGT]?B free on its file system, a checkpoint takes about [\d.]+ [kM]?B \(iteration-000001 "
        rf"does\)\); free some space \({raised.__name__}: .*{full}.*\)"
    )
    assert re.fullmatch(pattern, err[0]), err[0]
    assert err[1:] == [
        f"marllm: the run's latest checkpoint (iteration 1) stays; resume with: marllm train {config_path} --resume "
        f"{run_dir}"
    ]
    info = json.loads((run_dir / "run.json").read_text())
    assert (info["status"], info["completed_iterations"], info["checkpoint_iteration"]) == ("failed", 2, 1)
    assert info["error"].startswith(f"CheckpointError: cannot write checkpoint {root / 'iteration-000002'}: the disk")
    assert sorted(path.name for path in root.iterdir()) == ["iteration-000001"]  # the partial save is gone
    monkeypatch.undo()
    assert main(["train", str(config_path), "--resume", str(run_dir)]) == 0
    assert read_run_state(run_dir).describe() == "4 of 4 iterations, finished"
