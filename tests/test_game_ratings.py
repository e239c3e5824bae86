"""Bradley–Terry ratings on the Elo scale (marllm.evaluation.ratings) checked against hand-solved likelihood
equations, and the rated round-robin of a two-seat game (marllm.evaluation.round_robin, ``marllm eval
--round-robin``) on tic-tac-toe with the embedded offline base model."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from marllm.cli import main
from marllm.config import load_config
from marllm.evaluation.ratings import ELO_PER_UNIT, bradley_terry
from marllm.evaluation.round_robin import round_robin

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ROOT = Path(__file__).resolve().parents[1]
GAMES = ROOT / "examples" / "games"
TICTACTOE = GAMES / "tictactoe_offline.yaml"
# With illegal answers replaced by random legal moves, the tiny base model's games are not all forfeits: the scores
# (and the bootstrap intervals) are not all 0 or 1.
RANDOM_ILLEGAL = ["game.illegal=random"]

needs_openspiel = pytest.mark.skipif(
    importlib.util.find_spec("pyspiel") is None or importlib.util.find_spec("shimmy") is None,
    reason="needs the optional open_spiel and shimmy (pip install 'marllm[games]')",
)


def games(wins: int = 0, draws: int = 0, losses: int = 0) -> list[float]:
    """Per-game scores of the first of a pair: 1 a win, 0.5 a draw, 0 a loss."""
    return [1.0] * wins + [0.5] * draws + [0.0] * losses


def by_player(ratings):
    return {rating.player: rating for rating in ratings}


def sigma(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# ---------------------------------------------------------------------------------------------------------------
# bradley_terry


def test_two_players_rate_the_log_odds_of_the_prior_augmented_score():
    """For two players the likelihood equation is 41·σ(θ) = 30.5 (30 wins, 10 losses, one virtual draw)."""
    ratings = by_player(bradley_terry(["A", "B"], {("A", "B"): games(wins=30, losses=10)}, anchor="B", resamples=0))
    assert ratings["A"].elo == pytest.approx(400 / math.log(10) * math.log(30.5 / 10.5), abs=1e-9)
    assert ratings["B"].elo == 0.0
    assert ratings["A"].games == ratings["B"].games == 40  # the virtual draw is not counted
    assert ratings["A"].score == pytest.approx(0.75) and ratings["B"].score == pytest.approx(0.25)  # nor scored


def test_without_prior_draws_a_three_to_one_record_is_400_log10_3():
    ratings = by_player(
        bradley_terry(["A", "B"], {("A", "B"): games(wins=3, losses=1)}, anchor="B", prior_draws=0, resamples=0)
    )
    assert ratings["A"].elo == pytest.approx(400 * math.log10(3), abs=1e-9)  # 3:1 odds
    assert pytest.approx(400 / math.log(10)) == ELO_PER_UNIT


def test_draws_count_half_a_win():
    """2 wins, 2 draws and 1 loss score 3 of 5: the same rating as 3 wins and 2 losses."""
    drawn = bradley_terry(["A", "B"], {("A", "B"): games(wins=2, draws=2, losses=1)}, anchor="B", resamples=0)
    decided = bradley_terry(["A", "B"], {("A", "B"): games(wins=3, losses=2)}, anchor="B", resamples=0)
    assert drawn[0].elo == pytest.approx(decided[0].elo, abs=1e-9)
    assert drawn[0].elo == pytest.approx(ELO_PER_UNIT * math.log(3.5 / 2.5), abs=1e-9)
    assert drawn[0].score == pytest.approx(0.6)


def test_three_players_with_an_exact_solution():
    """θ = (0, ln 2, ln 4): B scores σ(ln 2) = 2/3 against A and C σ(ln 2) against B, C σ(ln 4) = 4/5 against A. In
    15 games per pair those are 10 and 12 points, so these records satisfy the likelihood equations exactly."""
    results = {
        ("A", "B"): games(wins=4, draws=2, losses=9),  # A scores 5 of 15, B 10
        ("C", "A"): games(wins=11, draws=2, losses=2),  # C scores 12 of 15, A 3
        ("B", "C"): games(wins=3, draws=4, losses=8),  # B scores 5 of 15, C 10
    }
    ratings = by_player(bradley_terry(["A", "B", "C"], results, prior_draws=0, resamples=0))
    assert ratings["A"].elo == 0.0  # the first player is the default anchor
    assert ratings["B"].elo == pytest.approx(400 * math.log10(2), abs=1e-6)
    assert ratings["C"].elo == pytest.approx(400 * math.log10(4), abs=1e-6)
    assert [ratings[p].games for p in "ABC"] == [30, 30, 30]
    assert ratings["A"].score == pytest.approx(8 / 30)
    assert ratings["B"].score == pytest.approx(15 / 30)
    assert ratings["C"].score == pytest.approx(22 / 30)


def test_one_prior_draw_is_added_to_every_pair_that_met():
    """14 games a pair plus one virtual draw give the 15-game records of the exact solution above."""
    results = {
        ("A", "B"): games(wins=4, draws=1, losses=9),  # 4.5 of 14, + 0.5 = 5 of 15
        ("A", "C"): games(wins=2, draws=1, losses=11),  # 2.5 of 14, + 0.5 = 3 of 15
        ("B", "C"): games(wins=4, draws=1, losses=9),  # 4.5 of 14, + 0.5 = 5 of 15
    }
    ratings = by_player(bradley_terry(["A", "B", "C"], results, prior_draws=1.0, resamples=0))
    assert ratings["B"].elo == pytest.approx(400 * math.log10(2), abs=1e-6)
    assert ratings["C"].elo == pytest.approx(400 * math.log10(4), abs=1e-6)
    assert ratings["B"].score == pytest.approx((9.5 + 4.5) / 28)  # the raw score, without the prior


def test_a_chain_of_pairs_decouples():
    """A–B and B–C only: each link's likelihood is separate, so each difference is its own pair's log odds, however
    lopsided (the Newton iterations converge from 0 to ±9.9 units)."""
    results = {("A", "B"): games(losses=10000), ("B", "C"): games(wins=2, losses=6)}
    ratings = by_player(bradley_terry(["A", "B", "C"], results, resamples=0))
    step_ab = ELO_PER_UNIT * math.log(10000.5 / 0.5)
    assert ratings["B"].elo == pytest.approx(step_ab, rel=1e-9)
    assert ratings["C"].elo - ratings["B"].elo == pytest.approx(ELO_PER_UNIT * math.log(6.5 / 2.5), rel=1e-9)
    assert ratings["B"].games == 10008 and ratings["B"].score == pytest.approx(10002 / 10008)


def test_irregular_results_satisfy_the_likelihood_equations():
    """Uneven games per pair, draws, a missing pair: each player's prior-augmented score equals its expected score
    Σ_j n_ij σ(θ_i − θ_j) at the fitted θ."""
    players = ["A", "B", "C", "D"]
    results = {
        ("A", "B"): games(wins=7, draws=3, losses=2),
        ("C", "A"): games(wins=1, losses=4),
        ("B", "C"): games(wins=20, draws=1, losses=30),
        ("D", "B"): games(draws=3),
        ("C", "D"): games(wins=9),
    }  # A and D never met
    prior = 2.0
    theta = {r.player: r.elo / ELO_PER_UNIT for r in bradley_terry(players, results, prior_draws=prior, resamples=0)}
    observed = dict.fromkeys(players, 0.0)
    expected = dict.fromkeys(players, 0.0)
    for (a, b), outcome in results.items():
        n, won = len(outcome) + prior, sum(outcome) + prior / 2
        observed[a] += won
        observed[b] += n - won
        expected[a] += n * sigma(theta[a] - theta[b])
        expected[b] += n * sigma(theta[b] - theta[a])
    for player in players:
        assert observed[player] == pytest.approx(expected[player], abs=1e-8), player


def test_the_anchor_shifts_every_rating_by_the_same_amount():
    results = {("A", "B"): games(wins=6, losses=4), ("B", "C"): games(wins=3, draws=2, losses=5)}
    first = by_player(bradley_terry(["A", "B", "C"], results, resamples=0))
    second = by_player(bradley_terry(["A", "B", "C"], results, anchor="C", resamples=0))
    assert first["A"].elo == 0.0 and second["C"].elo == 0.0
    for player in "ABC":
        assert second[player].elo == pytest.approx(first[player].elo - first["C"].elo, abs=1e-9)
    reordered = by_player(bradley_terry(["C", "A", "B"], results, anchor="A", resamples=0))
    for player in "ABC":
        assert reordered[player].elo == pytest.approx(first[player].elo, abs=1e-9)


def test_an_unbeaten_player_has_a_finite_rating():
    ratings = by_player(bradley_terry(["A", "B"], {("A", "B"): games(wins=10)}, anchor="B"))
    assert math.isfinite(ratings["A"].elo)
    assert ratings["A"].elo == pytest.approx(ELO_PER_UNIT * math.log(10.5 / 0.5), abs=1e-9)
    # every resample of ten wins is ten wins: the interval is the point
    assert ratings["A"].low == pytest.approx(ratings["A"].elo) and ratings["A"].high == pytest.approx(ratings["A"].elo)
    assert ratings["A"].score == 1.0 and ratings["B"].score == 0.0


def test_the_anchor_rating_and_interval_are_exactly_zero():
    results = {("A", "B"): games(wins=6, draws=2, losses=4), ("B", "C"): games(wins=3, draws=2, losses=5)}
    ratings = by_player(bradley_terry(["A", "B", "C"], results, anchor="B", resamples=200))
    assert (ratings["B"].elo, ratings["B"].low, ratings["B"].high) == (0.0, 0.0, 0.0)
    for player in "AC":
        assert ratings[player].low < ratings[player].elo < ratings[player].high


def test_bootstrap_intervals_contain_the_estimate_and_narrow_with_more_games():
    """At a 3:1 record the standard error of the log odds is 1/√(n·¾·¼); at n = 2000 the 95% interval is about
    2·1.96·0.0516 units, 35 Elo wide, and ten times narrower than at n = 20."""
    few = bradley_terry(["A", "B"], {("A", "B"): games(wins=15, losses=5)}, anchor="B", resamples=500)[0]
    many = bradley_terry(["A", "B"], {("A", "B"): games(wins=1500, losses=500)}, anchor="B", resamples=500)[0]
    for rating in (few, many):
        assert rating.low < rating.elo < rating.high
    expected_width = 2 * 1.96 * ELO_PER_UNIT / math.sqrt(2000 * 0.75 * 0.25)
    assert many.high - many.low == pytest.approx(expected_width, rel=0.2)
    assert many.high - many.low < 0.2 * (few.high - few.low)


def test_without_resamples_the_interval_is_the_point():
    rating = bradley_terry(["A", "B"], {("A", "B"): games(wins=3, losses=2)}, resamples=0)[1]
    assert rating.low == rating.elo == rating.high


def test_the_same_seed_gives_the_same_intervals():
    results = {("A", "B"): games(wins=6, draws=2, losses=4), ("B", "C"): games(wins=3, draws=2, losses=5)}
    once = bradley_terry(["A", "B", "C"], results, resamples=100, seed=7)
    again = bradley_terry(["A", "B", "C"], results, resamples=100, seed=7)
    assert once == again


def test_the_order_of_a_pair_does_not_matter():
    """(A, B) with A's scores and (B, A) with 1 − those are the same games: the same ratings and intervals."""
    scores = games(wins=5, draws=3, losses=4)
    ab = {("A", "B"): scores, ("B", "C"): games(wins=2, draws=1, losses=5)}
    ba = {("B", "A"): [1.0 - s for s in scores], ("B", "C"): games(wins=2, draws=1, losses=5)}
    first = bradley_terry(["A", "B", "C"], ab, resamples=50, seed=3)
    second = bradley_terry(["A", "B", "C"], ba, resamples=50, seed=3)
    for one, other in zip(first, second, strict=True):
        assert one.player == other.player and one.games == other.games
        assert (one.elo, one.low, one.high, one.score) == pytest.approx((other.elo, other.low, other.high, other.score))


