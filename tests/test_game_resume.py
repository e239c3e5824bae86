"""A game run resumed from its checkpoint goes on as the uninterrupted run does, in every action mode: the learner's
state (its adapter or weights, value head, optimiser, generator), the env's (its generator, role baselines) and, with
legal-move policies, the exploitability measured along the way and the average policy it keeps."""

from __future__ import annotations

import pytest

from marllm.cli import main
from tests.test_durable_runs import lines, without_time
from tests.test_games_cli import needs_openspiel
from tests.test_train import ROOT

CONFIG = str(ROOT / "examples" / "games" / "kuhn_poker_offline.yaml")


@needs_openspiel
@pytest.mark.parametrize("actions", ["generate", "constrained", "score"])
def test_a_resumed_game_run_goes_on_as_the_uninterrupted_one(tmp_path, actions):
    overrides = [
        f"game.actions={actions}",
        "game.batch_size=4",
        "logging.progress=false",
        "ppo.batching.ppo_epochs=2",
    ]
    if actions != "generate":  # exact under legal-move policies; sampled under free text (not worth it here)
        overrides += ["game.exploitability.every=1", "game.illegal_penalty=0.0"]
    uninterrupted, resumed = tmp_path / "uninterrupted", tmp_path / "resumed"
    assert main(["train", CONFIG, "--run-dir", str(uninterrupted), "iterations=4", *overrides]) == 0
    assert main(["train", CONFIG, "--run-dir", str(resumed), "iterations=2", *overrides]) == 0
    assert main(["train", CONFIG, "--resume", str(resumed), "iterations=4", *overrides]) == 0
    expected, got = lines(uninterrupted / "metrics.jsonl"), lines(resumed / "metrics.jsonl")
    assert [row["iteration"] for row in got] == [0, 1, 2, 3]
    assert without_time(got) == without_time(expected)
    if actions != "generate":
        assert all("llm/game/exploitability" in row for row in got)
        assert all("llm/game/exploitability_average" in row for row in got)  # restored: the average of 4 iterates
    assert (resumed / "samples.jsonl").read_text() == (uninterrupted / "samples.jsonl").read_text()
