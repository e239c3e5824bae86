"""BatchedGameEnv: the PettingZoo API over several games, masking of finished and waiting games, answers to moves,
illegal answers, credit and metrics, prompts and views, and errors on bad input."""

from __future__ import annotations

import importlib.util
import math
import sys

import numpy as np
import pytest
from gymnasium.spaces import Box, Discrete
from pettingzoo import AECEnv
from pettingzoo.classic import connect_four_v3, rps_v2, tictactoe_v3
from pettingzoo.test import api_test, seed_test
from pettingzoo.utils.wrappers import OrderEnforcingWrapper

from marllm.games.env import BatchedGameEnv, GameView, env, openspiel_factory, require_openspiel
from marllm.games.env.credit import outcomes, turn_rewards
from marllm.games.env.parsers import exact_move, first_legal_move, get_parser, last_legal_move, register_parser

# api_test recommends Box/Discrete spaces and numpy observations; text agents have neither, by design.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:pettingzoo.test.api_test")

needs_openspiel = pytest.mark.skipif(
    importlib.util.find_spec("pyspiel") is None or importlib.util.find_spec("shimmy") is None,
    reason="needs the optional open_spiel and shimmy (pip install 'marllm[games]')",
)


class CountdownGame(AECEnv):
    """A user's own AEC game: players add 1 or 2 to a running total in turn; whoever brings it to ``target`` wins
    (+1, the others -1). The first mover is drawn at reset, so games of a batch start with different players and
    end after different numbers of moves. Legal moves are in ``infos[agent]["action_mask"]``."""

    metadata = {"name": "countdown_v0", "render_modes": [], "is_parallelizable": False}

    def __init__(self, target: int = 5, players: int = 2):
        super().__init__()
        self.target = target
        self.possible_agents = [f"p{i}" for i in range(players)]
        self.action_spaces = {a: Discrete(2) for a in self.possible_agents}
        self.observation_spaces = {a: Box(0, target, (1,), dtype=np.int64) for a in self.possible_agents}

    def observation_space(self, agent):
        return self.observation_spaces[agent]

    def action_space(self, agent):
        return self.action_spaces[agent]

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.total = 0
        self.first = int(np.random.default_rng(seed).integers(len(self.agents)))
        self.agent_selection = self.agents[self.first]
        self.rewards = dict.fromkeys(self.agents, 0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self._masks()

    def _masks(self):
        for agent in self.agents:
            mask = np.zeros(2, dtype=np.int8)
            if agent == self.agent_selection and not self.terminations[agent]:
                mask[: min(2, self.target - self.total)] = 1
            self.infos[agent]["action_mask"] = mask

    def observe(self, agent):
        return np.array([self.total], dtype=np.int64)

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0
        self.total += int(action) + 1
        if self.total >= self.target:
            self.rewards = {a: (1 if a == agent else -1) for a in self.agents}
            self.terminations = dict.fromkeys(self.agents, True)
        else:
            self._clear_rewards()
            self.agent_selection = self.agents[(self.agents.index(agent) + 1) % len(self.agents)]
        self._masks()
        self._accumulate_rewards()


def kuhn():
    return openspiel_factory("kuhn_poker")()


def openspiel_tic_tac_toe():  # no view of its own: the generic OpenSpiel view renders it
    return openspiel_factory("tic_tac_toe")()


GAMES = {
    "tictactoe": (tictactoe_v3.env, []),
    "connect_four": (connect_four_v3.env, []),
    "rps": (lambda: rps_v2.env(max_cycles=3), []),
    "countdown": (CountdownGame, []),
    "countdown_3_players": (lambda: CountdownGame(7, 3), []),
    "kuhn_poker": (kuhn, [needs_openspiel]),
    "openspiel_tic_tac_toe": (openspiel_tic_tac_toe, [needs_openspiel]),
}
CASES = [
    pytest.param(name, illegal, wrapping, id=f"{name}-{illegal}-{wrapping}", marks=marks)
    for name, (_, marks) in GAMES.items()
    for illegal in ("forfeit", "random")
    for wrapping in ("factory", "raw")
]


@pytest.mark.parametrize("name,illegal,wrapping", CASES)
def test_api(name, illegal, wrapping):
    kwargs = dict(game_fn=GAMES[name][0], batch_size=3, illegal=illegal, render_mode="ansi")
    environment = (env if wrapping == "factory" else BatchedGameEnv)(**kwargs)
    assert isinstance(environment, OrderEnforcingWrapper) == (wrapping == "factory")
    api_test(environment, num_cycles=200)
    seed_test(lambda: env(**kwargs), num_cycles=50)
    assert environment.render().startswith("game 0 of 3")


# --- playing a batch ----------------------------------------------------------------------------------------------


def first_legal(observation):
    return tuple(moves[0] for moves in observation["legal_moves"])


def play(environment, answer=first_legal, seed=0):
    """One episode; each seat answers ``answer(observation)``. Returns (moves: [(seat, games)], final infos)."""
    environment.reset(seed=seed)
    moves, final = [], {}
    for seat in environment.agent_iter():
        observation, _, terminated, truncated, info = environment.last()
        if terminated or truncated:
            final[seat] = info
            environment.step(None)
            continue
        games = observation["games"]
        assert list(games) == environment.unwrapped.to_move(seat)
        assert np.flatnonzero(info["action_mask"]).tolist() == list(games)
        for key in ("prompt", "legal_moves", "legal_actions", "history"):
            assert len(observation[key]) == len(games)
        moves.append((seat, list(games)))
        environment.step(answer(observation))
    return moves, final


def add_two_in_odd_games(observation):
    """Add two (the last legal move) in odd games while it is legal, one in even games."""
    rows = zip(observation["games"], observation["legal_moves"], strict=True)
    return tuple(moves[-1] if b % 2 else moves[0] for b, moves in rows)


def test_masks_games_that_are_over_or_where_another_seat_moves():
    environment = BatchedGameEnv(lambda: CountdownGame(target=5), batch_size=8, seed=3)
    moves, final = play(environment, answer=add_two_in_odd_games)
    first_movers = [environment.games[b].unwrapped.first for b in range(8)]
    assert set(first_movers) == {0, 1}, "the seed should give both players a first move somewhere"
    # the seats take turns (round robin), each moving in exactly the games where it is to move
    assert [seat for seat, _ in moves][:4] == ["p0", "p1", "p0", "p1"]
    assert moves[0][1] == [b for b in range(8) if first_movers[b] == 0]
    assert moves[1][1] == list(range(8))  # p1 starts where p0 does not and answers p0 where it did
    lengths = [record.length for record in environment.records]
    assert len(set(lengths)) > 1, "games should end after different numbers of moves"
    for b, record in enumerate(environment.records):
        seats = [move.seat for move in record.moves]
        assert seats == [f"p{(first_movers[b] + k) % 2}" for k in range(len(seats))]
        assert sum(move.action + 1 for move in record.moves) == 5
    for seat in ("p0", "p1"):
        own = [games for who, games in moves if who == seat]
        info = final[seat]
        assert [g.tolist() for g in info["turn_games"]] == own
        assert [len(r) for r in info["turn_batch_rewards"]] == [len(g) for g in own]
        assert [len(r) for r in info["turn_task_rewards"]] == [len(g) for g in own]
        payoffs = np.array([record.payoffs[seat] for record in environment.records])
        np.testing.assert_array_equal(info["task_rewards"], payoffs)
        for games, rewards in zip(info["turn_games"], info["turn_batch_rewards"], strict=True):
            np.testing.assert_array_equal(rewards, payoffs[games])
    np.testing.assert_array_equal(final["p0"]["task_rewards"], -final["p1"]["task_rewards"])


def test_three_seats_in_games_with_different_first_movers():
    environment = BatchedGameEnv(lambda: CountdownGame(target=7, players=3), batch_size=6, seed=1)
    moves, final = play(environment)
    assert len({environment.games[b].unwrapped.first for b in range(6)}) > 1
    for seat in environment.possible_agents:
        assert sum(len(g) for who, g in moves if who == seat) == sum(r.answers[seat] for r in environment.records)
        assert final[seat]["metrics"]["game_length"] == 7.0  # always adding 1
    # each game has one winner (+1) and two losers (-1)
    payoffs = np.stack([final[s]["payoffs"] for s in environment.possible_agents], axis=1)
    assert (payoffs.sum(axis=1) == -1).all()


def test_scalar_rewards_are_the_mean_payoff_and_all_seats_terminate_together():
    environment = BatchedGameEnv(tictactoe_v3.env, batch_size=2)
    environment.reset(seed=0)
    for answers in [("1", "1"), ("4", "4"), ("2", "2"), ("5", "5")]:
        environment.step(answers)
        assert not any(environment.terminations.values())
        assert environment.rewards == {"player_1": 0.0, "player_2": 0.0}
    environment.step(("3", "3"))  # X completes the top row in both games
    assert environment.terminations == {"player_1": True, "player_2": True}
    assert environment.rewards == {"player_1": 1.0, "player_2": -1.0}
    assert environment.infos["player_1"]["metrics"]["win_rate"] == 1.0
    assert environment.infos["player_2"]["metrics"]["loss_rate"] == 1.0


# --- answers to moves ---------------------------------------------------------------------------------------------

RPS = ["rock", "paper", "scissors"]


@pytest.mark.parametrize(
    "answer,moves,first,last",
    [
        ("I play paper.", RPS, 1, 1),
        ("Rock or paper? PAPER", RPS, 0, 1),
        ("rocky road", RPS, None, None),  # whole words only
        ("2", RPS, 1, 1),  # the move's number in the prompt's list
        ("3 then 1", RPS, 2, 0),
        ("7", RPS, None, None),  # no such number
        ("My move: 1.", RPS, 0, 0),  # a number ending a sentence
        ("1.5 or 2.5", RPS, None, None),  # decimals are not move numbers
        ("column 3", ["1", "3", "7"], 1, 1),  # numeric names are names, not numbers in the list
        ("2", ["1", "3", "7"], None, None),
        ("x(0,0) then x(1,1)", ["x(0,0)", "x(1,1)"], 0, 1),
        ("", RPS, None, None),
    ],
)
def test_first_and_last_legal_move_parsers(answer, moves, first, last):
    assert first_legal_move(answer, moves) == first
    assert last_legal_move(answer, moves) == last


def test_exact_parser_and_the_registry():
    assert exact_move("  Paper \n", RPS) == 1
    assert exact_move("paper!", RPS) is None
    assert get_parser("first") is first_legal_move
    with pytest.raises(ValueError, match=r"unknown answer parser 'nope'; registered: \[.*'exact'.*\]"):
        get_parser("nope")

    @register_parser("always_second_for_test")
    def second(answer, moves):
        return 1

    assert get_parser("always_second_for_test") is second
    with pytest.raises(ValueError, match="already registered"):
        register_parser("always_second_for_test")(second)
    environment = BatchedGameEnv(lambda: rps_v2.env(max_cycles=1), batch_size=2, parser="always_second_for_test")
    play(environment, answer=lambda obs: ("anything",) * len(obs["games"]))
    assert [move.name for move in environment.records[0].moves] == ["paper", "paper"]


# --- illegal answers ----------------------------------------------------------------------------------------------


def illegal_in_game_0(observation):
    rows = zip(observation["games"], observation["legal_moves"], strict=True)
    return tuple("no idea" if b == 0 else moves[0] for b, moves in rows)


@pytest.mark.parametrize("forfeit_payoffs,loser,other", [(None, -1.0, 1.0), ((-2.0, 1.5), -2.0, 1.5)])
def test_forfeit_ends_the_game_with_the_loss_payoff(forfeit_payoffs, loser, other):
    environment = BatchedGameEnv(tictactoe_v3.env, batch_size=2, forfeit_payoffs=forfeit_payoffs)
    moves, final = play(environment, answer=illegal_in_game_0)
    assert moves[0] == ("player_1", [0, 1])
    assert all(games == [1] for _, games in moves[1:])  # game 0 is over after the forfeit
    record = environment.records[0]
    assert record.moves == [] and record.forfeited_by == "player_1"
    assert record.payoffs == {"player_1": loser, "player_2": other}
    assert final["player_1"]["outcomes"][0] == -1 and final["player_2"]["outcomes"][0] == 1
    assert final["player_1"]["turn_batch_rewards"][0][0] == loser
    metrics = final["player_1"]["metrics"]
    assert metrics["illegal_move_rate"] == pytest.approx(1 / sum(r.answers["player_1"] for r in environment.records))
    assert metrics["forfeit_rate"] == 0.5
    assert final["player_2"]["metrics"]["illegal_move_rate"] == 0.0


@needs_openspiel
def test_forfeit_payoff_of_an_openspiel_game_is_its_minimum_utility():
    environment = BatchedGameEnv(openspiel_factory("kuhn_poker"), batch_size=2)
    _, final = play(environment, answer=illegal_in_game_0)
    assert environment.records[0].payoffs == {"player_0": -2.0, "player_1": 2.0}  # zero-sum: the winner's +2
    assert final["player_0"]["payoffs"][0] == -2.0


def test_random_policy_plays_a_legal_move_counts_it_and_applies_the_penalty():
    environment = BatchedGameEnv(tictactoe_v3.env, batch_size=2, illegal="random", illegal_penalty=0.25, seed=0)
    moves, final = play(environment, answer=illegal_in_game_0)
    assert all(0 in games for seat, games in moves[:2])  # game 0 goes on
    record = environment.records[0]
    assert record.illegal == {"player_1": record.answers["player_1"], "player_2": record.answers["player_2"]}
    assert record.forfeited_by is None and len(record.moves) == record.length
    for seat in ("player_1", "player_2"):
        info = final[seat]
        assert info["metrics"]["illegal_move_rate"] == pytest.approx(
            record.illegal[seat] / sum(r.answers[seat] for r in environment.records)
        )
        for games, trained, task in zip(
            info["turn_games"], info["turn_batch_rewards"], info["turn_task_rewards"], strict=True
        ):
            np.testing.assert_allclose(trained, task - 0.25 * (games == 0))


def test_discount_credits_each_move_by_the_movers_later_moves():
    environment = BatchedGameEnv(lambda: CountdownGame(target=6), batch_size=1, discount=0.5, seed=2)
    _, final = play(environment, answer=lambda obs: ("0",))  # always add 1: six moves, three per player
    for seat in ("p0", "p1"):
        payoff = final[seat]["payoffs"][0]
        rewards = [r[0] for r in final[seat]["turn_batch_rewards"]]
        assert rewards == [payoff * 0.25, payoff * 0.5, payoff]
        assert [r[0] for r in final[seat]["turn_task_rewards"]] == [payoff] * 3


def test_turn_rewards_on_hand_computed_rows():
    # a seat moved in games [0, 1, 2], then [0, 2], then [2]; payoffs 1, -1, 2; γ = 0.5; penalty 0.1
    games = [np.array([0, 1, 2]), np.array([0, 2]), np.array([2])]
    illegal = [np.array([False, True, False]), np.array([False, False]), np.array([True])]
    rewards = turn_rewards(games, illegal, np.array([1.0, -1.0, 2.0]), discount=0.5, illegal_penalty=0.1)
    np.testing.assert_allclose(rewards[0], [0.5, -1.0 - 0.1, 0.5])
    np.testing.assert_allclose(rewards[1], [1.0, 1.0])
    np.testing.assert_allclose(rewards[2], [2.0 - 0.1])


def test_outcomes_on_hand_computed_payoffs():
    payoffs = np.array([[1, -1, 0], [2, 2, 0], [0, 0, 0], [5, 5, 9], [-1, 0, 0]], dtype=float)
    forfeited = np.array([-1, -1, -1, -1, 0])
    expected = [[1, -1, -1], [0, 0, -1], [0, 0, 0], [-1, -1, 1], [-1, 1, 1]]
    np.testing.assert_array_equal(outcomes(payoffs, forfeited), expected)
    np.testing.assert_array_equal(outcomes(np.array([[2.0], [-1.0], [0.0]]), np.array([-1, -1, -1])), [[1], [-1], [0]])


# --- prompts and views --------------------------------------------------------------------------------------------


def test_tictactoe_view_numbers_cells_in_reading_order():
    environment = BatchedGameEnv(tictactoe_v3.env, batch_size=1)
    environment.reset(seed=0)
    environment.step(("2",))  # X in the top middle cell: PettingZoo's square 3 (column 1, row 0)
    assert environment.games[0].unwrapped.board.squares[3] == 1
    prompt = environment.observe("player_2")["prompt"][0]
    assert "You play O." in prompt
    assert " 1 | X | 3\n---+---+---\n 4 | 5 | 6\n---+---+---\n 7 | 8 | 9" in prompt
    assert "Legal moves: 1, 3, 4, 5, 6, 7, 8, 9\n" in prompt


def test_connect_four_view_drops_pieces_by_column_number():
    environment = BatchedGameEnv(connect_four_v3.env, batch_size=1)
    environment.reset(seed=0)
    environment.step(("4",))
    environment.step(("4",))
    prompt = environment.observe("player_0")["prompt"][0]
    assert "1 2 3 4 5 6 7\n" + ". . . . . . .\n" * 4 + ". . . O . . .\n. . . X . . ." in prompt


def test_simultaneous_moves_stay_hidden_until_the_round_is_complete():
    environment = BatchedGameEnv(lambda: rps_v2.env(max_cycles=2), batch_size=1)
    environment.reset(seed=0)
    environment.step(("paper",))
    second = environment.observe("player_1")
    assert "No round played yet (this is round 1 of 2)." in second["prompt"][0]
    assert second["history"] == ((),)
    environment.step(("rock",))
    first = environment.observe("player_0")
    assert "Rounds so far (you-opponent): paper-rock.\nThis is round 2 of 2." in first["prompt"][0]
    assert "paper     1, -1     0, 0      -1, 1" in first["prompt"][0]  # the payoff table, from PettingZoo's rule


@needs_openspiel
def test_openspiel_views_show_only_what_the_seat_may_see():
    environment = BatchedGameEnv(openspiel_factory("kuhn_poker"), batch_size=1)
    environment.reset(seed=0)
    state = environment.games[0].unwrapped.game_state
    cards = ["Jack", "Queen", "King"]
    mine, theirs = cards[state.history()[0]], cards[state.history()[1]]
    prompt = environment.observe("player_0")["prompt"][0]
    assert f"Your card: {mine}." in prompt and f"Your card: {theirs}" not in prompt
    assert "Legal moves: 1: Pass, 2: Bet" in prompt
    environment.step(("Bet",))
    assert "Betting so far: player 0: Bet." in environment.observe("player_1")["prompt"][0]

    repeated = BatchedGameEnv(openspiel_factory("repeated_game(stage_game=matrix_pd(),num_repetitions=2)"), 1)
    repeated.reset(seed=0)
    repeated.step(("Defect",))
    prompt = repeated.observe("player_1")["prompt"][0]
    assert "Prisoner's Dilemma" in prompt and "No round played yet (this is round 1 of 2)." in prompt
    assert "Defect     10, 0      1, 1" in prompt


@needs_openspiel
def test_generic_openspiel_view_uses_observation_strings_and_action_names():
    environment = BatchedGameEnv(openspiel_factory("tic_tac_toe"), batch_size=1)
    environment.reset(seed=0)
    environment.step(("x(1,1)",))
    observation = environment.observe("player_1")
    assert "...\n.x.\n..." in observation["prompt"][0]
    assert observation["legal_moves"][0][0] == "o(0,0)" and "x(1,1)" not in observation["legal_moves"][0]
    assert observation["history"] == ((4,),)


class CountdownView(GameView):
    title = "countdown"

    def state(self, game, seat, moves):
        return f"The total is {game.unwrapped.total} of {game.unwrapped.target}."

    def move_name(self, game, seat, action):
        return ("add one", "add two")[action]


def test_templates_views_and_the_generic_fallback():
    generic = BatchedGameEnv(CountdownGame, batch_size=1, templates="{game}|{role}|{state}|{moves}|{move_number}")
    generic.reset(seed=0)
    seat = generic.agent_selection
    assert generic.observe(seat)["prompt"] == (f"countdown_v0|{seat}|Observation (array of shape (1,)):\n[0]|0, 1|1",)

    custom = BatchedGameEnv(
        CountdownGame,
        batch_size=1,
        view=CountdownView(),
        templates={"p0": "{game}: {state} {moves}", "p1": lambda fields: fields["move_names"].upper()},
    )
    custom.reset(seed=0)
    custom.step(("add two",) if custom.agent_selection == "p0" else ("ADD TWO",))
    prompts = {seat: custom.observe(seat)["prompt"] for seat in ("p0", "p1")}
    expected = {"p0": ("countdown: The total is 2 of 5. 1: add one, 2: add two",), "p1": ("ADD ONE, ADD TWO",)}
    assert prompts[custom.agent_selection] == expected[custom.agent_selection]
    assert custom.records[0].moves[0].name == "add two"


# --- bad input ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(batch_size=0), ValueError, "batch_size must be a positive int, got 0"),
        (dict(game_fn=3), TypeError, "game_fn must be a zero-argument callable"),
        (dict(game_fn=lambda: "chess"), TypeError, "must return a PettingZoo AEC env, got str"),
        (dict(illegal="ignore"), ValueError, r"illegal must be one of \['forfeit', 'random'\], got 'ignore'"),
        (dict(forfeit_payoffs=(1,)), ValueError, "forfeit_payoffs must be"),
        (dict(discount=0.0), ValueError, r"discount must be a number in \(0, 1\], got 0.0"),
        (dict(illegal_penalty=-1), ValueError, "illegal_penalty must be a finite number >= 0"),
        (dict(templates="{board}"), ValueError, r"seat 'player_1' uses unknown field\(s\) \['board'\]"),
        (dict(templates={"player_1": "{state}"}), ValueError, r"missing \['player_2'\], unknown \[\]"),
        (dict(parser="regex"), ValueError, "unknown answer parser 'regex'"),
        (dict(render_mode="human"), ValueError, "render_mode must be None or 'ansi'"),
    ],
)
def test_bad_arguments_name_what_is_wrong(kwargs, error, match):
    with pytest.raises(error, match=match):
        BatchedGameEnv(**{"game_fn": tictactoe_v3.env, "batch_size": 2, **kwargs})


