"""A game that never ends is ended as a draw at ``max_moves`` (issue 35, item 4), with a warning and a metric, instead
of hanging the run; the cap defaults to the game's own bound where it has one."""

from __future__ import annotations

import numpy as np
import pytest

from marllm.config import config_from_dict
from marllm.games.env import BatchedGameEnv
from marllm.games.env.checks import DEFAULT_MAX_MOVES
from marllm.games.training import build_game_env
from tests.test_games_env import CountdownGame, first_legal, kuhn, needs_openspiel, play


class EndlessGame(CountdownGame):
    """A user's game with a bug: the total never grows, so nobody ever reaches the target."""

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0
        self._clear_rewards()
        self.agent_selection = self.agents[(self.agents.index(agent) + 1) % len(self.agents)]
        self._masks()
        self._accumulate_rewards()


def test_a_game_that_never_ends_is_a_draw_at_max_moves_with_a_warning_and_a_metric():
    environment = BatchedGameEnv(EndlessGame, 3, max_moves=7)
    with pytest.warns(UserWarning, match=r"^3 of 3 games reached max_moves \(7 answers\) without ending and were "
                                         r"ended as draws \(payoff 0 to every seat\): raise game.max_moves"):
        moves, final = play(environment, first_legal)
    assert all(record.capped and record.length == 7 for record in environment.records) and len(moves) >= 7
    for seat in environment.possible_agents:
        assert final[seat]["outcomes"].tolist() == [0, 0, 0] and final[seat]["payoffs"].tolist() == [0.0] * 3
        assert final[seat]["metrics"]["capped_rate"] == 1.0 and final[seat]["metrics"]["draw_rate"] == 1.0


def test_games_that_end_are_not_capped_and_the_cap_defaults_to_the_games_own():
    environment = BatchedGameEnv(CountdownGame, 2)
    assert environment.max_moves == DEFAULT_MAX_MOVES
    _, final = play(environment, first_legal)
    assert final["p0"]["metrics"]["capped_rate"] == 0.0 and not any(r.capped for r in environment.records)
    with pytest.raises(ValueError, match=r"max_moves must be a positive int \(moves per game\) or None, got 0"):
        BatchedGameEnv(CountdownGame, 2, max_moves=0)


@needs_openspiel
def test_an_openspiel_game_is_capped_by_its_own_maximum_length():
    assert BatchedGameEnv(kuhn, 1).max_moves == 3 * 2  # its length times its players: a bound on answers


def test_game_max_moves_in_a_config_reaches_the_env(tiny_lm_dir):
    data = {
        "model": {"name_or_path": str(tiny_lm_dir), "device": "cpu"},
        "game": {"name": "tictactoe_v3", "seats": ["llm", "random"], "batch_size": 2, "max_moves": 4},
        "ppo": {"batching": {"mini_batch_size": 1}},
    }
    assert build_game_env(config_from_dict(data)).unwrapped.max_moves == 4
    data["game"]["max_moves"] = 0
    with pytest.raises(ValueError, match=r"game.max_moves must be an integer >= 1 \(answers per game\) or null, got 0"):
        config_from_dict(data)


def test_a_capped_game_is_a_draw_even_after_moves_that_paid():
    environment = BatchedGameEnv(EndlessGame, 1, max_moves=1)
    with pytest.warns(UserWarning, match="1 of 1 games"):
        _, final = play(environment, first_legal)
    assert np.array_equal(final["p1"]["outcomes"], [0])
