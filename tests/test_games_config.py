"""Games as a configuration: the ``game`` section's checks, the env and seats a game config builds (SharedReward,
RolePermutation, self-play, fixed opponents, snapshot pools), its per-seat metrics, and the snapshot pool's
checkpoint state. Nothing here loads a model but a tiny GPT-2."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from marllm.cli import main
from marllm.config import ConfigError, config_from_dict, load_config
from marllm.games.build import fixed_player
from marllm.games.env import BatchedGameEnv
from marllm.games.players import OpponentPool, RandomMover, TicTacToeMinimax
from marllm.games.seats import seat_players, seat_slots
from marllm.games.settings import Seat
from marllm.games.training import build_game_env, game_metrics
from marllm.loop import run_iteration
from marllm.wrappers import RoleBaselines, RolePermutation, SharedReward
from tests.test_games_training import RecordingLearner, tiny_learner, word_tokenizer

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples" / "games").glob("*.yaml"))

needs_openspiel = pytest.mark.skipif(
    importlib.util.find_spec("pyspiel") is None or importlib.util.find_spec("shimmy") is None,
    reason="needs the optional open_spiel and shimmy (pip install 'marllm[games]')",
)

IPD = "openspiel:repeated_game(stage_game=matrix_pd(),num_repetitions=2)"


def game_config(game=None, **sections):
    """A game config dict: tic-tac-toe, a learner against random, PPO mini-batches of 1, plus ``sections``."""
    data = {
        "model": {"name_or_path": "marllm:offline-base", "device": "cpu"},
        "game": {"name": "tictactoe_v3", "seats": ["llm", "random"], "batch_size": 4, **(game or {})},
        "ppo": {"batching": {"mini_batch_size": 1}},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return data


# --- the game section -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_game_example_loads(path):
    if "openspiel:" in path.read_text() and importlib.util.find_spec("pyspiel") is None:
        pytest.skip("needs open_spiel")
    config = load_config(path)
    assert config.game is not None and config.learner_ids
    assert config.to_dict()["game"]["seats"] == [seat.to_config() for seat in config.game.seats]
    assert config_from_dict(config.to_dict()).to_dict() == config.to_dict()  # what config.yaml reads back


def test_a_game_config_names_its_learners_and_shares_rewards_over_its_seats():
    config = config_from_dict(game_config({"seats": ["alice", "bob"]}, agents={"reward_coefficients": 0.5}))
    assert config.learner_ids == ["alice", "bob"] and config.game.info.seats == ("player_1", "player_2")
    np.testing.assert_array_equal(config.coefficient_matrix(), [[1.0, 0.5], [0.5, 1.0]])
    selfplay = config_from_dict(game_config({"seats": ["llm", "llm"]}))
    assert selfplay.learner_ids == ["llm"]
    assert config_from_dict({"model": {"name_or_path": "x"}}).game is None  # the text env, as before


@pytest.mark.parametrize(
    ("game", "sections", "message"),
    [
        ({"name": "tictactoe_v9"}, {}, r"game.name: unknown game 'tictactoe_v9' \(did you mean 'tictactoe_v3'\?\)"),
        ({"seats": ["llm"]}, {}, r"game.seats lists 1 player\(s\) \['llm'\] for tictactoe_v3, whose seats are "),
        ({"seats": ["llm", "foo:bar"]}, {}, r"game.seats\[1\]: 'foo:bar' is not a seat; a seat is a learner id"),
        ({"seats": ["random", "minimax"]}, {}, "names no learner"),
        ({"seats": ["llm", "self"]}, {}, r"game.seats\[1\]: 'self' is not a seat"),
        ({"seats": ["player_1", "random"]}, {}, r"learner id\(s\) \['player_1'\] are also names of the game's seats"),
        ({"name": "connect_four_v3", "seats": ["llm", "minimax"]}, {}, r"game.seats\[1\]: minimax plays tic-tac-toe"),
        ({"seats": ["llm", {"snapshot_pool": {"learner": "llm2"}}]}, {}, r"takes snapshots of learner 'llm2'"),
        ({"name": "rps_v2", "seats": ["llm", "mcts"]}, {}, "mcts searches the whole state of a turn-taking game"),
        ({"actions": {"generate": {"parser": "middle"}}}, {}, r"parser must be one of \['first', 'last'"),
        ({"illegal": "pass"}, {}, r"game.illegal must be one of \['forfeit', 'random'\], got 'pass'"),
        ({"discount": 0.0}, {}, r"game.discount must be a number in \(0, 1\]"),
        ({"illegal_penalty": -1.0}, {}, "game.illegal_penalty must be a finite number >= 0"),
        ({"batch_size": 0}, {}, "game.batch_size must be an integer >= 1"),
        ({"role_baselines": 1.0}, {}, r"game.role_baselines must be a decay in \[0, 1\)"),
        ({"seats": ["llm", {"snapshot_pool": {"learner": "llm", "size": 0}}]}, {}, "snapshot_pool.size must be an"),
        ({"seats": ["llm", {"mcts": {"iterations": 9}}]}, {}, r"unknown config key 'game.seats\[1\].mcts.iterations'"),
        ({"exploitability": {"every": 0}}, {}, "game.exploitability.every must be an integer"),
        ({"exploitability": {"average": "last"}}, {}, r"game.exploitability.average must be one of"),
        ({"colour": "red"}, {}, r"unknown config key 'game.colour'; valid keys here: "),
        ({"templates": "{board}"}, {}, r"game.templates: .*board"),
        ({"templates": {"player_1": "{state}"}}, {}, r"game.templates: .*missing \['player_2'\]"),
        ({"name": "rps_v2", "options": {"rounds": 3}}, {}, r"game.options: rps_v2 does not take \{'rounds': 3\}"),
        (
            {},
            {"ppo": {"batching": {"mini_batch_size": 4}}},
            r"= 4 must be 1 for this game: the games of a batch of tictactoe_v3 end",
        ),
        (
            {},
            {"ppo": {"batching": {"mini_batch_size": 4}}},
            r"set ppo.batching.last_minibatch: merge \(the rows left over join the last",
        ),
        (
            {},
            {"env": {"batch_size": 8}},
            "a config with a game section plays the game instead of the text env: leave out its env section",
        ),
        ({}, {"task": {"name": "arithmetic"}}, "leave out its task section"),
        ({}, {"agents": {"learners": ["a", "b"]}}, r"agents.learners: with a game section the learners are"),
        ({}, {"agents": {"algorithm": "grpo"}}, "agents.algorithm grpo .* use ppo or reinforce_pp"),
        ({}, {"agents": {"reward_coefficients": [[1, 0, 0], [0, 1, 0], [0, 0, 1]]}}, r"must be an 2x2 matrix"),
        ({}, {"logging": {"pass_at_k": [1]}}, "logging.pass_at_k measures answers to a task's problems"),
    ],
)
def test_bad_game_settings_are_refused_naming_the_key(game, sections, message):
    with pytest.raises(ConfigError, match=message):  # when read, or checked against the game before a run loads
        config_from_dict(game_config(game, **sections)).check_game()


@pytest.mark.parametrize(("key", "new"), [("average", "exploitability.average"), ("every", "exploitability.every")])
def test_a_key_outside_its_game_section_is_answered_with_its_place(key, new):
    written = rf"unknown config key 'game.{key}' \('{key}' is 'game.{new}': write it there\)"
    with pytest.raises(ConfigError, match=written):
        config_from_dict(game_config({key: 2}))


def test_an_action_mode_is_its_name_or_its_name_and_settings():
    assert config_from_dict(game_config({"actions": "score"})).game.actions.mode == "score"
    scored = load_config(ROOT / "examples" / "games" / "tictactoe_offline.yaml", ["game.actions={score: {}}"])
    assert scored.game.actions.normalization == "token"
    with pytest.raises(ConfigError, match=r"game.actions must be one of \['generate'"):
        config_from_dict(game_config({"actions": ["score"]}))
    with pytest.raises(ConfigError, match="one action mode and its settings"):
        config_from_dict(game_config({"actions": {"score": {}, "generate": {}}}))
    with pytest.raises(ConfigError, match="unknown action mode 'mode'"):
        config_from_dict(game_config({"actions": {"mode": "score"}}))


def test_a_game_section_needs_its_name_and_seats():
    with pytest.raises(ConfigError, match=r"missing config key\(s\) \['game.name'\]"):
        config_from_dict({"game": {"seats": ["llm", "random"]}})


@needs_openspiel
@pytest.mark.parametrize(
    ("game", "sections", "message"),
    [
        ({"name": "openspiel:nope"}, {}, r"game.name: OpenSpiel has no game 'nope' \(pyspiel.registered_names"),
        ({"name": "openspiel:kuhn_poker", "options": {"players": 3}}, {}, "take their parameters in the game string"),
        ({"name": IPD, "seats": ["llm", "minimax"]}, {}, "minimax plays tic-tac-toe only"),
        ({"name": IPD}, {"ppo": {"batching": {"mini_batch_size": 4}}}, r"ends its game early .*game.illegal: random"),
        (
            {"name": IPD, "illegal": "random", "batch_size": 6},
            {"ppo": {"batching": {"mini_batch_size": 4}}},
            r"game.batch_size 6 is not divisible by ppo.batching.mini_batch_size × "
            r"ppo.batching.gradient_accumulation_steps = 4 × 1 = 4",
        ),
    ],
)
def test_bad_openspiel_settings_are_refused(game, sections, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(game_config(game, **sections)).check_game()


def test_merged_last_mini_batches_take_any_mini_batch_size():
    config = config_from_dict(game_config({}, ppo={"batching": {"mini_batch_size": 4, "last_minibatch": "merge"}}))
    assert config.ppo.batching.last_minibatch == "merge" and config.ppo.batching.mini_batch_size == 4


@needs_openspiel
def test_lockstep_games_take_whole_batch_mini_batches():
    config = config_from_dict(game_config({"name": IPD, "illegal": "random"}, ppo={"batching": {"mini_batch_size": 4}}))
    assert config.game.info.lockstep


def test_without_open_spiel_an_openspiel_game_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyspiel", None)  # `import pyspiel` raises ImportError
    with pytest.raises(ConfigError, match=r"game.name: OpenSpiel games need .* pip install 'marllm\[games\]'"):
        config_from_dict(game_config({"name": "openspiel:kuhn_poker"})).check_game()
    with pytest.raises(ConfigError, match=r"game.seats\[1\]: mcts is OpenSpiel's: .*pip install 'marllm\[games\]'"):
        config_from_dict(game_config({"seats": ["llm", "mcts"]})).check_game()


def test_the_command_line_reports_a_bad_game_as_a_config_error(capsys):
    config = str(ROOT / "examples/games/tictactoe_offline.yaml")
    assert main(["train", config, "game.seats=[llm, 'random:7']"]) == 2
    assert "marllm: config error: game.seats[1]: 'random:7' is not a seat" in capsys.readouterr().err
    assert main(["eval", config, "--opponent", "chess_engine"]) == 2
    assert "--opponent: unknown opponent 'chess_engine'" in capsys.readouterr().err
    assert main(["eval", config, "--pass-k", "1"]) == 2
    assert "a game config takes --games and --opponent" in capsys.readouterr().err
    assert main(["train", config, "--nproc", "2"]) == 2
    assert "a game config trains on one process" in capsys.readouterr().err


def test_seats_read_and_slot_ids():
    written = ["llm", "random", "llm", {"snapshot_pool": {"learner": "llm"}}, "random"]
    seats = [Seat.from_config(seat, "s") for seat in written]
    assert [s.kind for s in seats] == ["learner", "random", "learner", "snapshot_pool", "random"]
    assert seat_slots(seats) == ["llm", "random", "llm#2", "pool-llm", "random#2"]


# --- the env and the players a game config builds -------------------------------------------------------------------


def test_a_game_config_wraps_the_game_in_shared_reward_and_role_permutation():
    """λ = 0.5 and the learner changing seats every iteration: each move is credited its payoff plus half the
    random player's, and the learner is X in iterations 1 and 3, O in 2."""
    agents = {"reward_coefficients": 0.5, "role_period": 1}
    config = config_from_dict(game_config({"seats": ["llm", "random"], "batch_size": 5}, agents=agents))
    env = build_game_env(config)
    assert isinstance(env, RolePermutation) and isinstance(env.env, SharedReward)
    assert isinstance(env.unwrapped, BatchedGameEnv) and env.possible_agents == ["llm", "random"]
    learner = RecordingLearner("llm", pick=lambda names, game: names[game % len(names)])
    players, opponents = seat_players(config.game, {"llm": learner}, config.seed, config.generation)
    assert list(players) == ["llm", "random"] and isinstance(opponents["random"], RandomMover)
    owners = {"llm": "llm"}
    for iteration, seat in enumerate(["player_1", "player_2", "player_1"]):
        result = run_iteration(env, players, seed=iteration)
        metrics = result.metrics
        assert metrics["llm/role"] == seat
        records = env.unwrapped.records
        other = "player_2" if seat == "player_1" else "player_1"
        payoffs = {s: np.array([r.payoffs[s] for r in records]) for s in (seat, other)}
        acts = learner.acts[-len([t for t in env.unwrapped.turns if t.seat == seat]) :]
        for games, rewards in zip(acts, learner.rewards[-len(acts) :], strict=True):
            games = list(games)
            np.testing.assert_allclose(rewards, payoffs[seat][games] + 0.5 * payoffs[other][games])
        merged = game_metrics(result.final_infos, ["llm", "random"], owners, metrics)
        wins = float(np.mean(payoffs[seat] > payoffs[other]))
        assert merged[f"llm/game/{seat}/win_rate"] == merged["llm/game/win_rate"] == pytest.approx(wins)
        assert not any(key.startswith(f"llm/game/{other}/") for key in merged)
        assert {"payoff", "draw_rate", "loss_rate", "illegal_move_rate", "moves_per_game"} <= {
            key.split("/")[-1] for key in merged if key.startswith("llm/game/")
        }


