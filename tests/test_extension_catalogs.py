"""The opponents and action-mode registries (one mechanism, :mod:`marllm.utils.registry`), read by the config
checks and the builders alike, without torch; an opponent or an action mode of one's own is one file named by
reference, trains with no other edit and passes its public check (marllm.testing)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from marllm.algorithms.action_modes import ActionMode
from marllm.algorithms.action_registry import ACTION_MODE_REGISTRY as MODES
from marllm.algorithms.action_registry import collector_class
from marllm.cli import main
from marllm.config import ConfigError, load_config
from marllm.games.env import BatchedGameEnv
from marllm.games.env.factory import game_factory
from marllm.games.opponents import NEEDS
from marllm.games.opponents import OPPONENT_REGISTRY as OPPONENTS
from marllm.testing import check_collector, check_player
from marllm.utils.imports import load_reference
from tests.test_collector_check import OBSERVATION
from tests.test_learner_conformance import tiny_learner

ROOT = Path(__file__).resolve().parents[1]
GAMES = ROOT / "examples" / "games"
PACKAGE = ROOT / "marllm"

# An opponent of one's own: the first legal move, in one file.
OPPONENT = '''
from marllm.games.players.fixed import FixedPlayer


class FirstMover(FixedPlayer):
    """Plays the first legal move."""

    needs = ("tic_tac_toe",)
    built = []

    def __init__(self, name, seed=0):
        super().__init__(name)
        FirstMover.built.append((name, seed))

    def choose(self, names, actions, history):
        return names[0]


NOT_A_PLAYER = 3
'''

# An action mode of one's own: constrained moves under a name of its own, in one file.
MODE = '''
from marllm.algorithms.actions import ConstrainedCollector


class MyConstrained(ConstrainedCollector):
    """Constrained moves, as a mode of one's own."""

    actions = "my_constrained"
    summary = "a legal move's name, restricted token by token"


class NotACollector:
    actions = "nothing"
