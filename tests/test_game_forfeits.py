"""A forfeit in a zero-sum game keeps it zero-sum (issue 35, item 7): the forfeiting seat gets the game's loss and the
others what winning pays, in training and in evaluation alike (both play through BatchedGameEnv); a general-sum game
(the prisoner's dilemma) gives the others 0, as a forfeit pays them nothing there."""

from __future__ import annotations

import pytest
from pettingzoo.classic import connect_four_v3, rps_v2, tictactoe_v3

from marllm.games.env import BatchedGameEnv, openspiel_factory
from tests.test_games_env import CountdownGame, needs_openspiel, play


def forfeit_first(observation):
    return tuple("no idea" for _ in observation["games"])


@pytest.mark.parametrize("game_fn", [tictactoe_v3.env, connect_four_v3.env, lambda: rps_v2.env(max_cycles=2)],
                         ids=["tictactoe", "connect_four", "rps"])
def test_a_forfeit_in_a_zero_sum_pettingzoo_game_pays_the_winner_what_winning_pays(game_fn):
    environment = BatchedGameEnv(game_fn, 2)
    _, final = play(environment, answer=forfeit_first)
    for record in environment.records:
        assert sorted(record.payoffs.values()) == [-1.0, 1.0] and sum(record.payoffs.values()) == 0.0
    winner = next(seat for seat in environment.possible_agents if final[seat]["outcomes"][0] == 1)
    assert final[winner]["metrics"]["payoff"] == 1.0 and final[winner]["metrics"]["win_rate"] == 1.0


@needs_openspiel
@pytest.mark.parametrize(("game", "others"), [("kuhn_poker", 2.0), ("kuhn_poker(players=3)", 1.0)])
def test_a_forfeit_in_a_zero_sum_openspiel_game_keeps_it_zero_sum(game, others):
    environment = BatchedGameEnv(openspiel_factory(game), 1)
    play(environment, answer=forfeit_first)
    payoffs = environment.records[0].payoffs
    loser = environment.records[0].forfeited_by
    assert payoffs[loser] == -2.0 and all(v == others for seat, v in payoffs.items() if seat != loser)
    assert sum(payoffs.values()) == 0.0


@needs_openspiel
def test_a_forfeit_in_a_general_sum_game_pays_the_others_nothing():
    environment = BatchedGameEnv(openspiel_factory("repeated_game(stage_game=matrix_pd(),num_repetitions=2)"), 1)
    play(environment, answer=forfeit_first)
    loser = environment.records[0].forfeited_by
    assert [v for seat, v in environment.records[0].payoffs.items() if seat != loser] == [0.0]
    assert not environment.view.zero_sum(environment.games[0])


def test_a_users_game_is_not_taken_for_zero_sum():
    environment = BatchedGameEnv(CountdownGame, 1)
    play(environment, answer=forfeit_first)
    assert sorted(environment.records[0].payoffs.values()) == [-1.0, 0.0]
