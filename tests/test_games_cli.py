"""Game runs through the command line: the offline examples of examples/games/ for one iteration (tiny batches),
a resumed run with a snapshot pool that goes on exactly as an unbroken one, and ``marllm eval`` of a game: its rows
and their intervals. They load the embedded offline base model (``marllm:offline-base``)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from marllm.cli import main
from marllm.config import load_config
from marllm.games.evaluation import evaluate_game, wilson

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ROOT = Path(__file__).resolve().parents[1]
GAMES = ROOT / "examples" / "games"
TINY = ["iterations=1", "game.batch_size=2", "logging.progress=false"]
IPD2 = "game.name=openspiel:repeated_game(stage_game=matrix_pd(),num_repetitions=2)"

needs_openspiel = pytest.mark.skipif(
    importlib.util.find_spec("pyspiel") is None or importlib.util.find_spec("shimmy") is None,
    reason="needs the optional open_spiel and shimmy (pip install 'marllm[games]')",
)


def metrics_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    ("example", "overrides", "learners", "seats"),
    [
        ("tictactoe_offline", [], ["llm"], {"llm": ["player_1"]}),
        pytest.param("kuhn_poker_offline", [], ["llm"], {"llm": ["player_0", "player_1"]}, marks=needs_openspiel),
        pytest.param(
            "ipd_offline",
            [IPD2, "ppo.batching.mini_batch_size=2"],
            ["llm1", "llm2"],
            {"llm1": ["player_0"], "llm2": ["player_1"]},
            marks=needs_openspiel,
        ),  # fmt: skip
    ],
)
def test_an_offline_game_example_trains_for_an_iteration(tmp_path, example, overrides, learners, seats):
    run_dir = tmp_path / "run"
    assert main(["train", str(GAMES / f"{example}.yaml"), "--run-dir", str(run_dir), *TINY, *overrides]) == 0
    [metrics] = metrics_of(run_dir)
    for learner in learners:
        assert "kl" in {key.split("/", 1)[1] for key in metrics if key.startswith(f"{learner}/")}
        for key in ("payoff", "win_rate", "draw_rate", "loss_rate", "illegal_move_rate", "moves_per_game"):
            assert 0 <= metrics[f"{learner}/game/{key}"] <= 1 or key in ("payoff", "moves_per_game")
            for seat in seats[learner]:
                assert f"{learner}/game/{seat}/{key}" in metrics
        assert (run_dir / "checkpoints" / learner / "policy").is_dir()
        # A social dilemma's learners report how often their legal answers cooperate (NaN: none was legal).
        cooperation = metrics.get(f"{learner}/game/cooperation_rate")
        assert (cooperation is not None) == (example == "ipd_offline")
        assert cooperation is None or math.isnan(cooperation) or 0 <= cooperation <= 1
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == learners  # no fixed opponent exported
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished" and info["learners"] == learners
    assert info["roles"] == list(load_config(GAMES / f"{example}.yaml", overrides).game.info.seats)
    assert not (run_dir / "eval_samples.jsonl").exists()  # a game has no held-out queries: marllm eval measures it
    exported = str(run_dir / "checkpoints" / learners[-1])
    evaluation = ["eval", str(GAMES / f"{example}.yaml"), *overrides, "--checkpoint", exported, "--games", "2"]
    assert main([*evaluation, "--opponent", "random", "--out", str(tmp_path / "eval.json")]) == 0
    rows = json.loads((tmp_path / "eval.json").read_text())["rows"]
    assert [row["model"] for row in rows] == [exported] * len(info["roles"])


def test_a_resumed_game_run_with_a_snapshot_pool_goes_on_as_an_unbroken_one(tmp_path):
    """The pool's snapshots, the game env's and the random player's generators and the role baselines are in the
    checkpoint."""
    config = str(GAMES / "tictactoe_offline.yaml")
    overrides = ["game.batch_size=2", "logging.progress=false", "game.illegal=random"]
    overrides.append("game.role_baselines=0.5")
    overrides.append("game.seats=[llm, {snapshot_pool: {learner: llm, size: 2}}]")
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    assert main(["train", config, "--run-dir", str(whole), "iterations=2", *overrides]) == 0
    assert main(["train", config, "--run-dir", str(broken), "iterations=1", *overrides]) == 0
    state = json.loads(next((broken / "training_state").glob("iteration-*/state.json")).read_text())
    assert len(state["learners"]["pool-llm"]["state"]["snapshots"]) == 2
    assert [part["part"] for part in state["env"]] == ["0.RoleBaselines", "1.RolePermutation", "2.BatchedGameEnv"]
    assert [role for _, role, _ in state["env"][0]["state"]["values"]] == ["player_1"]
    assert main(["train", config, "--resume", str(broken), "iterations=2", *overrides]) == 0

    def without_times(rows):
        return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]

    assert without_times(metrics_of(broken)) == without_times(metrics_of(whole))
    assert metrics_of(whole)[1]["pool-llm/pool_size"] == 2.0


def test_wilson_intervals():
    rate = wilson(8, 10)
    assert rate.rate == 0.8
    assert rate.low == pytest.approx(0.4902, abs=1e-4) and rate.high == pytest.approx(0.9433, abs=1e-4)
    assert wilson(0, 6).low == 0.0 and wilson(6, 6).high == 1.0 and wilson(0, 0).rate is None
    middle = wilson(5, 10)
    assert middle.low == pytest.approx(1 - middle.high)


@needs_openspiel
def test_evaluate_game_rows_and_intervals(tmp_path):
    config = load_config(GAMES / "ipd_offline.yaml", [IPD2])
    result = evaluate_game(config, ["base"], ["random", "self"], games=3, batch_size=2, seed=0)
    assert [(r.model, r.opponent, r.seat) for r in result.rows] == [
        ("base", opponent, seat) for opponent in ("random", "self") for seat in ("player_0", "player_1")
    ]
    for row in result.rows:
        assert row.games == 3 and row.illegal.n == 3 * 2  # two rounds, one answer each
        assert row.win.rate + row.draw.rate + row.loss.rate == pytest.approx(1.0)
        for rate in (row.win, row.draw, row.loss, row.illegal):
            assert 0 <= rate.low <= rate.rate <= rate.high <= 1
        assert row.payoff["ci_low"] <= row.payoff["mean"] <= row.payoff["ci_high"]
        assert row.cooperation is not None  # the prisoner's dilemma has a cooperative move
        assert row.cooperation.n <= row.illegal.n - round(row.illegal.rate * row.illegal.n)
    again = evaluate_game(config, ["base"], ["random", "self"], games=3, batch_size=2, seed=0)
    assert again.to_dict() == result.to_dict()  # the same deals and samples
    assert "| base | self | player_1 | 3 |" in result.to_markdown()


def test_marllm_eval_of_a_game_config(tmp_path, capsys):
    out = tmp_path / "eval.json"
    config = str(GAMES / "tictactoe_offline.yaml")
    argv = ["eval", config, "--games", "2", "--opponent", "random", "--opponent", "minimax", "--out", str(out)]
    assert main(argv) == 0
    assert "| model | opponent | seat | games | win | draw | loss | illegal moves | payoff |" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["game"] == "tictactoe_v3" and saved["seats"] == ["player_1", "player_2"]
    assert [(row["opponent"], row["seat"]) for row in saved["rows"]] == [
        ("random", "player_1"), ("random", "player_2"), ("minimax", "player_1"), ("minimax", "player_2"),
    ]  # fmt: skip
    row = saved["rows"][0]
    assert row["games"] == 2 and row["win_rate_low"] <= row["win_rate"] <= row["win_rate_high"]
    assert "cooperation_rate" not in row  # tic-tac-toe has no cooperative move