def test_self_play_seats_one_learner_and_reports_each_seat():
    config = config_from_dict(game_config({"seats": ["llm", "llm"], "batch_size": 6}))
    env = build_game_env(config)
    learner = RecordingLearner("llm", pick=lambda names, game: names[0])
    players, opponents = seat_players(config.game, {"llm": learner}, config.seed, config.generation)
    assert list(players) == ["llm", "llm#2"] and players["llm"] is players["llm#2"] is learner and not opponents
    result = run_iteration(env, players, seed=0)
    metrics = result.metrics
    assert learner.updates == 1 and metrics["llm/updates"] == 1.0
    merged = game_metrics(result.final_infos, ["llm", "llm#2"], {"llm": "llm", "llm#2": "llm"}, metrics)
    first, second = merged["llm/game/player_1/win_rate"], merged["llm/game/player_2/win_rate"]
    assert merged["llm/game/win_rate"] == pytest.approx((first + second) / 2)
    assert merged["llm/game/player_1/win_rate"] == pytest.approx(merged["llm/game/player_2/loss_rate"])
    # The loop reports a learner under the name its seats give it: nothing is renamed afterwards.
    named, _ = run_iteration(env, players, seed=1, names={"llm": "main", "llm#2": "main"})
    assert named["main/updates"] == 2.0 and not any(key.startswith("llm/") and key != "llm/role" for key in named)


