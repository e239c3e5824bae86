"""marllm.testing.check_game_env on every built-in game env (each PettingZoo classic game marllm plays, and an
OpenSpiel game of each view: a few games per batch, a few episodes), and failing on envs that break a rule."""

from __future__ import annotations

import importlib.util
import random

import pytest

from marllm.games.env import BatchedGameEnv, GameView, env
from marllm.games.env.factory import game_factory, playable_classic_games
from marllm.testing import check_game_env

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

needs_openspiel = pytest.mark.skipif(
    importlib.util.find_spec("pyspiel") is None or importlib.util.find_spec("shimmy") is None,
    reason="needs the optional open_spiel and shimmy (pip install 'marllm[games]')",
)
OPTIONS = {"rps_v2": {"max_cycles": 2}}  # rock-paper-scissors' default lasts 150 rounds
OPENSPIEL = [
    "kuhn_poker",  # KuhnPokerView
    "leduc_poker",  # LeducPokerView
    "liars_dice",  # LiarsDiceView
    "matrix_pd",  # MatrixGameView
    "repeated_game(stage_game=matrix_pd(),num_repetitions=3)",  # MatrixGameView, repeated
    "tic_tac_toe",  # the generic OpenSpiel view
    "tiny_hanabi",  # the generic view of a cooperative game
    "blotto",  # simultaneous moves, many of them
    "first_sealed_auction",  # chance deals values, then simultaneous-style bids
]
GAMES = [pytest.param(name, id=name) for name in playable_classic_games()] + [
    pytest.param(f"openspiel:{name}", id=name.split("(")[0], marks=needs_openspiel) for name in OPENSPIEL
]


def maker(name: str, batch_size: int = 2, cls: type[BatchedGameEnv] = BatchedGameEnv, **kwargs):
    factory = game_factory(name, OPTIONS.get(name))
    return lambda: cls(factory, batch_size, illegal="random", **kwargs)


@pytest.mark.parametrize("name", GAMES)
def test_every_built_in_game_env_passes(name):
    report = check_game_env(maker(name), num_cycles=10, episodes=2)
    assert set(report) == {
        "pettingzoo_api_test", "pettingzoo_seed_test", "rows_match_mask", "finished_games_masked",
        "same_seed_same_deals", "legal_moves_playable", "every_game_ends",
    }  # fmt: skip
    assert not any(value.startswith("not run") for value in report.values()), report


def test_the_order_enforcing_factory_and_a_plain_aec_env_are_checked_too():
    factory = game_factory("tictactoe_v3")
    wrapped = check_game_env(lambda: env(game_fn=factory, batch_size=2), num_cycles=5, episodes=1)
    assert wrapped["same_seed_same_deals"] == "1 seeds each dealt alike twice"
    plain = check_game_env(factory, num_cycles=5)  # PettingZoo's tests only
    assert plain["rows_match_mask"].startswith("not run: raw_env is not a marllm.games.env.BatchedGameEnv")


class AsksFinishedGames(BatchedGameEnv):
    """Asks a seat to move in games that are over, as long as the game names it to move."""

    def to_move(self, seat):
        return [b for b in range(self.batch_size) if self.games[b].agent_selection == seat]


class MasksEveryGame(BatchedGameEnv):
    def _update_masks(self):
        super()._update_masks()
        for seat in self.agents:
            self.infos[seat]["action_mask"][:] = 1


class ListsEverySquare(GameView):
    """Tic-tac-toe's squares, taken or not."""

    def legal_actions(self, game, seat):
        return list(range(9))


class DealsAtRandom(BatchedGameEnv):
    """Ignores the seed it is reset with."""

    def reset(self, seed=None, options=None):
        super().reset(seed=random.randrange(2**31), options=options)


@pytest.mark.parametrize(
    ("make", "complaint"),
    [
        (maker("tictactoe_v3", 4, AsksFinishedGames), r"which is over: a finished game is masked"),
        (maker("tictactoe_v3", 4, MasksEveryGame), r"are in the masks of 'player_1' and 'player_2' at once"),
        (maker("tictactoe_v3", 2, view=ListsEverySquare()), r"legal actions .* are not the game's"),
        pytest.param(
            maker("openspiel:kuhn_poker", 2, DealsAtRandom),
            r"reset with seed \d+ and answered alike deal other games",
            marks=needs_openspiel,
        ),
    ],
    ids=["finished game asked to move", "mask of every game", "a taken square listed", "seed ignored"],
)
def test_the_check_fails_on_an_env_that_breaks_a_rule(make, complaint):
    with pytest.raises(AssertionError, match=complaint):
        check_game_env(make, num_cycles=5, episodes=2)
