"""Review findings on games, each pinned: an opponent of one's own that answers illegally is counted, logged and
warned about; an opponent that fails to build, a game factory by reference that breaks the AEC contract, a
``lambda_trend.py --json`` path that cannot be written, a run without metrics and an env that breaks a rule of
``check_game_env`` each say in one line what was wrong and what is valid; and a fixed player asked for free text names
``marllm eval --opponent self``."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from gymnasium.spaces import Discrete
from pettingzoo import AECEnv

from marllm.config import ConfigError, config_from_dict
from marllm.games.env import BatchedGameEnv
from marllm.games.env.factory import game_factory
from marllm.games.players import RandomMover
from marllm.games.seats import opponent_slots, seat_players
from marllm.games.training import build_game_env, game_metrics, game_metrics_hook
from marllm.loop import run_iteration
from marllm.testing import check_game_env
from marllm.utils.imports import load_reference
from tests.test_games_config import game_config
from tests.test_games_training import RecordingLearner
from tests.test_probe_findings import _dilemma_study, _run_lambda_trend, load_lambda_trend

ROOT = Path(__file__).resolve().parents[1]
needs_openspiel = pytest.mark.skipif(
    importlib.util.find_spec("pyspiel") is None or importlib.util.find_spec("shimmy") is None,
    reason="needs the optional open_spiel and shimmy (pip install 'marllm[games]')",
)

# --- 11. an opponent of one's own that answers illegally -------------------------------------------------------

OPPONENTS = '''
from marllm.games.players.fixed import FixedPlayer


class EveryThirdFolds(FixedPlayer):
    """Answers "Fold", no move of Kuhn poker's (Pass, Bet), on every third row; else the first legal move."""

    def __init__(self, name, seed=0):
        super().__init__(name)
        self.rows = 0

    def choose(self, names, actions, history):
        self.rows += 1
        return "Fold" if self.rows % 3 == 0 else names[0]


class Broken(FixedPlayer):
    """Reads a setting it was never given."""

    def __init__(self, name, seed=0):
        super().__init__(name)
        self.strength = {}["strength"]

    def choose(self, names, actions, history):
        return names[0]