@pytest.mark.parametrize(
    ("players", "results", "options", "message"),
    [
        (["A"], {}, {}, "at least two distinct players"),
        (["A", "A"], {("A", "A"): [1.0]}, {}, "at least two distinct players"),
        (["A", "B"], {("A", "Z"): [1.0]}, {}, "('A', 'Z')"),
        (["A", "B"], {("A", "A"): [1.0]}, {}, "('A', 'A')"),
        (["A", "B"], {("A", "B"): [1.0], ("B", "A"): [0.0]}, {}, "given twice"),
        (["A", "B"], {("A", "B"): [1.0, 1.5]}, {}, "scores must be in [0, 1]"),
        (["A", "B"], {("A", "B"): [-0.5]}, {}, "scores must be in [0, 1]"),
        (["A", "B"], {("A", "B"): []}, {}, "has no games"),
        (["A", "B", "C", "D"], {("A", "B"): [1.0], ("C", "D"): [0.5]}, {}, "linked"),
        (["A", "B", "C"], {("A", "B"): [1.0]}, {}, "linked"),  # C played no games
        (["A", "B"], {("A", "B"): [1.0]}, {"anchor": "Z"}, "the anchor 'Z'"),
        (["A", "B"], {("A", "B"): [1.0]}, {"prior_draws": -1.0}, "prior_draws"),
    ],
)
def test_bad_input_is_refused(players, results, options, message):
    with pytest.raises(ValueError) as error:
        bradley_terry(players, results, resamples=0, **options)
    assert message in str(error.value)


