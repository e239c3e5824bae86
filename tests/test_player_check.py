"""marllm.testing.check_player on every built-in opponent (random, minimax, MCTS, CFR, a best response and a
snapshot pool, at small games and few episodes), and failing on players that break what it checks."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from marllm.games.env import BatchedGameEnv
from marllm.games.env.factory import game_factory
from marllm.games.players import OpponentPool, RandomMover, TicTacToeMinimax
from marllm.testing import CheckNotApplicable, check_player
from tests.test_learner_conformance import tiny_learner

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

needs_openspiel = pytest.mark.skipif(
    importlib.util.find_spec("pyspiel") is None or importlib.util.find_spec("shimmy") is None,
    reason="needs the optional open_spiel and shimmy (pip install 'marllm[games]')",
)


def game(name: str, batch_size: int = 3, **kwargs):
    factory = game_factory(name, {"max_cycles": 2} if name == "rps_v2" else None)
    return lambda: BatchedGameEnv(factory, batch_size, illegal="random", **kwargs)


def mcts():
    from marllm.games.players.mcts import MCTSPlayer

    return MCTSPlayer("tic_tac_toe", simulations=8, seed=4)


def cfr():
    from marllm.games.players.tabular import CFRPlayer

    return CFRPlayer("kuhn_poker", iterations=10, seed=5)


def best_response():
    from marllm.games.players.tabular import BestResponsePlayer, cfr_average_policy

    return BestResponsePlayer("kuhn_poker", lambda: cfr_average_policy("kuhn_poker", 10), seed=6)


def snapshot_pool():
    return OpponentPool(tiny_learner(None, "ppo", "generate"), size=2, name="pool", seed=7)


BUILT_IN = [
    pytest.param(lambda: RandomMover(seed=1), "tictactoe_v3", {}, id="random"),
    pytest.param(lambda: RandomMover(seed=1), "openspiel:kuhn_poker", {}, id="random-kuhn", marks=needs_openspiel),
    pytest.param(lambda: TicTacToeMinimax(seed=2), "tictactoe_v3", {}, id="minimax"),
    # OpenSpiel's MCTS keeps its search generator to itself: a resumed run's MCTS seat searches afresh (documented).
    pytest.param(mcts, "tictactoe_v3", {"seats": ["player_2"], "resumes": False}, id="mcts", marks=needs_openspiel),
    pytest.param(cfr, "openspiel:kuhn_poker", {}, id="cfr", marks=needs_openspiel),
    pytest.param(best_response, "openspiel:kuhn_poker", {"seats": ["player_1"]}, id="best_response",
                 marks=needs_openspiel),
    pytest.param(snapshot_pool, "rps_v2", {"legal_answers": False}, id="snapshot_pool"),  # free text
]  # fmt: skip
SHORT = {"templates": "Take {move_names}:"}  # prompts a tiny model's context holds


@pytest.mark.parametrize(("make", "name", "options"), BUILT_IN)
def test_every_built_in_opponent_passes(make, name, options):
    report = check_player(make, game(name, **SHORT), **options)
    assert set(report) == {"protocol", "legal_answers", "deterministic", "resumes"}
    assert report["resumes"].startswith("not run") == (options.get("resumes") is False), report


@needs_openspiel
def test_the_resume_check_sees_what_mcts_leaves_out_of_its_state():
    with pytest.raises(AssertionError, match=r"mcts: a player restored from another's state_dict"):
        check_player(mcts, game("tictactoe_v3"), seats=["player_2"])


class AnswersAnyName(RandomMover):
    def choose(self, names, actions, history):
        return "the centre" if len(names) > 3 else super().choose(names, actions, history)


class UnseededMover(RandomMover):
    def choose(self, names, actions, history):
        return names[np.random.default_rng().integers(len(names))]


class ForgetsItsGenerator(RandomMover):
    def state_dict(self):
        return {}, {"name": self.name}


class AnswersOneRow(RandomMover):
    def act(self, observation, role=None):
        return super().act(observation, role)[:1]


@pytest.mark.parametrize(
    ("player", "complaint"),
    [
        (AnswersAnyName, r"answered 'the centre' in seat 'player_1', game 0: not one of its legal moves"),
        (UnseededMover, r"a second player built alike answers otherwise: not deterministic under its seed"),
        (ForgetsItsGenerator, r"restored from another's state_dict after episode 1 answers episode 2 otherwise"),
        (AnswersOneRow, r"not one string for each of its 3 rows"),
    ],
    ids=["illegal answer", "unseeded", "state without its generator", "one answer for three rows"],
)
def test_the_check_fails_on_a_player_that_breaks_the_protocol(player, complaint):
    with pytest.raises(AssertionError, match=complaint):
        check_player(lambda: player("broken", seed=1), game("tictactoe_v3"))


def test_a_player_without_the_learner_protocol_is_told_what_it_lacks():
    class OnlyActs:
        name = "only-acts"

        def act(self, observation, role=None):
            return tuple(moves[0] for moves in observation["legal_moves"])

    with pytest.raises(CheckNotApplicable, match=r"OnlyActs lacks \['finish', 'update', 'activate'"):
        check_player(OnlyActs, game("tictactoe_v3"))


def test_a_fixed_player_asked_for_free_text_says_what_to_seat_there():
    """A game's free-text turn (no legal move listed) cannot be played by a player that chooses among moves."""
    from marllm.games.players import RandomMover

    observation = {"legal_moves": [[], ["a"]], "legal_actions": [[], [0]], "history": [(), ()]}
    with pytest.raises(ValueError, match="asks it for free text .* seat a learner there"):
        RandomMover("random").answer(observation)