'''


def opponents_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_opponents.py"
    path.write_text(OPPONENTS)
    return path


def kuhn_against(tmp_path: Path, opponent: str, **game):
    """A Kuhn poker config: a learner in seat 0 against ``opponent`` (a class of :data:`OPPONENTS`) in seat 1."""
    seats = ["llm", f"{opponents_file(tmp_path)}:{opponent}"]
    return config_from_dict(game_config({"name": "openspiel:kuhn_poker", "seats": seats, "batch_size": 6, **game}))


def illegal_rate(env: BatchedGameEnv, seat: str) -> float:
    return sum(r.illegal[seat] for r in env.records) / sum(r.answers[seat] for r in env.records)


@needs_openspiel
@pytest.mark.parametrize("illegal", ["forfeit", "random"])
def test_an_opponents_illegal_answers_are_logged_per_seat_and_warned_about_once(tmp_path, illegal):
    """Before, the run logged nothing of them: only the learners' slots reached the metrics, and nothing warned."""
    config = kuhn_against(tmp_path, "EveryThirdFolds", illegal=illegal)
    env = build_game_env(config)
    players, _ = seat_players(config.game, {"llm": RecordingLearner("llm")}, config.seed, config.generation)
    hook = game_metrics_hook(config.game)
    with pytest.warns(UserWarning, match=r"opponent 'EveryThirdFolds' does not learn and answered illegally") as seen:
        result = run_iteration(env, players, seed=0)
        merged = hook(result.metrics, result.final_infos)
    [warning] = [w for w in seen if "EveryThirdFolds" in str(w.message)]
    assert f"game.illegal: {illegal}" in str(warning.message) and "check_player" in str(warning.message)
    seat = env.role_of["EveryThirdFolds"]  # the opponent's slot is named after its class
    expected = illegal_rate(env.unwrapped, seat)
    assert expected > 0
    assert merged[f"EveryThirdFolds/game/{seat}/illegal_move_rate"] == pytest.approx(expected)
    assert merged["EveryThirdFolds/game/illegal_move_rate"] == pytest.approx(expected)
    forfeits = np.mean([r.forfeited_by == seat for r in env.unwrapped.records])
    assert merged[f"EveryThirdFolds/game/{seat}/forfeit_rate"] == pytest.approx(forfeits)
    assert (forfeits > 0) == (illegal == "forfeit")
    assert merged["llm/game/illegal_move_rate"] == 0.0  # the learner's own, unchanged
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per opponent and run: the next iteration logs, and says nothing
        second = run_iteration(env, players, seed=1)
        again = hook(second.metrics, second.final_infos)
    assert again["EveryThirdFolds/game/illegal_move_rate"] > 0


def test_a_built_in_opponent_logs_no_illegal_answer_and_no_warning():
    config = config_from_dict(game_config())  # tic-tac-toe, llm against random
    env = build_game_env(config)
    players, _ = seat_players(config.game, {"llm": RecordingLearner("llm")}, config.seed, config.generation)
    assert opponent_slots(config.game) == {"random": "random"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = run_iteration(env, players, seed=0)
        merged = game_metrics_hook(config.game)(result.metrics, result.final_infos)
    assert merged["random/game/illegal_move_rate"] == 0.0 and merged["random/game/forfeit_rate"] == 0.0
    seats = {key.split("/")[2] for key in merged if key.startswith("random/game/player_")}
    assert len(seats) == 1 and seats <= {"player_1", "player_2"}


def test_game_metrics_without_an_opponent_mapping_reports_every_other_slot_under_its_own_id():
    config = config_from_dict(game_config())
    env = build_game_env(config)
    players, _ = seat_players(config.game, {"llm": RecordingLearner("llm")}, config.seed, config.generation)
    result = run_iteration(env, players, seed=0)
    merged = game_metrics(result.final_infos, ["llm", "random"], {"llm": "llm"}, result.metrics)
    assert "random/game/illegal_move_rate" in merged and "llm/game/win_rate" in merged


# --- 12. one line, naming what was wrong and what is valid -----------------------------------------------------


def test_an_opponent_whose_constructor_raises_names_itself_its_seat_and_the_line(tmp_path):
    """Before: the KeyError itself escaped, a traceback naming neither the opponent nor its seat."""
    config = config_from_dict(
        game_config({"seats": ["llm", f"{opponents_file(tmp_path)}:Broken"]})  # the config loads: it builds nothing
    )
    with pytest.raises(ValueError) as raised:
        seat_players(config.game, {"llm": RecordingLearner("llm")}, config.seed, config.generation)
    message = str(raised.value)
    assert message.startswith("game.seats[1]: building the opponent ")
    assert f"{tmp_path / 'my_opponents.py'}:Broken" in message and "(player 'Broken')" in message
    assert "failed at my_opponents.py:" in message and "in __init__: KeyError: 'strength'" in message
    assert isinstance(raised.value.__cause__, KeyError) and "\n" not in message


GAMES = '''
import numpy as np
from gymnasium.spaces import Discrete
from pettingzoo import AECEnv


class OneMove(AECEnv):
    """Seat a moves once and wins."""

    metadata = {"name": "one_move_v0", "render_modes": [], "is_parallelizable": False}

    def __init__(self):
        super().__init__()
        self.possible_agents = ["a", "b"]

    def observation_space(self, agent):
        return Discrete(1)

    def action_space(self, agent):
        return Discrete(2)

    def reset(self, seed=None, options=None):
        self._start(list(self.possible_agents))

    def _start(self, agents):
        self.agents = agents
        self.agent_selection = agents[0]
        self.rewards = dict.fromkeys(agents, 0)
        self._cumulative_rewards = dict.fromkeys(agents, 0)
        self.terminations = dict.fromkeys(agents, False)
        self.truncations = dict.fromkeys(agents, False)
        self.infos = {agent: {} for agent in agents}

    def observe(self, agent):
        return 0

    def step(self, action):
        self.rewards = {agent: (1 if agent == self.agent_selection else -1) for agent in self.agents}
        self.terminations = dict.fromkeys(self.agents, True)
        self._accumulate_rewards()


class OtherAgents(OneMove):
    def reset(self, seed=None, options=None):
        self._start(["x", "y"])