def test_a_nan_score_is_refused():
    with pytest.raises(ValueError, match=r"scores must be in \[0, 1\]"):
        bradley_terry(["A", "B"], {("A", "B"): [1.0, float("nan")]}, resamples=0)


# ---------------------------------------------------------------------------------------------------------------
# round_robin


@pytest.fixture(scope="module")
def tictactoe():
    return load_config(TICTACTOE, RANDOM_ILLEGAL)


def test_a_round_robin_of_base_random_and_minimax(tictactoe):
    count = 6
    result = round_robin(tictactoe, ["base"], ["random", "minimax"], games=count, batch_size=count, resamples=50)
    names = ["base", "random", "minimax"]
    assert result.game == "tictactoe_v3" and result.players == names
    pairs = [("base", "random"), ("base", "minimax"), ("random", "minimax")]
    assert [(row.model, row.opponent, row.seat) for row in result.rows] == [
        (a, b, seat) for a, b in pairs for seat in ("player_1", "player_2")
    ]
    assert all(row.games == count for row in result.rows)
    assert list(result.scores) == pairs
    for a, b in pairs:  # each pair's score is its two rows' (wins + ½ draws), averaged over the seats
        rows = [row for row in result.rows if (row.model, row.opponent) == (a, b)]
        assert result.scores[(a, b)] == pytest.approx(np.mean([row.win.rate + row.draw.rate / 2 for row in rows]))
        assert result._score(a, b) + result._score(b, a) == pytest.approx(1.0)
    for player in names:
        others = [result._score(player, other) for other in names if other != player]
        rating = result.rating(player)
        assert rating.games == 2 * count * 2
        assert rating.score == pytest.approx(np.mean(others))  # every pair played as many games
        assert rating.low <= rating.elo <= rating.high
    assert (result.rating("base").elo, result.rating("base").low, result.rating("base").high) == (0.0, 0.0, 0.0)
    assert result._score("minimax", "base") >= 0.5 and result._score("minimax", "random") >= 0.5  # never loses
    assert result.rating("minimax").elo > max(result.rating("base").elo, result.rating("random").elo)
    # a balanced round-robin: the Bradley–Terry ratings are in the order of the total scores
    assert sorted(names, key=lambda p: result.rating(p).elo) == sorted(names, key=lambda p: result.rating(p).score)
    # the ratings are bradley_terry's of the pairs' scores (the point estimate depends on each pair's total only)
    refit = {}
    for pair, score in result.scores.items():
        half_points = round(score * 2 * count * 2)  # 2 × count games, in half points
        wins, draws = divmod(half_points, 2)
        refit[pair] = games(wins=wins, draws=draws, losses=2 * count - wins - draws)
    for rating in bradley_terry(names, refit, resamples=0):
        assert result.rating(rating.player).elo == pytest.approx(rating.elo, abs=1e-6)
    saved = json.loads(json.dumps(result.to_dict()))
    assert [r["player"] for r in saved["ratings"]] == names and len(saved["rows"]) == 6
    assert {(s["player"], s["opponent"]) for s in saved["scores"]} == set(pairs)
    table = result.to_markdown()
    assert "| player | Elo | 95% interval | games | score |" in table
    minimax_row = f"| minimax | {result._score('minimax', 'base'):.2f} | {result._score('minimax', 'random'):.2f} | - |"
    assert minimax_row in table
    with pytest.raises(KeyError, match="mcts"):
        result.rating("mcts")


