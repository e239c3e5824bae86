"""`marllm train --nproc N`: a config trained on two data-parallel ranks, whole or sharded, from the command line, and
resumed on one process; a batch that does not split refused before any rank starts. (Apart from
tests/test_data_parallel.py, so that a second worker of `make test` can run these beside its ranks.)"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import yaml
from transformers import AutoModelForCausalLM

from tests.test_data_parallel import ENV, ROOT
from tests.test_train import merge_settings, tiny_overrides


@pytest.mark.parametrize("fsdp", [False, True], ids=["replicated", "sharded"])
def test_cli_trains_cory_on_two_ranks_and_resumes_on_one(
    tmp_path, tiny_lm_dir, tiny_classifier_dir, reviews_file, fsdp
):
    data = yaml.safe_load((ROOT / "examples" / "cory_imdb.yaml").read_text())
    merge_settings(data, tiny_overrides(tiny_lm_dir, tiny_classifier_dir, reviews_file))
    data["logging"].update({"checkpoint_every": 1, "samples_per_iteration": 1, "save_checkpoint": fsdp})
    data["model"]["fsdp"] = fsdp
    config = tmp_path / "cory_tiny.yaml"
    config.write_text(yaml.safe_dump(data))
    run_dir = tmp_path / "run"
    train = [sys.executable, "-m", "marllm.cli", "train", str(config), "--run-dir", str(run_dir)]
    completed = subprocess.run(
        [*train, "iterations=2", "--nproc", "2"], capture_output=True, text=True, cwd=ROOT, timeout=300, env=ENV
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert completed.stdout.count("run written to") == 1  # rank 0 speaks for the run
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [0, 1]  # one line per iteration: rank 0 alone writes
    # KL >= 0 up to the rounding between generate's KV-cached forwards (the rollout's) and the reference's forward
    assert all(np.isfinite(m["llm1/kl"]) and m["llm1/kl"] >= -1e-5 for m in metrics)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 2  # per iteration, one dialogue of each learner
    run_info = json.loads((run_dir / "run.json").read_text())
    assert run_info["status"] == "finished" and run_info["checkpoint_iteration"] == 2
    # The end-of-run evaluation ran once (sharded, every rank joined its forwards) and was written once.
    evaluated = [json.loads(line) for line in (run_dir / "eval_samples.jsonl").read_text().splitlines()]
    assert len(evaluated) == 3 * 3  # the base and each learner, on 3 queries
    if fsdp:  # the export is whole: it loads on one process
        for learner_id in ("llm1", "llm2"):
            exported = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / learner_id / "policy")
            assert exported.num_parameters() == AutoModelForCausalLM.from_pretrained(tiny_lm_dir).num_parameters()
    # The checkpoint of two ranks resumes on one process (a checkpoint does not depend on the number of ranks, nor
    # on whether they sharded the models).
    completed = subprocess.run(
        [*train, "iterations=3", "model.fsdp=false", "--resume"],
        capture_output=True, text=True, cwd=ROOT, timeout=300, env=ENV,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [0, 1, 2]
    assert json.loads((run_dir / "run.json").read_text())["resumed_from"] == [2]


def test_nproc_refuses_a_batch_that_does_not_split(tmp_path, tiny_lm_dir, tiny_classifier_dir, reviews_file):
    data = yaml.safe_load((ROOT / "examples" / "cory_imdb.yaml").read_text())
    merge_settings(data, tiny_overrides(tiny_lm_dir, tiny_classifier_dir, reviews_file))
    config = tmp_path / "cory_tiny.yaml"
    config.write_text(yaml.safe_dump(data))
    completed = subprocess.run(
        [sys.executable, "-m", "marllm.cli", "train", str(config), "--nproc", "3", "--run-dir", str(tmp_path / "r")],
        capture_output=True, text=True, cwd=ROOT, timeout=120, env=ENV,
    )
    assert completed.returncode == 2
    assert "env.batch_size on 3 processes" in completed.stderr and "multiple of 3" in completed.stderr
    assert not (tmp_path / "r").exists()