'''


def project(tmp_path: Path, example: str, **game: object) -> Path:
    """A folder holding the extension files and a config from ``example`` with ``game`` set, as a user's would."""
    (tmp_path / "my_opponent.py").write_text(OPPONENT)
    (tmp_path / "my_mode.py").write_text(MODE)
    data = yaml.safe_load((GAMES / example).read_text())
    data["game"].update(batch_size=2, **game)
    data.update(iterations=1, run_dir=str(tmp_path / "run"))
    data["logging"] = {**data.get("logging", {}), "progress": False, "tensorboard": False}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def metrics_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_an_opponent_class_in_a_file_beside_the_config_trains_and_passes_its_check(tmp_path, monkeypatch):
    path = project(tmp_path, "tictactoe_offline.yaml", seats=["llm", "my_opponent.py:FirstMover"])
    monkeypatch.chdir(tmp_path.parent)  # the reference is relative to the config's folder, not the working directory
    config = load_config(path)
    assert config.game.seats[1].kind == f"{tmp_path / 'my_opponent.py'}:FirstMover"
    assert main(["train", str(path)]) == 0
    player = load_reference(config.game.seats[1].kind)
    assert player.built == [("FirstMover", config.seed + 10_001)]  # seeded as a built-in opponent of seat 1
    assert len(metrics_of(tmp_path / "run")) == 1
    check_player(lambda: player("first", seed=0), lambda: BatchedGameEnv(game_factory("tictactoe_v3"), 3))


def test_an_action_mode_in_a_file_beside_the_config_trains_and_passes_its_check(tmp_path, monkeypatch):
    path = project(tmp_path, "tictactoe_constrained_offline.yaml", actions="my_mode.py:MyConstrained")
    monkeypatch.chdir(tmp_path.parent)
    config = load_config(path)
    mode = config.game.actions.mode
    assert mode == f"{tmp_path / 'my_mode.py'}:MyConstrained" and config.game.actions.facts.ends_with_eos
    assert main(["train", str(path)]) == 0
    rows = metrics_of(tmp_path / "run")
    assert len(rows) == 1 and rows[0]["llm/game/illegal_move_rate"] == 0.0
    assert type(tiny_learner(None, "ppo", mode).collector).__name__ == "MyConstrained"
    check_collector(lambda: tiny_learner(None, "ppo", mode).collector, OBSERVATION, samples=400)


@pytest.mark.parametrize(
    ("game", "message"),
    [
        ({"seats": ["llm", "gone.py:FirstMover"]}, r"game.seats\[1\]: '.*gone.py:FirstMover' is not a seat.*does not"),
        ({"seats": ["llm", "my_opponent.py:Missing"]}, r"game.seats\[1\]: .*has no 'Missing'"),
        ({"seats": ["llm", "my_opponent.py:NOT_A_PLAYER"]}, r"game.seats\[1\]: .*NOT_A_PLAYER is not callable"),
        ({"name": "rps_v2", "seats": ["llm", "my_opponent.py:FirstMover"]}, r"FirstMover plays tic-tac-toe only"),
        ({"actions": "gone.py:MyConstrained"}, r"game.actions: '.*gone.py.* names the file .*gone.py, which does not"),
        ({"actions": "my_mode.py:NotACollector"}, r"NotACollector' is not a collector class"),
        ({"actions": "sample"}, r"game.actions: unknown action mode 'sample'; one of \['generate', .* by reference"),
    ],
)
def test_a_bad_reference_is_a_config_error_naming_its_key(tmp_path, game, message):
    with pytest.raises(ConfigError, match=message):
        load_config(project(tmp_path, "tictactoe_offline.yaml", **game)).check_game()


def test_every_collector_class_has_its_registered_modes_facts():
    facts = [name for name in vars(ActionMode) if not name.startswith("_") and name not in ("name", "implementation")]
    for name, entry in MODES.builtins().items():
        cls = collector_class(name, "test")
        assert issubclass(cls, entry) and cls.actions == name
        assert {fact: getattr(cls, fact) for fact in facts} == {fact: getattr(entry, fact) for fact in facts}
    assert [f.name for f in fields(MODES.builtins()["score"].Settings)] == ["normalization"]


def test_every_opponent_entry_builds_from_its_implementation_and_needs_known_needs():
    for entry in OPPONENTS.builtins().values():
        assert callable(getattr(load_reference(entry.implementation), "from_seat", None))
        assert set(entry.needs) <= set(NEEDS)
        assert entry.Settings is None or all(f.default is not None for f in fields(entry.Settings))


def test_the_registries_load_no_torch():
    code = "import sys, marllm.algorithms.action_registry, marllm.games.opponents; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_no_module_dispatches_on_a_seat_kind_or_an_action_mode_by_its_name():
    """The names live in their catalogs: no other module compares a value with one (``illegal: random`` is the
    illegal-answer policy, not an opponent)."""
    names = "|".join(sorted({*OPPONENTS, *MODES, "learner"}))
    compared = re.compile(rf"(==|!=) *[\"']({names})[\"']|\bin \([^)]*[\"']({names})[\"']")
    catalogs = {"algorithms/action_modes.py", "algorithms/action_registry.py", "games/opponents.py"}
    found = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if str(path.relative_to(PACKAGE)) not in catalogs
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if compared.search(line) and "illegal" not in line
    ]
    assert not found, found


def test_each_modes_kl_says_which_tokens_are_restricted():
    """``<learner>/kl`` is described by its mode: free text's over the whole vocabulary, a constrained move's over
    the legal moves' continuations, a thought's over the whole vocabulary and then its move's restricted."""
    for logprobs_from in ("tempered", "sampling"):
        text, move, thought = (
            collector_class(name, "test").kl[logprobs_from] for name in ("generate", "constrained", "think")
        )
        assert "restricted to the legal moves" not in text and "restricted to the legal moves" in move
        assert "thought's tokens" in thought
        assert "restricted to the legal moves' continuations over the move's" in thought


def test_two_opponent_classes_of_one_name_are_told_apart_before_they_share_a_player(tmp_path):
    """Two files' classes of the same name would be seated and logged as one player: refused, naming both."""
    pytest.importorskip("pyspiel")
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "my_opponent.py").write_text(OPPONENT.replace('needs = ("tic_tac_toe",)', "needs = ()"))
    data = yaml.safe_load((GAMES / "kuhn_poker_offline.yaml").read_text())
    data["game"].update(
        name="openspiel:kuhn_poker(players=3)",
        seats=["llm", "one/my_opponent.py:FirstMover", "two/my_opponent.py:FirstMover"],
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    shared = r"different opponents \(or one with different settings\) whose players would share the id"
    with pytest.raises(ConfigError, match=shared):
        load_config(path)
