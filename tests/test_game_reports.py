"""Reports of game runs: ``marllm report`` of a tiny game run and a study report of game runs show win, draw and
loss rates, illegal moves and payoff per learner and seat (cooperation and exploitability where logged)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from marllm.cli import main
from marllm.studies.report import build_study_report

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ROOT = Path(__file__).resolve().parents[1]
TINY = ["iterations=2", "game.batch_size=2", "logging.progress=false"]


@pytest.fixture(scope="module")
def game_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tic-tac-toe, the learner ``llm`` against random, two iterations of two games on the offline base; the
    learner plays X, then O (``agents.role_period: 1``)."""
    run_dir = tmp_path_factory.mktemp("game") / "run"
    assert main(["train", str(ROOT / "examples/games/tictactoe_offline.yaml"), "--run-dir", str(run_dir), *TINY]) == 0
    return run_dir


def metrics_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_report_of_a_game_run_shows_its_games_per_learner_and_seat(game_run, tmp_path):
    assert main(["report", str(game_run), "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    games = json.loads((tmp_path / "report" / "summary.json").read_text())["games"]
    lines = metrics_of(game_run)
    seats = [("llm", "all seats"), ("llm", "player_1"), ("llm", "player_2")]
    assert [(row["learner"], row["seat"]) for row in games] == seats
    for row, prefix in zip(games, ("llm/game/", "llm/game/player_1/", "llm/game/player_2/"), strict=True):
        for metric in ("win_rate", "draw_rate", "loss_rate", "illegal_move_rate", "payoff"):
            logged = [line[prefix + metric] for line in lines if prefix + metric in line]
            assert row[metric] == pytest.approx(sum(logged) / len(logged))
        assert row["cooperation_rate"] is None and row["exploitability"] is None  # not a dilemma, not measured
        assert row["exploitability_average"] is None
    section = text[text.index("## Games") :]
    assert "| run | learner | seat | win | draw | loss | illegal moves | payoff |\n" in section
    assert "| llm | all seats |" in section and "| llm | player\\_1 |" in section and "| llm | player\\_2 |" in section
    assert "cooperation" not in section.split("\n\n")[2]  # the header has no column nobody logged


def test_a_study_report_of_game_runs_aggregates_games_over_seeds(game_run, tmp_path):
    """Two seeds copied from the tiny run, with cooperation and exploitability written in by hand."""
    runs = []
    for seed, (cooperation, exploitability) in enumerate([(0.2, [0.5, 0.4]), (0.6, [0.3, 0.1])], start=1):
        run_dir = tmp_path / "runs" / f"ttt_s{seed}"
        shutil.copytree(game_run, run_dir, ignore=shutil.ignore_patterns("checkpoints", "training_state"))
        lines = metrics_of(run_dir)
        for line, value in zip(lines, exploitability, strict=True):
            line |= {"llm/game/cooperation_rate": cooperation, "llm/game/exploitability": value}
            line |= {"llm/game/exploitability_average": value + 0.05, "llm/game/accuracy": cooperation / 2}
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        runs.append({"name": run_dir.name, "variant": "ttt", "seed": seed, "run_dir": f"runs/{run_dir.name}"})
    (tmp_path / "study.json").write_text(json.dumps({"name": "games", "runs": runs}))
    text = build_study_report(tmp_path, last_k=2).read_text()
    [cell] = json.loads((tmp_path / "report" / "summary.json").read_text())["cells"]
    [overall, seat, _] = cell["games"]
    assert (overall["learner"], overall["seat"], seat["seat"]) == ("llm", "all seats", "player_1")
    assert overall["metrics"]["cooperation_rate"]["per_seed"] == pytest.approx([0.2, 0.6])
    assert overall["metrics"]["exploitability"]["per_seed"] == pytest.approx([0.4, 0.1])  # each seed's last
    assert overall["metrics"]["exploitability_average"]["per_seed"] == pytest.approx([0.45, 0.15])
    key = "llm/game/player_1/win_rate"
    [win] = [line[key] for line in metrics_of(game_run) if key in line]
    assert seat["metrics"]["win_rate"]["per_seed"] == pytest.approx([win, win])
    assert "cooperation_rate" not in seat["metrics"]
    section = text[text.index("## Games") :]
    header = (
        "| cell | learner | seat | win | draw | loss | illegal moves | payoff | cooperation | exploitability "
        "| exploitability of the average policy | n |"
    )
    assert header in section
    assert "| ttt | llm | all seats |" in section and "0.4 ± 0.2828 | 0.25 ± 0.2121 | 0.3 ± 0.2121 | 2 |" in section
    measures = {row["measure"]: row for row in cell["game_measures"]}
    assert measures["accuracy"]["per_seed"] == pytest.approx([0.1, 0.3])  # a view's own measure, over seeds
    assert "game_length" in measures and "win_rate" not in measures  # the env's others too, not the table's
    assert "| ttt | llm | accuracy | 0.2 ± 0.1414 |" in text[text.index("## The game's other measures") :]