@pytest.mark.parametrize("seats", [["llm", "llm"], ["llm", "random"]])
def test_role_baselines_wrap_the_env_over_the_learners_slots(seats):
    """Self-play and a learner in one seat against a fixed opponent alike: one baseline per (learner, seat) it
    played; the learner itself is not wrapped, and the baselines are the env's state (what a checkpoint saves)."""
    config = config_from_dict(game_config({"seats": seats, "role_baselines": 0.5}))
    env = build_game_env(config)
    assert isinstance(env, RoleBaselines) and isinstance(env.env, RolePermutation)
    learner = RecordingLearner("llm")
    players, _ = seat_players(config.game, {"llm": learner}, config.seed, config.generation)
    assert players["llm"] is learner
    result = run_iteration(env, players, seed=0)
    played = {"player_1", "player_2"} if seats[1] == "llm" else {"player_1"}
    assert {player for player, _ in env.values} == {"llm"} and {role for _, role in env.values} == played
    metrics = game_metrics(result.final_infos, seat_slots(config.game.seats), {"llm": "llm"}, {})
    assert "llm/game/player_1/win_rate" in metrics
    fresh = build_game_env(config)
    fresh.load_state_dict(*env.state_dict())
    assert fresh.values == env.values


def test_fixed_opponents_of_a_config():
    config = config_from_dict(game_config({"seats": ["llm", "minimax"]}))
    _, opponents = seat_players(config.game, {"llm": RecordingLearner("llm")}, config.seed, config.generation)
    assert isinstance(opponents["minimax"], TicTacToeMinimax)