def test_games_with_different_seats_and_bad_actions():
    shapes = iter([2, 3])
    with pytest.raises(ValueError, match=r"game 1 has seats \['p0', 'p1', 'p2'\], game 0 \['p0', 'p1'\]"):
        BatchedGameEnv(lambda: CountdownGame(players=next(shapes)), batch_size=2)
    environment = BatchedGameEnv(tictactoe_v3.env, batch_size=2)
    environment.reset(seed=0)
    with pytest.raises(ValueError, match=r"seat 'player_1' must be a sequence of 2 answer strings.*got a single str"):
        environment.step("1")
    with pytest.raises(ValueError, match=r"one per game it moves in \(\[0, 1\]\), got a tuple of 1 items"):
        environment.step(("1",))


def test_openspiel_is_optional_and_its_absence_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyspiel", None)  # as if open_spiel were not installed
    with pytest.raises(ImportError, match=r"open_spiel and shimmy\[openspiel\] \(pyspiel is missing\): pip install "):
        openspiel_factory("kuhn_poker")
    with pytest.raises(ImportError, match=r"'marllm\[games\]'"):
        require_openspiel()
    play(BatchedGameEnv(tictactoe_v3.env, batch_size=2))  # PettingZoo games need neither


def test_a_seat_that_never_moved_has_no_illegal_move_rate():
    from marllm.games.env.credit import seat_metrics

    zeros = np.zeros(4)
    metrics = seat_metrics(zeros - 1, zeros + 1, zeros, zeros, zeros + 1, zeros.astype(bool))
    assert math.isnan(metrics["illegal_move_rate"]) and metrics["moves_per_game"] == 0.0