def test_a_round_robin_of_fixed_players_only_is_deterministic(tictactoe):
    once = round_robin(tictactoe, [], ["random", "minimax"], games=4, batch_size=2, seed=5, resamples=20)
    again = round_robin(tictactoe, [], ["random", "minimax"], games=4, batch_size=2, seed=5, resamples=20)
    assert once.to_dict() == again.to_dict()
    assert once.players == ["random", "minimax"] and once.rating("random").elo == 0.0
    assert once._score("minimax", "random") >= 0.5
    assert once.rating("minimax").games == 8


@pytest.mark.parametrize(
    ("checkpoints", "fixed", "options", "message"),
    [
        (["base"], ["random", "self"], {}, "'self' is not a participant"),
        (["base"], ["random", "random"], {}, "at least two distinct participants"),
        (["base", "base"], [], {}, "at least two distinct participants"),
        (["base"], [], {}, "at least two distinct participants"),
        ([], ["minimax"], {}, "at least two distinct participants"),
        (["base"], ["random"], {"games": 0}, "games and batch_size must be >= 1"),
        (["base"], ["random"], {"batch_size": 0}, "games and batch_size must be >= 1"),
        (["base"], ["random", "nobody"], {}, "unknown opponent 'nobody'"),
    ],
)
def test_a_bad_round_robin_is_refused_before_any_game(tictactoe, checkpoints, fixed, options, message):
    with pytest.raises(ValueError) as error:
        round_robin(tictactoe, checkpoints, fixed, **{"games": 2, "batch_size": 2, "resamples": 0, **options})
    assert message in str(error.value)


