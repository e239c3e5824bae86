"""Which games a config may name: PettingZoo classic games marllm cannot play are refused with the reason and the
OpenSpiel game to play instead, which loads and renders a readable prompt; OpenSpiel's generic view says what its
string is; liar's dice has a view of its own."""

from __future__ import annotations

import importlib.util
import warnings

import pytest

from marllm.config import ConfigError, config_from_dict
from marllm.games.env import BatchedGameEnv, openspiel_factory
from marllm.games.env.factory import UNPLAYABLE, check_game_name, classic_games, load_openspiel_game
from tests.test_games_config import game_config

needs_openspiel = pytest.mark.skipif(
    importlib.util.find_spec("pyspiel") is None or importlib.util.find_spec("shimmy") is None,
    reason="needs the optional open_spiel and shimmy (pip install 'marllm[games]')",
)

MAX_PROMPT_CHARS = 2000  # go(board_size=9) lists 82 moves: about 1,200 characters


def first_prompt(name: str) -> str:
    environment = BatchedGameEnv(openspiel_factory(load_openspiel_game(name)), batch_size=1)
    environment.reset(seed=0)
    return str(environment.observe(environment.agent_selection)["prompt"][0])


@pytest.mark.parametrize("name", sorted(UNPLAYABLE))
def test_a_game_marllm_cannot_play_is_refused_with_the_reason_and_what_to_play(name):
    why, instead = UNPLAYABLE[name]
    with pytest.raises(ValueError, match=r"cannot be played: it .*; play .*openspiel:") as error:
        check_game_name(name)
    assert why in str(error.value) and instead in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ConfigError, match=rf"game.name: {name} cannot be played"):
        config_from_dict(game_config({"name": name})).check_game()


def test_chess_names_its_package_and_unknown_names_list_only_playable_games():
    with pytest.raises(ValueError, match=r"chess_v6 .*python-chess package \(pip install chess\).*openspiel:chess"):
        check_game_name("chess_v6")
    with pytest.raises(ValueError, match=r"go_v5 .*19×19×17 array.*openspiel:go\(board_size=9\)"):
        check_game_name("go_v5")
    with pytest.raises(ValueError, match=r"unknown game 'tictactoe_v2' \(did you mean 'tictactoe_v3'\?\)") as error:
        check_game_name("tictactoe_v2")
    assert not any(name in str(error.value) for name in UNPLAYABLE)
    assert {"tictactoe_v3", "connect_four_v3", "rps_v2"} <= set(classic_games()) - set(UNPLAYABLE)


@needs_openspiel
@pytest.mark.parametrize("name", sorted(UNPLAYABLE))
def test_the_game_a_refusal_names_instead_loads_and_renders_a_short_prompt(name):
    instead = "openspiel:" + UNPLAYABLE[name][1].split("openspiel:")[1].split(" (")[0].split(" or ")[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prompt = first_prompt(instead)
    assert len(prompt) < MAX_PROMPT_CHARS
    assert "as OpenSpiel writes it" in prompt or "Your card: " in prompt  # the generic view, or Leduc's own


@needs_openspiel
def test_the_generic_view_names_the_string_it_shows():
    prompt = first_prompt("openspiel:universal_poker")
    assert "You are player 0. Your information state (your private information and the public history" in prompt
    assert "[Private: " in prompt
    assert "You are player 1. The game, as OpenSpiel writes it:\nrnbqkbnr/" in first_prompt("openspiel:chess")


@needs_openspiel
def test_liars_dice_shows_the_seats_dice_and_the_bids():
    environment = BatchedGameEnv(openspiel_factory(load_openspiel_game("openspiel:liars_dice(numdice=2)")), 1)
    environment.reset(seed=0)
    state = environment.games[0].unwrapped.game_state
    mine = state.information_state_string(0)
    prompt = environment.observe("player_0")["prompt"][0]
    assert f"Your dice: {mine[0]}, {mine[1]}.\nBids so far: none (you bid first)." in prompt
    assert "rolls 2 6-sided dice in secret" in prompt and "'Liar'" in prompt
    environment.step(("1-4",))
    assert "Bids so far: player 0: 1-4." in environment.observe("player_1")["prompt"][0]
