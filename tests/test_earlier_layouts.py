"""Config layouts before 1.0: marllm reads one layout (``CONFIG_LAYOUT``) and converts none. A key written where an
earlier layout had it is answered with its place today; a run directory records its layout, and a run of another
layout is refused in one line when its config is read or the run resumed."""

from __future__ import annotations

import json

import pytest
import yaml

from marllm.cli import main
from marllm.config import CONFIG_LAYOUT, ConfigError, load_config
from tests.test_durable_runs import cory_data
from tests.test_train import ROOT

KUHN = ROOT / "examples" / "games" / "kuhn_poker_offline.yaml"


def _written(path, data) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_a_key_where_an_earlier_layout_had_it_is_answered_with_its_place(tmp_path):
    data = yaml.safe_load(KUHN.read_text())
    data["game"]["every"] = 3  # game.exploitability.every today
    with pytest.raises(ConfigError, match=r"'every' is 'game.exploitability.every': write it there"):
        load_config(_written(tmp_path / "old.yaml", data))
    data = yaml.safe_load(KUHN.read_text())
    data["game"]["actions"] = {"mode": "score"}  # layout 2's
    with pytest.raises(ConfigError, match=r"game.actions: unknown action mode 'mode'"):
        load_config(_written(tmp_path / "old.yaml", data))
    with pytest.raises(SystemExit):  # no command converts earlier layouts
        main(["upgrade", str(KUHN)])


def test_a_run_records_its_layout_and_a_run_of_another_is_refused_in_one_line(
    tmp_path, tiny_lm_dir, tiny_classifier_dir, reviews_file, capsys
):
    data = cory_data(tiny_lm_dir, tiny_classifier_dir, reviews_file, iterations=1)
    run_dir = tmp_path / "run"
    assert main(["train", _written(tmp_path / "config.yaml", data), "--run-dir", str(run_dir)]) == 0
    info = json.loads((run_dir / "run.json").read_text())
    assert info["config_layout"] == CONFIG_LAYOUT and info["marllm_version"]
    recorded = run_dir / "config.yaml"
    assert load_config(recorded).to_dict()["iterations"] == 1
    (run_dir / "run.json").write_text(json.dumps({**info, "config_layout": CONFIG_LAYOUT - 1}))
    line = rf"{run_dir} was written in config layout {CONFIG_LAYOUT - 1} and this marllm reads layout {CONFIG_LAYOUT}"
    with pytest.raises(ConfigError, match=line):
        load_config(recorded)
    capsys.readouterr()
    assert main(["train", str(tmp_path / "config.yaml"), "iterations=2", "--resume", str(run_dir)]) != 0
    err = capsys.readouterr().err
    assert f"config layout {CONFIG_LAYOUT - 1}" in err and "Traceback" not in err
