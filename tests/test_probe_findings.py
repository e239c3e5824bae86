"""Defects a newcomer's probes found, each pinned: what a short run's final values averaged, ``lambda_trend.py``
on a directory that is not a study, config keys a mode would silently ignore, advice that named no setting, OpenSpiel's
list of games printed before eval's own line, and PyYAML's parser text for an unquoted override."""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from marllm.cli import main as marllm_main
from marllm.config import ConfigError, config_from_dict, load_config
from marllm.config.loading import apply_overrides
from marllm.studies.aggregate import last_iterations_label
from marllm.studies.report import build_study_report
from tests.test_games_config import game_config

ROOT = Path(__file__).resolve().parents[1]
TICTACTOE = str(ROOT / "examples" / "games" / "tictactoe_offline.yaml")
needs_openspiel = pytest.mark.skipif(importlib.util.find_spec("pyspiel") is None, reason="needs open_spiel")


def _run_lambda_trend(monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
    """``python scripts/lambda_trend.py ARGS``, in this process."""
    monkeypatch.setattr(sys, "argv", ["lambda_trend.py", *args])
    load_lambda_trend().main()


def load_lambda_trend() -> ModuleType:
    """``scripts/lambda_trend.py``, imported as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("lambda_trend", ROOT / "scripts" / "lambda_trend.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- 1. what "last k iterations" averaged, when a run is shorter ------------------------------------------------


def _dilemma_study(root: Path, iterations: int) -> Path:
    """A study of λ over a two-seat dilemma: two runs (λ = 0 and 1) of ``iterations`` logged iterations."""
    for weight in (0.0, 1.0):
        run = root / "runs" / f"lambda_{weight}"
        run.mkdir(parents=True)
        config = {"agents": {"reward_coefficients": weight}, "game": {"seats": ["llm", "llm"]}}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        rows = [
            {"iteration": i, "llm/game/cooperation_rate": 0.1 * i + weight, "llm/game/payoff": float(i)}
            for i in range(iterations)
        ]
        (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root


def test_lambda_trend_says_how_many_iterations_it_averaged(tmp_path, capsys, monkeypatch):
    trend = load_lambda_trend()
    study = _dilemma_study(tmp_path, iterations=3)
    _run_lambda_trend(monkeypatch, str(study))  # --last 5 by default, on runs of 3 iterations
    out = capsys.readouterr().out
    assert "cooperation_rate (last 3 iterations (of 3: the runs are shorter than the 5 asked)," in out
    assert "last 5 iterations" not in out
    summary = trend.summarise(study, 5)
    assert summary["averaged_iterations"] == {"min": 3, "max": 3}
    assert summary["cooperation_rate"]["per_lambda"]["1.0"]["mean"] == pytest.approx(1.1)  # (1.0 + 1.1 + 1.2) / 3
    _run_lambda_trend(monkeypatch, str(study), "--last", "2")
    out = capsys.readouterr().out
    assert "cooperation_rate (last 2 iterations, mean" in out
    assert trend.summarise(study, 2)["cooperation_rate"]["per_lambda"]["1.0"]["mean"] == pytest.approx(1.15)


def test_lambda_trend_reads_any_game_metric_and_shows_a_dialogue_per_lambda(tmp_path, capsys, monkeypatch):
    """A talking game's study: its own measures (``<learner>/game/<name>``) and the KL (``<learner>/kl``), an
    iteration without a measure read as missing, and the last turn of a run's last iteration for each λ asked."""
    trend = load_lambda_trend()
    study = _dilemma_study(tmp_path, iterations=2)
    for weight in (0.0, 1.0):
        run = study / "runs" / f"lambda_{weight}"
        rows = [{"iteration": 0, "llm/game/agreement_rate": weight, "llm/kl": 2.0}, {"iteration": 1, "llm/kl": 4.0}]
        (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        samples = [
            {"iteration": 1, "learner": "llm", "role": "bob", "turn": turn, "prompt": f"P{turn}:", "response": " R"}
            for turn in (1, 2)
        ]
        (run / "samples.jsonl").write_text("".join(json.dumps(row) + "\n" for row in samples))
    summary = trend.summarise(study, 2, ("agreement_rate", "kl"))
    assert (
        summary["agreement_rate"]["per_lambda"]["1.0"]["mean"] == 1.0
        and summary["kl"]["per_lambda"]["0.0"]["mean"] == 3.0
    )
    _run_lambda_trend(monkeypatch, str(study), "--metrics", "agreement_rate,kl", "--dialogues", "0,1")
    out = capsys.readouterr().out
    assert "λ = 1.0: lambda_1.0, iteration 1, llm (bob)\nP2: R" in out
    _run_lambda_trend(monkeypatch, str(study), "--metrics", "kl", "--dialogues", "-0,1")  # a leading minus
    assert "λ = 0.0: lambda_0.0" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        _run_lambda_trend(monkeypatch, str(study), "--metrics", "kl", "--dialogues", "0.5")
    assert "no run has λ = 0.5" in capsys.readouterr().err


def test_lambda_trend_gives_each_seeds_value_and_the_start(tmp_path, capsys, monkeypatch):
    """Per λ, every seed's value in seed order (10 after 2) and the seeds' mean at the first iteration."""
    trend = load_lambda_trend()
    for seed in (10, 2):
        run = tmp_path / "runs" / f"seed{seed}"
        run.mkdir(parents=True)
        config = {"seed": seed, "agents": {"reward_coefficients": 1.0}, "game": {"seats": ["a", "b"]}}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        rows = [{"iteration": i, "a/game/payoff": seed + i, "b/game/payoff": seed + i + 2.0} for i in range(3)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    cell = trend.summarise(tmp_path, 1, ("payoff",))["payoff"]["per_lambda"]["1.0"]
    assert cell["per_seed"] == {"2": 5.0, "10": 13.0}  # the last iteration, mean of the two learners
    assert cell["start"] == pytest.approx((3.0 + 11.0) / 2) and cell["mean"] == 9.0
    _run_lambda_trend(monkeypatch, str(tmp_path), "--last", "1", "--metrics", "payoff")
    assert "| 1.0 | 9.000 | [" in (out := capsys.readouterr().out) and "| 5.000, 13.000 | 2 | 7.000 |" in out
    assert trend.summarise(tmp_path, 1, ("payoff",), "b")["payoff"]["per_lambda"]["1.0"]["per_seed"] == {
        "2": 6.0,
        "10": 14.0,
    }
    with pytest.raises(SystemExit):
        _run_lambda_trend(monkeypatch, str(tmp_path), "--metrics", "payoff", "--learner", "c")
    assert "no learner 'c'; its game.seats are ['a', 'b']" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_lambda_trend_refuses_last_below_one(tmp_path, capsys, monkeypatch, value):
    trend = load_lambda_trend()
    study = _dilemma_study(tmp_path, iterations=3)
    with pytest.raises(SystemExit) as exited:
        _run_lambda_trend(monkeypatch, str(study), "--last", value)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--last" in err and "must be an integer >= 1" in err and "Traceback" not in err
    with pytest.raises(ValueError, match="last must be an integer >= 1"):
        trend.summarise(study, 0)


def test_last_iterations_label_names_the_counts_taken():
    assert last_iterations_label(5, [5, 5]) == "last 5 iterations"
    assert last_iterations_label(5, [3]) == "last 3 iterations (of 3: the runs are shorter than the 5 asked)"
    assert last_iterations_label(5, [2, 5]) == "last 2–5 iterations (all of a run shorter than the 5 asked)"
    assert last_iterations_label(1, [1]) == "last 1 iteration"
    with pytest.raises(ValueError, match="last_k must be at least 1, got 0"):
        last_iterations_label(0, [3])


def _study_run(root: Path, name: str, iterations: int) -> dict:
    run = root / "runs" / name
    run.mkdir(parents=True)
    record = {"name": name, "learners": ["llm1"], "iterations": iterations, "status": "finished"}
    (run / "run.json").write_text(json.dumps(record))
    (run / "config.yaml").write_text("seed: 1\n")
    rows = [
        {"iteration": i, "llm1/task_reward": float(i), "llm1/kl": 0.1 * i, "llm1/combined_reward": 0.9 * i}
        for i in range(iterations)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {"name": name, "variant": name.split("_")[0], "axes": {}, "seed": 1, "run_dir": f"runs/{name}"}


def test_study_report_says_how_many_iterations_it_averaged(tmp_path):
    runs = [_study_run(tmp_path, "ppo_s1", 3), _study_run(tmp_path, "cory_s1", 3)]
    (tmp_path / "study.json").write_text(json.dumps({"name": "short", "runs": runs}))
    text = build_study_report(tmp_path, last_k=5).read_text()
    window = "last 3 iterations (of 3: the runs are shorter than the 5 asked)"
    assert f"## Final values (mean over the {window} per seed, then across seeds)" in text
    assert f"cory − ppo, task reward (mean) over the {window}:" in text
    assert "last 5 iterations" not in text
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["final_window"] == window and summary["last_k"] == 5
    assert summary["cells"][0]["final"]["task_reward"]["mean"]["per_seed"] == [pytest.approx(1.0)]  # (0 + 1 + 2) / 3
    longer = tmp_path / "longer"
    runs = [_study_run(longer, "ppo_s1", 6), _study_run(longer, "cory_s1", 6)]
    (longer / "study.json").write_text(json.dumps({"name": "long", "runs": runs}))
    assert "## Final values (mean over the last 5 iterations per seed" in build_study_report(longer).read_text()


# --- 2. lambda_trend.py on a directory that is not a study ------------------------------------------------------


@pytest.mark.parametrize("case", ["empty", "missing", "run_dir", "runs_without_metrics"])
def test_lambda_trend_on_a_directory_that_is_not_a_study_says_so_in_one_line(tmp_path, capsys, monkeypatch, case):
    target = tmp_path / "dir"
    if case != "missing":
        target.mkdir()
    if case == "run_dir":
        (target / "metrics.jsonl").write_text("{}\n")
    if case == "runs_without_metrics":
        (target / "runs" / "a").mkdir(parents=True)
    with pytest.raises(SystemExit) as exited:
        _run_lambda_trend(monkeypatch, str(target))
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert ": error: " in line
    assert str(target) in line and "runs" in line and "marllm study" in line
    if case == "run_dir":
        assert "one run's directory" in line


# --- 3. config keys a mode would ignore -------------------------------------------------------------------------


_game = game_config  # tic-tac-toe against random, PPO mini-batches of 1


@pytest.mark.parametrize("actions", ["generate", "constrained", "think"])
def test_action_normalization_is_a_setting_of_score_only(actions):
    refused = rf"(unknown config key 'game.actions.{actions}.normalization'|has no settings)"
    with pytest.raises(ValueError, match=refused):
        config_from_dict(_game({"actions": {actions: {"normalization": "word"}}}))
    assert config_from_dict(_game({"actions": actions})).game.actions.normalization is None
    assert config_from_dict(_game({"actions": "score"})).game.actions.normalization == "token"
    score = config_from_dict(_game({"actions": {"score": {"normalization": "word"}}}))
    assert score.game.actions.normalization == "word"


def test_rollout_from_generate_is_refused_with_score_actions():
    with pytest.raises(ValueError, match="rollout_from_generate: true .* game.actions: score generates nothing"):
        config_from_dict(_game({"actions": "score"}, ppo={"compute": {"rollout_from_generate": True}}))
    with pytest.raises(ConfigError, match="ppo.compute.rollout_from_generate"):
        load_config(TICTACTOE, ["game.actions=score", "ppo.compute.rollout_from_generate=true"])
    for setting in ("auto", False):
        assert config_from_dict(
            _game({"actions": "score"}, ppo={"compute": {"rollout_from_generate": setting}})
        )
    assert config_from_dict(_game({"actions": "generate"}, ppo={"compute": {"rollout_from_generate": True}}))


# --- 4. advice that named no setting ----------------------------------------------------------------------------


@needs_openspiel
def test_too_many_information_states_names_no_setting_a_user_cannot_reach():
    from marllm.games.env.info_states import NotEnumerableError, enumerate_info_states

    with pytest.raises(NotEnumerableError) as raised:
        enumerate_info_states("kuhn_poker", max_info_states=3)  # Kuhn poker has 12
    message = str(raised.value)
    assert "max_info_states" not in message
    assert "more than 3 information states, too many to enumerate" in message and "marllm eval --games" in message
    with pytest.raises(ConfigError, match="unknown config key 'game.max_info_states'"):
        load_config(TICTACTOE, ["game.max_info_states=6000"])  # the advice had pointed here


# --- 5. eval's cfr opponent on a game OpenSpiel does not have ---------------------------------------------------


@needs_openspiel
def test_eval_cfr_opponent_on_a_pettingzoo_game_is_one_line(capfd):
    assert marllm_main(["eval", TICTACTOE, "--opponent", "cfr"]) == 2
    captured = capfd.readouterr()
    output = captured.out + captured.err
    assert "Available games" not in output and "2048" not in output
    [line] = [text for text in output.splitlines() if text.strip()]
    assert "--opponent: cfr" in line and "tictactoe_v3 is a PettingZoo game" in line


@needs_openspiel
def test_exact_evaluation_of_a_game_openspiel_lacks_prints_nothing(capfd):
    from marllm.games.env.info_states import NotEnumerableError, load_game

    with pytest.raises(NotEnumerableError, match="OpenSpiel has no game 'tictactoe_v3'.*exact evaluation") as raised:
        load_game("tictactoe_v3")
    assert "\n" not in str(raised.value)
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


# --- 6. an unquoted override that YAML cannot parse -------------------------------------------------------------


def test_unparsable_override_names_the_key_and_how_to_quote_it():
    with pytest.raises(ConfigError) as raised:
        load_config(TICTACTOE, ["game.templates={board} Move:"])
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("override 'game.templates={board} Move:': value is not valid YAML (")
    suggestion = "game.templates='\"{board} Move:\"'"
    assert message.endswith(suggestion)
    [word] = shlex.split(suggestion)  # what the shell hands marllm
    assert apply_overrides({}, [word]) == {"game": {"templates": "{board} Move:"}}
    with pytest.raises(ConfigError) as raised:
        load_config(TICTACTOE, ["game.templates={state} it's your Move:"])
    [word] = shlex.split(str(raised.value).split("inside the shell's quotes: ", 1)[1])
    assert apply_overrides({}, [word]) == {"game": {"templates": "{state} it's your Move:"}}
