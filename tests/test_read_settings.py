"""A setting no part would read has nowhere to be written: an opponent's settings live with its seat, an action mode's
with the mode, the average policy's weights with the exploitability measured. Writing one where it is not read is an
unknown key, or refused by the part's own check; the one rule spanning two parts (sampling settings under ``score``,
which samples no token) is refused where the config joins them. What each part reads passes, as do defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from marllm.config import ConfigError, load_config

KUHN = str(Path(__file__).resolve().parents[1] / "examples" / "games" / "kuhn_poker_offline.yaml")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # the probes of earlier rounds: an opponent's settings without its seat, measurement settings with nothing
        # measured, a mode's setting under another mode: each has no place to be written
        (["game.opponents.pool_size=2"], r"unknown config key 'game.opponents'"),
        (["game.measurement.policy_average=linear"], r"unknown config key 'game.measurement'"),
        (["game.seats=[llm, {random: {size: 2}}]"], r"the opponent random has no settings"),
        (["game.seats=[llm, {cfr: {pool_size: 2}}]"], r"unknown config key 'game.seats\[1\].cfr.pool_size'"),
        (["game.actions={constrained: {parser: last}}"], r"constrained has no settings"),
        (["game.actions={score: {parser: last}}"], r"unknown config key 'game.actions.score.parser'"),
        (["game.actions={score: {exploitability_samples: 8}}"], r"'game.actions.score.exploitability_samples'"),
        (["game.parser=last"], r"unknown config key 'game.parser'"),
        (["game.seats=[llm, snapshot_pool:llm]"], r"write \{snapshot_pool: \{learner: llm\}\}"),
        # the rule spanning the mode and the generation section
        (["game.actions=score", "generation.temperature=0.5"], "generation.temperature: 0.5 would be ignored"),
        (["game.actions=score", "generation.top_k=5"], "generation.top_k: 5 would be ignored"),
        (["game.actions=score", "generation.logprobs_from=sampling"], "logprobs_from: sampling would be ignored"),
        (["game.actions=score", "generation.repetition_penalty=1.1"], "repetition_penalty: 1.1 would be ignored"),
        (["model.dtype=bfloat16", "ppo.compute.autocast_dtype=bfloat16"], r"autocast_dtype: bfloat16 would change"),
    ],
)
def test_a_setting_no_part_reads_cannot_be_written(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(KUHN, overrides)


@pytest.mark.parametrize(
    ("overrides", "read", "expected"),
    [
        (["game.seats=[llm, {snapshot_pool: {learner: llm, size: 2}}]"], lambda c: c.game.seats[1].settings.size, 2),
        (["game.seats=[llm, {cfr: {iterations: 5}}]"], lambda c: c.game.seats[1].settings.iterations, 5),
        (["game.actions={generate: {exploitability_samples: 8}}"], lambda c: c.game.actions.exploitability_samples, 8),
        (["game.actions={think: {exploitability_samples: 8}}"], lambda c: c.game.actions.exploitability_samples, 8),
        (["game.actions={generate: {parser: last}}"], lambda c: c.game.parser, "last"),
        (["game.exploitability={every: 2, average: linear}"], lambda c: c.game.exploitability.average, "linear"),
        (["game.actions={score: {normalization: word}}"], lambda c: c.game.actions.normalization, "word"),
        (["game.actions=score", "generation.max_new_tokens=3"], lambda c: c.generation.max_new_tokens, 3),
        (["game.actions=constrained", "generation.temperature=0.5"], lambda c: c.generation.temperature, 0.5),
    ],
)
def test_each_part_reads_its_own_settings(overrides, read, expected):
    assert read(load_config(KUHN, overrides)) == expected


def test_a_seat_and_a_mode_are_written_back_as_they_were_read(tmp_path):
    """The run's ``config.yaml`` records each part with its settings, and reads back to the same config."""
    import yaml

    from marllm.config import config_from_dict

    overrides = ["game.seats=[llm, {cfr: {iterations: 5}}]", "game.actions={score: {normalization: word}}"]
    config = load_config(KUHN, overrides)
    data = config.to_dict()
    assert data["game"]["seats"] == ["llm", {"cfr": {"iterations": 5}}]
    assert data["game"]["actions"] == {"score": {"normalization": "word"}}
    again = config_from_dict(yaml.safe_load(yaml.safe_dump(data)))
    assert again.to_dict() == data
