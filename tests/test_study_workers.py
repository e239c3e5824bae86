"""A local study's workers: forked (on Linux) from a server that has imported training's modules once, each with the
environment variables the study has when it starts the run."""

from __future__ import annotations

import functools
import json
import os
import sys

import pytest

from .ray_hooks import environment_seen

VARIABLE = "MARLLM_TEST_STUDY_MARK"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked from a server on Linux only")
def test_workers_start_preloaded_from_a_server_apart_with_the_environment_the_study_has_at_each_start(
    tmp_path, monkeypatch, tiny_lm_dir, tiny_classifier_dir, reviews_file
):
    from marllm.studies.execute import LocalExecutor, run_study
    from marllm.studies.spec import load_study

    from .test_study_run import write_base, write_study

    write_base(tmp_path, tiny_lm_dir, tiny_classifier_dir, reviews_file)
    study_file = write_study(tmp_path, {"name": "env", "base": "../configs/base.yaml", "seeds": [0, 1]})
    seen_by = functools.partial(environment_seen, variable=VARIABLE, study_group=os.getpgrp())
    executor = LocalExecutor(2, run_function=seen_by)
    seen = {}
    for mark in ("first", "second"):  # the second study's workers come from the forkserver the first one started
        monkeypatch.setenv(VARIABLE, mark)
        out = tmp_path / mark
        run_study(load_study(study_file), out, executor=executor)
        seen[mark] = [json.loads((out / "runs" / f"base__seed{s}" / "seen.json").read_text()) for s in (0, 1)]
    for mark, runs in seen.items():
        expected = {"value": mark, "preloaded": True, "server_apart": True, "sigterm_default": True}
        assert runs == [expected] * 2, seen