class OneOtherAgent(OneMove):
    def reset(self, seed=None, options=None):
        self._start(["a", "z"])


class NoActionSpace(OneMove):
    def action_space(self, agent):
        return None


def returns_none():
    return None
'''


def games_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_games.py"
    path.write_text(GAMES)
    return path


def test_a_game_factory_that_returns_none_is_a_config_error_naming_it(tmp_path):
    """Before: AttributeError ('NoneType' object has no attribute 'close') while the config was checked."""
    name = f"{games_file(tmp_path)}:returns_none"
    with pytest.raises(
        ConfigError, match=r"game.name: .*my_games.py:returns_none returned NoneType, not a PettingZoo AEC"
    ):
        config_from_dict(game_config({"name": name})).check_game()


@pytest.mark.parametrize(
    ("factory", "agents", "unknown"),
    [("OtherAgents", "['x', 'y']", "['x', 'y']"), ("OneOtherAgent", "['a', 'z']", "['z']")],
)
def test_a_game_whose_reset_sets_agents_it_does_not_have_says_which(tmp_path, factory, agents, unknown):
    """Before: a misleading "every game of the batch was over at reset", or a KeyError of the seat mid-game."""
    env = BatchedGameEnv(game_factory(f"{games_file(tmp_path)}:{factory}"), 2)
    with pytest.raises(ValueError) as raised:
        env.reset(seed=0)
    message = str(raised.value)
    assert message.startswith("game 0 of the batch (one_move_v0): after reset() its agents are " + agents)
    assert f"and {unknown} are not among its possible_agents ['a', 'b']" in message


def test_a_game_without_a_discrete_action_space_says_what_a_batched_game_needs(tmp_path):
    """Before: a TypeError, which the command line shows as a traceback."""
    env = BatchedGameEnv(game_factory(f"{games_file(tmp_path)}:NoActionSpace"), 2)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"seat 'a' has action space None, which is not Discrete.*must return a gym"):
        env.observe("a")


def test_lambda_trend_json_naming_a_directory_is_one_line_and_a_missing_folder_is_made(tmp_path, capsys, monkeypatch):
    """Before: IsADirectoryError and FileNotFoundError tracebacks, after the summary was printed."""
    study = _dilemma_study(tmp_path / "study", iterations=2)
    folder = tmp_path / "out"
    folder.mkdir()
    with pytest.raises(SystemExit) as exited:
        _run_lambda_trend(monkeypatch, str(study), "--json", str(folder))
    assert exited.value.code == 2
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert captured.out == "" and f"--json {folder} is a directory; give the file" in line
    target = tmp_path / "missing" / "deeper" / "trend.json"
    _run_lambda_trend(monkeypatch, str(study), "--json", str(target))
    assert json.loads(target.read_text())["runs"] == 2
    file = tmp_path / "a_file"
    file.write_text("")
    with pytest.raises(SystemExit):
        _run_lambda_trend(monkeypatch, str(study), "--json", str(file / "trend.json"))
    assert f"{file} is a file, not a folder" in capsys.readouterr().err


def test_lambda_trend_names_the_runs_it_skipped_for_lack_of_metrics(tmp_path, capsys, monkeypatch):
    """Before: a run without metrics.jsonl (not started, or failed early) was left out without a word."""
    trend = load_lambda_trend()
    study = _dilemma_study(tmp_path, iterations=2)
    (study / "runs" / "lambda_0.5").mkdir()
    (study / "runs" / "lambda_0.5" / "config.yaml").write_text("agents: {reward_coefficients: 0.5}\n")
    (study / "runs" / "notes.txt").write_text("not a run")
    summary = trend.summarise(study, 2)
    assert summary["runs"] == 2 and summary["skipped_runs"] == ["lambda_0.5"]
    _run_lambda_trend(monkeypatch, str(study))
    err = capsys.readouterr().err
    assert "warning: skipped 1 run(s)" in err and "without metrics.jsonl" in err and err.rstrip().endswith("lambda_0.5")


class PickOnce(AECEnv):
    """a then b pick 0 or 1 once each; a wins. Legal moves in each info's action_mask (both, always)."""

    metadata = {"name": "pick_once_v0", "render_modes": [], "is_parallelizable": False}

    def __init__(self):
        super().__init__()
        self.possible_agents = ["a", "b"]

    def observation_space(self, agent):
        return Discrete(1)

    def action_space(self, agent):
        return Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.agent_selection = "a"
        self.moves = 0
        self.rewards = dict.fromkeys(self.agents, 0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {agent: {"action_mask": np.array([1, 1], dtype=np.int8)} for agent in self.agents}

    def observe(self, agent):
        return 0

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self.take(action)
        self._cumulative_rewards[agent] = 0
        self.moves += 1
        if self.moves == 2:
            self.rewards = {"a": 1, "b": -1}
            self.end()
        else:
            self._clear_rewards()
            self.agent_selection = "b"
        self._accumulate_rewards()

    def take(self, action):
        pass

    def end(self):
        self.terminations = dict.fromkeys(self.agents, True)


class RefusesOne(PickOnce):
    """Its mask allows action 1, and its step refuses it."""

    def take(self, action):
        if action == 1:
            raise ValueError("action 1 is not allowed")


class TwoMasks(PickOnce):
    """Its observation's mask allows action 0 only, its info's both."""

    def observe(self, agent):
        return {"observation": 0, "action_mask": np.array([1, 0], dtype=np.int8)}


class BNeverEnds(PickOnce):
    """Ends a's part only: b goes on moving for ever."""

    def end(self):
        self.terminations["a"] = True
        self.agent_selection = "b"


class BHasNoMove(PickOnce):
    """Ends a's part only, and leaves b to move with an empty mask."""

    def end(self):
        self.terminations["a"] = True
        self.agent_selection = "b"
        self.infos["b"]["action_mask"] = np.zeros(2, dtype=np.int8)


def test_a_well_behaved_game_passes_the_check_with_the_new_rules():
    report = check_game_env(lambda: BatchedGameEnv(PickOnce, 2, max_moves=20), num_cycles=5, episodes=2)
    assert report["legal_moves_playable"].startswith("every move") and report["every_game_ends"].startswith("every")


@pytest.mark.parametrize(
    ("game", "complaint"),
    [
        (
            RefusesOne,
            r"seat '[ab]', game \d: the game's step raised ValueError: action 1 is not allowed on the move '1' "
            r"\(action 1\), which its mask allows \(rule: legal moves are playable",
        ),
        (
            TwoMasks,
            r"observation action_mask allows actions \[0\] and its info's action_mask \[0, 1\] \(rule: legal moves "
            r"are playable",
        ),
        (BNeverEnds, r"were still on after 20 answers .* the seats \['b'\] never terminated \(rule: every game ends"),
        (BHasNoMove, r"seat 'b', game \d: the seat is to move and the game allows it no move .*rule: every game ends"),
    ],
    ids=["mask allows what step refuses", "masks disagree", "a seat never terminates", "a seat left with no move"],
)
def test_the_check_names_the_rule_a_game_breaks_instead_of_letting_its_error_escape(game, complaint):
    """Before: the game's ValueError escaped, the two masks passed, and the endless game passed with a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the move cap's warning is the check's to report, as a rule
        with pytest.raises(AssertionError, match=complaint):
            check_game_env(lambda: BatchedGameEnv(game, 2, max_moves=20), num_cycles=5, episodes=2)


# --- 13. a fixed player asked for free text names --opponent self ------------------------------------------------


def test_a_random_opponent_at_deal_or_no_deals_free_text_turn_names_opponent_self():
    """What ``marllm eval`` of Deal or no deal says with its default opponent (random): a learner, or
    ``--opponent self``, which works."""
    factory = load_reference(f"{ROOT / 'examples' / 'deal_or_no_deal' / 'deal_or_no_deal.py'}:env")
    env = BatchedGameEnv(factory, 2, templates="{state}", seed=0)
    env.reset(seed=0)
    observation = env.observe(env.agent_selection)
    assert not any(observation["legal_moves"])  # its first turn is a message
    with pytest.raises(ValueError, match=r"seat a learner there.*marllm eval --opponent self plays it in every seat"):
        RandomMover("random").act(observation)