# --- the snapshot pool in a checkpoint ------------------------------------------------------------------------------


def test_a_snapshot_pool_saves_and_restores_its_snapshots():
    torch.manual_seed(0)
    tokenizer = word_tokenizer(["a", "b", "c"])
    learner = tiny_learner(tokenizer)
    pool = OpponentPool(learner, size=2, name="pool-llm", seed=3)
    for _ in range(3):  # the learner moves, the pool takes a snapshot each time
        with torch.no_grad():
            for parameter in learner.model.parameters():
                parameter.add_(0.01)
        pool.update()
    tensors, meta = pool.state_dict()
    assert meta["size"] == 2 and len(meta["snapshots"]) == 2 and meta["taken"] == 4
    assert {name.split("/")[0] for name in tensors} == {"0", "1"}

    other = OpponentPool(tiny_learner(tokenizer, seed=1), size=2, name="pool-llm", seed=9)
    other.load_state_dict(tensors, meta)
    assert [s.name for s in other.snapshots] == [s.name for s in pool.snapshots]
    assert list(other.snapshots).index(other.current) == list(pool.snapshots).index(pool.current)
    for mine, theirs in zip(pool.snapshots, other.snapshots, strict=True):
        for (name, a), (_, b) in zip(mine.model.named_parameters(), theirs.model.named_parameters(), strict=True):
            assert torch.equal(a, b), name
        assert mine._rng.bit_generator.state == theirs._rng.bit_generator.state
    assert pool._rng.integers(1000) == other._rng.integers(1000)
    with pytest.raises(ValueError, match="keeps 2 snapshots"):
        OpponentPool(learner, size=3).load_state_dict(tensors, meta)