@needs_openspiel
def test_cooperation_rate_counts_the_legal_answers_that_cooperate():
    """Two games of the 2-round dilemma: player_0 answers Cooperate, Defect, then an illegal answer (a random move
    is played for it) and Cooperate; player_1 always Defects. Its rate is over its legal answers only."""
    environment = BatchedGameEnv(
        openspiel_factory("repeated_game(stage_game=matrix_pd(),num_repetitions=2)"), 2, illegal="random", seed=0
    )
    environment.reset(seed=0)
    answers = {"player_0": [("Cooperate", "Defect"), ("no idea", "Cooperate")], "player_1": [("Defect", "Defect")] * 2}
    while not all(environment.terminations.values()):
        seat = environment.agent_selection
        environment.step(answers[seat].pop(0))
    first, second = environment.final_metrics["player_0"], environment.final_metrics["player_1"]
    assert environment.cooperation_counts("player_0") == (2, 3)
    assert first["cooperation_rate"] == pytest.approx(2 / 3) and first["legal_answers"] == 3
    assert first["illegal_move_rate"] == pytest.approx(1 / 4)
    assert second["cooperation_rate"] == 0.0 and second["legal_answers"] == 4
    tic_tac_toe = BatchedGameEnv(lambda: tictactoe_v3.env(), 1)
    play(tic_tac_toe)
    assert tic_tac_toe.cooperation_counts("player_1") is None  # no cooperative move: no rate
    assert "cooperation_rate" not in tic_tac_toe.final_metrics["player_1"]