@needs_openspiel
def test_minimax_is_refused_in_a_round_robin_of_kuhn_poker():
    config = load_config(GAMES / "kuhn_poker_offline.yaml")
    with pytest.raises(ValueError, match="minimax plays tic-tac-toe only"):
        round_robin(config, ["base"], ["random", "minimax"], games=2, batch_size=2, resamples=0)


# ---------------------------------------------------------------------------------------------------------------
# marllm eval --round-robin


def test_marllm_eval_round_robin_writes_the_ratings(tmp_path, capsys, tictactoe):
    out = tmp_path / "nested" / "ratings.json"
    argv = ["eval", str(TICTACTOE), *RANDOM_ILLEGAL, "--round-robin", "--opponent", "random", "--opponent", "minimax"]
    assert main([*argv, "--games", "3", "--checkpoint", "base", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "a round-robin, 3 games per pair and seat" in printed and "relative to base" in printed
    assert "| score of row against column | base | random | minimax |" in printed
    saved = json.loads(out.read_text())
    assert [r["player"] for r in saved["ratings"]] == ["base", "random", "minimax"]
    assert [(s["player"], s["opponent"]) for s in saved["scores"]] == [
        ("base", "random"), ("base", "minimax"), ("random", "minimax"),
    ]  # fmt: skip
    assert all(r["games"] == 2 * 3 * 2 and r["elo_low"] <= r["elo"] <= r["elo_high"] for r in saved["ratings"])
    # the command line's defaults: the config's seed, --batch-size 64, 1000 bootstrap resamples
    direct = round_robin(tictactoe, ["base"], ["random", "minimax"], games=3, batch_size=64, seed=tictactoe.seed)
    assert saved == json.loads(json.dumps(direct.to_dict()))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--opponent", "random", "--opponent", "self"], "--round-robin: 'self' is not a participant"),
        ([], "--round-robin: a round-robin needs at least two distinct participants, got ['base']"),
    ],
)
def test_marllm_eval_round_robin_refuses_a_bad_line_up(capsys, options, message):
    assert main(["eval", str(TICTACTOE), "--round-robin", "--games", "2", *options]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("marllm: config error: ") and message in lines[0], lines


def test_marllm_eval_round_robin_of_a_text_task_says_it_needs_a_game(capsys):
    assert main(["eval", str(ROOT / "examples" / "cory_offline.yaml"), "--round-robin"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "the config has no game section" in lines[0], lines


def test_an_unbeaten_player_without_prior_draws_is_refused_not_rated_at_an_arbitrary_number():
    with pytest.raises(ValueError, match="diverge"):
        bradley_terry(["A", "B"], {("A", "B"): [1.0] * 5}, prior_draws=0, resamples=0)
