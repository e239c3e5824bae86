"""A setting neither training nor evaluation would read is refused, naming what reads it: a setting of an opponent
that watches a learner with no seat of that opponent, the average policy's weights with nothing measured, a sampling
setting under ``score`` (no token is sampled). What ``marllm eval`` reads (its fixed opponents' settings,
``exploitability_samples``) passes, as do defaults and the answer budgets under modes that do not read them (one
config switches mode by one override)."""

from __future__ import annotations

from pathlib import Path

import pytest

from marllm.config import ConfigError, load_config

KUHN = str(Path(__file__).resolve().parents[1] / "examples" / "games" / "kuhn_poker_offline.yaml")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["game.opponents.pool_size=2"], "pool_size: 2 is a setting of a snapshot_pool seat, and game.seats"),
        (["game.opponents.pool_every=2"], "pool_every: 2 is a setting of a snapshot_pool seat"),
        (["game.opponents.best_response_every=2"], "best_response_every: 2 is a setting of a best_response seat"),
        (["game.exploitability.average=linear"], "policy_average: linear weighs the policies measured every"),
        (["game.actions=score", "generation.temperature=0.5"], "generation.temperature: 0.5 would be ignored"),
        (["game.actions=score", "generation.top_k=5"], "generation.top_k: 5 would be ignored"),
        (["game.actions=score", "generation.logprobs_from=sampling"], "logprobs_from: sampling would be ignored"),
        (["game.actions=score", "generation.repetition_penalty=1.1"], "repetition_penalty: 1.1 would be ignored"),
    ],
)
def test_a_setting_nothing_reads_is_refused_naming_what_reads_it(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(KUHN, overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        ["game.seats=[llm,{snapshot_pool: {learner: llm}}]", "game.opponents.pool_size=2"],
        ["game.opponents.cfr_iterations=5"],  # marllm eval plays a cfr opponent, whatever the seats
        ["game.measurement.exploitability_samples=8"],  # marllm eval --exploitability tabulates with it
        ["game.exploitability.every=2", "game.exploitability.average=linear"],
        ["game.actions=score", "game.exploitability.every=3"],
        ["game.actions=score", "generation.min_new_tokens=1", "generation.max_new_tokens=3"],
        ["game.actions=constrained", "generation.temperature=0.5"],  # constrained moves are sampled
        ["game.opponents.cfr_iterations=100", "game.actions.normalization=token"],  # defaults, as a run records them
    ],
)
def test_what_the_run_reads_and_the_defaults_pass(overrides):
    load_config(KUHN, overrides)


@pytest.mark.parametrize(
    ("overrides", "refusal"),
    [
        (["game.actions=constrained", "game.parser=last"], r"game.parser: last would be ignored"),
        (["game.actions=score", "game.parser=last"], r"game.parser: last would be ignored"),
        (
            ["game.actions=score", "game.measurement.exploitability_samples=8"],
            r"exploitability_samples: 8 would be ignored",
        ),
        (
            ["game.actions=constrained", "game.measurement.exploitability_samples=8"],
            r"exploitability_samples: 8 would be ignored",
        ),
        (
            ["model.dtype=bfloat16", "ppo.compute.autocast_dtype=bfloat16"],
            r"autocast_dtype: bfloat16 would change nothing",
        ),
    ],
)
def test_a_setting_the_mode_or_the_model_never_meets_is_refused(overrides, refusal):
    with pytest.raises(ConfigError, match=refusal):
        load_config(KUHN, overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        ["game.parser=last"],
        ["game.measurement.exploitability_samples=8"],
        ["game.actions=think", "game.measurement.exploitability_samples=8"],
    ],
)
def test_the_same_settings_pass_where_they_are_read(overrides):
    load_config(KUHN, overrides)