@needs_openspiel
def test_a_seat_with_no_legal_answer_logs_no_cooperation_rate_rather_than_nan():
    """Every answer of player_0 illegal (a random move is played for each): the rate of its own legal answers is
    undefined, so it is not logged, in the seat's metrics nor in its learner's; its legal answers are 0."""
    from marllm.games.training import game_metrics

    environment = BatchedGameEnv(
        openspiel_factory("repeated_game(stage_game=matrix_pd(),num_repetitions=2)"), 2, illegal="random", seed=0
    )
    environment.reset(seed=0)
    answers = {"player_0": [("no idea", "???")] * 2, "player_1": [("Cooperate", "Defect")] * 2}
    while not all(environment.terminations.values()):
        seat = environment.agent_selection
        environment.step(answers[seat].pop(0))
    metrics = environment.final_metrics
    assert "cooperation_rate" not in metrics["player_0"] and metrics["player_0"]["legal_answers"] == 0
    assert metrics["player_1"]["cooperation_rate"] == 0.5
    slots = ["player_0", "player_1"]
    alone = game_metrics(environment.infos, slots, {"player_0": "llm"}, {})  # no permutation: slots are seats
    assert "llm/game/cooperation_rate" not in alone and "llm/game/player_0/cooperation_rate" not in alone
    both = game_metrics(environment.infos, slots, {"player_0": "llm", "player_1": "llm"}, {})
    assert both["llm/game/cooperation_rate"] == 0.5


def test_a_views_own_measures_reach_the_learner_averaged_over_its_seats():
    """A learner holding two seats logs a view's measure as the mean over the seats that report it, beside the env's
    own totals, which keep their weighting."""
    from marllm.games.env.credit import seat_metrics
    from marllm.games.training import learner_totals

    ones = np.ones(4)
    first = seat_metrics(ones, ones, ones * 2, ones * 0, ones * 2, ones.astype(bool) & False) | {"agreement_rate": 1.0}
    second = seat_metrics(-ones, -ones, ones * 2, ones, ones * 2, ones.astype(bool) & False) | {"agreement_rate": 0.0}
    totals = learner_totals([first, second])
    assert totals["agreement_rate"] == 0.5 and totals["payoff"] == 0.0 and totals["illegal_move_rate"] == 0.25
    assert learner_totals([first, {**second, "words": 3.0}])["words"] == 3.0  # one seat reports it: its value
