"""Messages whose advice was wrong (issue 35, item 5): each now says what was wrong and a next step that works, in the
CLI's words (``--overwrite``, not ``overwrite=True``), on one line."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings

import pytest
import torch
import yaml

from marllm.cli import main
from marllm.config import config_from_dict
from marllm.games.env.factory import load_openspiel_game
from marllm.models.generation import PromptTooLongError, check_prompt_lengths
from marllm.run.checkpoint import CHECKPOINTS_DIR
from marllm.run.run_dir import RunDirError
from marllm.run.train import train
from tests.test_durable_runs import SUBPROCESS_ENV, cory_data
from tests.test_games_env import needs_openspiel
from tests.test_resume_faults import flip_last_byte
from tests.test_train import ROOT

CONFIG = ROOT / "examples" / "cory_offline.yaml"


@pytest.fixture
def cory_yaml(tiny_lm_dir, tiny_classifier_dir, reviews_file, tmp_path):
    def make(**top):
        path = tmp_path / "cory.yaml"
        path.write_text(yaml.safe_dump(cory_data(tiny_lm_dir, tiny_classifier_dir, reviews_file, **top)))
        return path

    return make


def marllm_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("marllm")]


def test_resume_of_a_directory_that_does_not_exist_says_so(tmp_path, capsys):
    nowhere = tmp_path / "nowhere"
    assert main(["train", str(CONFIG), "--resume", str(nowhere), "iterations=1"]) == 1
    assert marllm_lines(capsys) == [
        f"marllm: error: nothing to resume: run directory {nowhere} does not exist; give the directory a run was "
        "trained into (--resume RUN_DIR, or its config's run_dir), or start a new run there without --resume"
    ]
    assert not nowhere.exists()


@pytest.mark.parametrize("command", ["train", "eval"])
def test_no_arguments_names_the_config_alone_as_required(command, capsys):
    with pytest.raises(SystemExit) as stopped:
        main([command])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"marllm {command}: error: the following arguments are required: config"
    )


def test_both_kept_checkpoints_damaged_names_both_and_no_second_refusal(cory_yaml, tmp_path):
    config = config_from_dict(yaml.safe_load(cory_yaml(iterations=2).read_text()))
    run_dir = tmp_path / "run"
    train(config, run_dir)
    kept = sorted((run_dir / CHECKPOINTS_DIR).iterdir())
    assert [path.name for path in kept] == ["iteration-000001", "iteration-000002"]
    flip_last_byte(kept[1] / "env.safetensors")  # changed: found by its sha256
    (kept[0] / "env.safetensors").write_bytes(b"cut")  # cut short: found by its size
    config.iterations = 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, in the error
        with pytest.raises(RunDirError) as refused:
            train(config, run_dir, resume=True)
    message = str(refused.value)
    assert message.startswith(f"nothing to resume in {run_dir}: checkpoint {kept[1]} is damaged: env.safetensors "
                              "does not match its sha256")
    assert f"checkpoint {kept[0]} is damaged: env.safetensors has 3 bytes" in message
    assert message.endswith("it keeps no other checkpoint: start it again with --overwrite")
    assert "overwrite=True" not in message and "move" not in message


def test_cli_warnings_are_one_line_without_a_source_line(tmp_path):
    script = (
        "import sys, warnings\n"
        "import marllm.cli as cli\n"
        "def handler(args):\n"
        "    warnings.warn('something to know\\nacross two lines', UserWarning)\n"
        "    warnings.warn('a library speaks', FutureWarning)\n"
        "    return 0\n"
        "cli.train_command = handler\n"
        "sys.exit(cli.main(['train', 'any.yaml']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=SUBPROCESS_ENV, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "marllm: warning: something to know across two lines"
    assert re.fullmatch(r"marllm: warning: FutureWarning: a library speaks \(<string>:\d+\)", lines[1])
    assert len(lines) == 2


@needs_openspiel
def test_a_misspelled_openspiel_name_is_one_line_without_the_list_of_games(capfd):
    with pytest.raises(ValueError) as refused:
        load_openspiel_game("openspiel:kuhn_pokr")
    assert str(refused.value).startswith("OpenSpiel has no game 'kuhn_pokr'; close names: ['kuhn_poker'")
    out, err = capfd.readouterr()
    assert "2048" not in out + err and "Available games" not in out + err


def test_a_prompt_too_long_names_templates_and_game_state_not_only_the_query():
    with pytest.raises(PromptTooLongError) as refused:
        check_prompt_lengths(["a long board"], torch.ones(1, 30, dtype=torch.long), 8, 32, "llm")
    message = str(refused.value)
    assert "game.templates" in message and "a game's state" in message and "longer context" in message


def test_eval_checkpoint_takes_a_run_directory_of_a_full_model_run(cory_yaml, tmp_path, capsys):
    config_path = cory_yaml(iterations=1, logging__save_checkpoint=True)
    run_dir = tmp_path / "run"
    assert main(["train", str(config_path), "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()
    assert main(["eval", str(config_path), "--checkpoint", str(run_dir), "--limit", "2", "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "run/llm1" in out and "run/llm2" in out and "adapter_config" not in out
    (tmp_path / "unexported").mkdir()
    (tmp_path / "unexported" / "training_state").mkdir()
    assert main(["eval", str(config_path), "--checkpoint", str(tmp_path / "unexported")]) == 1
    assert marllm_lines(capsys)[-1].startswith(
        f"marllm: error: run directory '{tmp_path / 'unexported'}' has no saved learner (no checkpoints/)"
    )
