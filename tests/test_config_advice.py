"""The config's advice leads somewhere: an empty section is its defaults, and a key written in the wrong section is
answered with the section it belongs to, before any near spelling of the section's own keys."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from marllm.config import ConfigError, load_config

KUHN = Path(__file__).resolve().parents[1] / "examples" / "games" / "kuhn_poker_offline.yaml"


@pytest.mark.parametrize("empty", [None, {}])
def test_an_empty_section_means_its_defaults(tmp_path, empty):
    data = yaml.safe_load(KUHN.read_text())
    data["game"]["actions"] = empty  # `actions:` with nothing under it reads as null
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_config(path).game.actions == load_config(KUHN).game.actions
    assert load_config(KUHN, ["game.actions=null"]).game.actions.mode == "generate"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("game.every=1", "'every' is 'game.exploitability.every'"),
        ("game.average=linear", "'average' is 'game.exploitability.average': write it there"),
        ("actions.mode=score", "'actions' is 'game.actions': write it there"),
        ("ppo.mini_batch=2", "did you mean"),  # no such key anywhere: the near spelling
    ],
)
def test_a_key_in_the_wrong_section_is_answered_with_its_section(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(KUHN, [override])