def test_reading_a_game_config_builds_no_game(monkeypatch):
    """A config is read without building its game or enumerating anything: the game is described (built once) when
    it is first needed, by the check before a run, an evaluation or a plan loads (``check_game``)."""
    import marllm.games.settings as settings

    built = []
    real = settings.describe_game
    monkeypatch.setattr(settings, "describe_game", lambda *args: built.append(args) or real(*args))
    config = load_config(ROOT / "examples" / "games" / "kuhn_poker_offline.yaml", ["game.exploitability.every=1"])
    assert built == [] and config.learner_ids == ["llm"]
    config.check_game()
    assert built == [("openspiel:kuhn_poker", None)] and config.game.info.seats == ("player_0", "player_1")
    bad = config_from_dict(game_config({"name": "tictactoe_v9"}))  # read: the name is not looked up
    with pytest.raises(ConfigError, match="unknown game 'tictactoe_v9'"):
        bad.check_game()


def test_two_seats_of_one_opponent_with_different_settings_are_refused_and_eval_plays_the_seats_settings():
    """One player per opponent id: two seats of it with different settings would silently keep the first's."""
    with pytest.raises(ConfigError, match=r"different opponents \(or one with different settings\)"):
        config_from_dict(game_config({"name": "openspiel:kuhn_poker(players=3)", "seats": [
            "llm", {"cfr": {"iterations": 10}}, {"cfr": {"iterations": 500}}]}))  # fmt: skip
    pytest.importorskip("pyspiel")
    seated = {"name": "openspiel:kuhn_poker", "seats": ["llm", {"cfr": {"iterations": 7}}]}
    assert fixed_player(config_from_dict(game_config(seated)).game, "cfr", "cfr", seed=0).iterations == 7
    kuhn = load_config(ROOT / "examples" / "games" / "kuhn_poker_offline.yaml").game  # seats no cfr: its defaults
    assert fixed_player(kuhn, "cfr", "cfr", seed=0).iterations == 100
