"""SharedReward and RolePermutation on the text env and on classic PettingZoo games, and the full CORY stack."""

from __future__ import annotations

import numpy as np
import pytest
from pettingzoo.classic import rps_v2, tictactoe_v3
from pettingzoo.test import api_test

from marllm.config import config_from_dict
from marllm.envs.text_env import SequentialTextEnv, env
from marllm.run.setup import build_env
from marllm.tasks.base import TaskParts
from marllm.wrappers import RolePermutation, SharedReward, check_coefficients, cooperation_matrix

# api_test recommends Box/Discrete spaces and numpy observations; text agents have neither, by design.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:pettingzoo.test.api_test")

ROWS = [{"query": f"q{i}"} for i in range(5)]
TEMPLATES = {"pioneer": "{query}", "observer": "{query} -> {pioneer}", "critic": "{query} {pioneer} {observer}"}


def length_reward(samples, responses):
    return [len(r) for r in responses]


def text_env(roles=("pioneer", "observer"), batch_size=3, factory=env):
    return factory(
        dataset=ROWS,
        roles=list(roles),
        templates={r: TEMPLATES[r] for r in roles},
        reward_fn=length_reward,
        batch_size=batch_size,
    )


def play(environment, actions_by_agent, seed=0):
    """One episode with a fixed action per agent; returns what last() reported to each agent when it finished."""
    environment.reset(seed=seed)
    final = {}
    for agent in environment.agent_iter():
        _, reward, terminated, truncated, info = environment.last()
        if terminated or truncated:
            final[agent] = (reward, info)
            environment.step(None)
        else:
            environment.step(actions_by_agent[agent])
    return final


# --- SharedReward on the text env -------------------------------------------------------------------------------

# pioneer's responses have lengths 1, 2, 3 -> r1 = [1, 2, 3]; observer's 4, 1, 2 -> r2 = [4, 1, 2]
ACTIONS = {"pioneer": ("a", "aa", "aaa"), "observer": ("bbbb", "b", "bb")}
R1, R2 = [1.0, 2.0, 3.0], [4.0, 1.0, 2.0]


@pytest.mark.parametrize(
    "coefficients,pioneer,observer",
    [
        (None, [5.0, 3.0, 5.0], [5.0, 3.0, 5.0]),  # r1 + r2 for both
        ([[1, 0.5], [0.5, 1]], [3.0, 2.5, 4.0], [4.5, 2.0, 3.5]),  # r1 + r2/2, r2 + r1/2
        ([[1, -0.5], [-0.5, 1]], [-1.0, 1.5, 2.0], [3.5, 0.0, 0.5]),  # r1 - r2/2, r2 - r1/2
        (np.eye(2), R1, R2),
        ([[0, 1], [1, 0]], R2, R1),
    ],
    ids=["ones", "lambda+0.5", "lambda-0.5", "identity", "swapped"],
)
def test_shared_reward_on_the_text_env(coefficients, pioneer, observer):
    environment = SharedReward(text_env(), coefficients)
    final = play(environment, ACTIONS)
    assert set(final) == {"pioneer", "observer"}
    for agent, own, mixed in (("pioneer", R1, pioneer), ("observer", R2, observer)):
        reward, info = final[agent]
        assert reward == pytest.approx(np.mean(mixed))
        np.testing.assert_allclose(info["batch_rewards"], mixed)
        np.testing.assert_array_equal(info["task_rewards"], own)  # the agent's own reward is never mixed
        assert info["role"] == agent


def test_shared_reward_rewards_dict_and_cumulative_reward_right_after_the_last_step():
    environment = SharedReward(text_env(), cooperation_matrix(2, 0.5))
    environment.reset(seed=0)
    environment.step(ACTIONS["pioneer"])
    assert environment.rewards == {"pioneer": 0.0, "observer": 0.0}
    environment.step(ACTIONS["observer"])
    # scalar rewards are C @ (batch means): means 2 and 7/3
    assert environment.rewards == pytest.approx({"pioneer": 2 + 0.5 * 7 / 3, "observer": 7 / 3 + 0.5 * 2})
    assert environment._cumulative_rewards == pytest.approx(environment.rewards)
    # the inner env keeps the unmixed rewards
    assert environment.env.rewards == pytest.approx({"pioneer": 2.0, "observer": 7 / 3})
    # after the pioneer left, the observer's mixed vector still counts the pioneer's rewards
    environment.step(None)
    assert list(environment.infos) == ["observer"]
    np.testing.assert_allclose(environment.infos["observer"]["batch_rewards"], [4.5, 2.0, 3.5])
    assert environment.last()[1] == pytest.approx(7 / 3 + 1)


def test_a_new_episode_starts_from_fresh_rewards():
    environment = SharedReward(text_env())
    play(environment, ACTIONS)
    environment.reset(seed=1)
    assert environment.rewards == {"pioneer": 0.0, "observer": 0.0}
    assert environment._cumulative_rewards == {"pioneer": 0.0, "observer": 0.0}
    batch = tuple(s["query"] for s in environment.unwrapped.samples)
    assert environment.infos == {
        "pioneer": {"role": "pioneer", "queries": batch},
        "observer": {"role": "observer", "queries": batch},
    }


def test_cooperation_matrix():
    np.testing.assert_array_equal(cooperation_matrix(3, 0.5), [[1, 0.5, 0.5], [0.5, 1, 0.5], [0.5, 0.5, 1]])
    np.testing.assert_array_equal(cooperation_matrix(2, -1), [[1, -1], [-1, 1]])
    np.testing.assert_array_equal(cooperation_matrix(1, 7.0), [[1]])
    with pytest.raises(ValueError, match="num_agents must be >= 1, got 0"):
        cooperation_matrix(0, 1.0)


@pytest.mark.parametrize(
    "coefficients,expected",
    [
        # r = [1, 2, 3], [4, 1, 2], [2, 2, 2] for pioneer, observer, critic
        (cooperation_matrix(3, 0.5), [[4, 3.5, 5], [5.5, 3, 4.5], [4.5, 3.5, 4.5]]),
        ([[1, 0, 0], [1, 1, 0], [1, 1, 1]], [[1, 2, 3], [5, 3, 5], [7, 5, 7]]),  # each role: itself and earlier ones
    ],
    ids=["cooperation-0.5", "chain"],
)
def test_shared_reward_with_three_agents(coefficients, expected):
    environment = SharedReward(text_env(roles=("pioneer", "observer", "critic")), coefficients)
    final = play(environment, {**ACTIONS, "critic": ("cc", "cc", "cc")})
    for agent, row in zip(("pioneer", "observer", "critic"), expected, strict=True):
        np.testing.assert_allclose(final[agent][1]["batch_rewards"], row)
        assert final[agent][0] == pytest.approx(np.mean(row))


@pytest.mark.parametrize("factory", [env, SequentialTextEnv], ids=["factory", "raw"])
@pytest.mark.parametrize("num_roles", [1, 2, 3])
def test_api_test_passes_on_shared_reward_text_env(factory, num_roles):
    roles = ("pioneer", "observer", "critic")[:num_roles]
    api_test(SharedReward(text_env(roles=roles, factory=factory), cooperation_matrix(num_roles, -0.5)), num_cycles=5)


# --- SharedReward on classic games ------------------------------------------------------------------------------


@pytest.mark.parametrize("make_classic", [tictactoe_v3.env, rps_v2.env], ids=["tictactoe", "rps"])
def test_api_test_passes_on_shared_reward_classic_env(make_classic):
    api_test(SharedReward(make_classic(), cooperation_matrix(2, 0.5)), num_cycles=20)


# player_1 takes squares 0, 1, 2 (a line) while player_2 takes 3 and 4: player_1 wins on its third move
TICTACTOE_WIN = [0, 3, 1, 4, 2]


def play_tictactoe(environment):
    environment.reset(seed=0)
    moves = iter(TICTACTOE_WIN)
    final = {}
    for agent in environment.agent_iter():
        _, reward, terminated, truncated, _ = environment.last()
        if terminated or truncated:
            final[agent] = reward
            environment.step(None)
        else:
            environment.step(next(moves))
    return final


@pytest.mark.parametrize(
    "weight,expected",
    [(0.5, (0.5, -0.5)), (-0.5, (1.5, -1.5)), (1.0, (0.0, 0.0)), (0.0, (1.0, -1.0))],
)
def test_shared_reward_on_a_scripted_tictactoe_game(weight, expected):
    assert play_tictactoe(tictactoe_v3.env()) == {"player_1": 1, "player_2": -1}
    assert play_tictactoe(SharedReward(tictactoe_v3.env(), cooperation_matrix(2, weight))) == pytest.approx(
        dict(zip(["player_1", "player_2"], expected, strict=True))
    )


def test_shared_reward_on_rock_paper_scissors():
    environment = SharedReward(rps_v2.env(num_actions=3, max_cycles=2), [[1, 0.25], [0.25, 1]])
    environment.reset(seed=0)
    # rps: 0 rock, 1 paper, 2 scissors; round 1 paper beats rock, round 2 is a draw
    environment.step(1)
    environment.step(0)
    assert environment.rewards == pytest.approx({"player_0": 1 - 0.25, "player_1": -1 + 0.25})
    environment.step(2)
    environment.step(2)
    assert environment.rewards == {"player_0": 0.0, "player_1": 0.0}


# --- bad coefficients -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "coefficients,match",
    [
        ([[1, 0, 0], [0, 1, 0]], r"2x2 matrix .* got shape \(2, 3\)"),
        (np.ones((3, 3)), r"2x2 matrix .* got shape \(3, 3\)"),
        ([1.0, 1.0], r"2x2 matrix .* got shape \(2,\)"),
        (0.5, r"2x2 matrix .* got shape \(\)"),
        ([["a", 1], [1, 1]], "2x2 matrix of numbers"),
        ([[1, 1], [1]], "2x2 matrix of numbers"),
        ([[1, float("nan")], [1, 1]], "must be finite"),
        ([[1, 1], [float("inf"), 1]], "must be finite"),
    ],
    ids=["2x3", "3x3", "1-D", "scalar", "non-numeric", "ragged", "nan", "inf"],
)
def test_bad_coefficients(coefficients, match):
    with pytest.raises(ValueError, match=match):
        SharedReward(text_env(), coefficients)


def test_check_coefficients_names_the_agents():
    with pytest.raises(ValueError, match=r"one row and one column per agent \['x', 'y', 'z'\]"):
        check_coefficients(np.eye(2), ["x", "y", "z"])
    np.testing.assert_array_equal(check_coefficients(None, ["x", "y"]), np.ones((2, 2)))


# --- RolePermutation --------------------------------------------------------------------------------------------


def roles_over_resets(environment, resets=12):
    """The role each learner plays at each of the first ``resets`` resets, as one letter per reset."""
    schedule = {learner: "" for learner in environment.possible_agents}
    for _ in range(resets):
        environment.reset(seed=0)
        for learner, info in environment.infos.items():
            assert environment.role_of[learner] == info["role"]
            schedule[learner] += info["role"][0]
    return schedule


@pytest.mark.parametrize(
    "period,llm1,llm2",
    [
        (1, "popopopopopo", "opopopopopop"),
        (2, "ppooppooppoo", "ooppooppoopp"),
        (5, "pppppooooopp", "ooooopppppoo"),
        (None, "pppppppppppp", "oooooooooooo"),
    ],
)
def test_role_schedule_with_two_roles(period, llm1, llm2):
    environment = RolePermutation(text_env(), period)
    assert environment.possible_agents == ["llm1", "llm2"]
    assert roles_over_resets(environment) == {"llm1": llm1, "llm2": llm2}


@pytest.mark.parametrize(
    "period,expected",
    [
        (1, {"a": "poc" * 3, "b": "ocp" * 3, "c": "cpo" * 3}),
        (2, {"a": "ppoocc" + "ppo", "b": "ooccpp" + "ooc", "c": "ccppoo" + "ccp"}),
    ],
)
def test_role_schedule_rotates_three_roles(period, expected):
    environment = RolePermutation(text_env(roles=("pioneer", "observer", "critic")), period, learners=["a", "b", "c"])
    assert roles_over_resets(environment, resets=9) == expected


def test_learners_replace_roles_in_every_agent_attribute_and_observe_their_roles_prompts():
    environment = RolePermutation(text_env(), period=1)
    for episode, (pioneer, observer) in enumerate([("llm1", "llm2"), ("llm2", "llm1"), ("llm1", "llm2")]):
        environment.reset(seed=episode)
        assert environment.agents == [pioneer, observer]
        assert environment.learner_of == {"pioneer": pioneer, "observer": observer}
        assert environment.agent_selection == pioneer
        assert set(environment.rewards) == set(environment.terminations) == {"llm1", "llm2"}
        queries = tuple(s["query"] for s in environment.unwrapped.samples)
        assert environment.observe(pioneer) == {"prompt": queries}
        assert environment.observe(observer) == {"prompt": ("", "", "")}
        assert environment.last()[0] == {"prompt": queries}

        environment.step(("x", "yy", "zzz"))
        assert environment.agent_selection == observer
        assert environment.observe(observer) == {
            "prompt": tuple(f"{q} -> {a}" for q, a in zip(queries, ["x", "yy", "zzz"], strict=True))
        }

        environment.step(("1", "2", "3"))
        assert environment.terminations == {pioneer: True, observer: True}
        assert environment.infos[pioneer]["role"] == "pioneer"
        assert environment.infos[observer]["role"] == "observer"
        np.testing.assert_array_equal(environment.infos[pioneer]["task_rewards"], [1, 2, 3])
        np.testing.assert_array_equal(environment.infos[observer]["task_rewards"], [1, 1, 1])
        assert environment.rewards == {pioneer: 2.0, observer: 1.0}
        assert environment.last()[1] == 2.0  # the pioneer's learner is selected first to finish
        environment.step(None)
        assert environment.agents == [observer]
        assert environment.last()[1] == 1.0


def test_the_batch_queries_pass_through_both_wrappers_from_reset_to_the_last_step():
    environment = RolePermutation(SharedReward(text_env()), period=1)
    for seed in (0, 1):
        environment.reset(seed=seed)
        queries = tuple(s["query"] for s in environment.unwrapped.samples)
        assert all(info["queries"] == queries for info in environment.infos.values())
        for _ in environment.agent_iter():
            *_, terminated, _, info = environment.last()
            assert info["queries"] == queries
            environment.step(None if terminated else ("x", "yy", "zzz"))
            if terminated:
                assert "batch_rewards" in info


def test_default_learner_ids_and_spaces():
    environment = RolePermutation(text_env(roles=("pioneer", "observer", "critic")), period=3)
    assert environment.possible_agents == ["llm1", "llm2", "llm3"]
    environment.reset(seed=0)
    assert environment.action_space("llm3") == environment.unwrapped.action_space("critic")
    assert environment.observation_space("llm1") == environment.unwrapped.observation_space("pioneer")


@pytest.mark.parametrize("period", [None, 1, 2])
@pytest.mark.parametrize("factory", [env, SequentialTextEnv], ids=["factory", "raw"])
def test_api_test_passes_on_role_permutation_text_env(factory, period):
    api_test(RolePermutation(text_env(factory=factory), period), num_cycles=5)
    api_test(
        RolePermutation(SharedReward(text_env(roles=("pioneer", "observer", "critic"), factory=factory)), period),
        num_cycles=5,
    )


@pytest.mark.parametrize("make_classic", [tictactoe_v3.env, rps_v2.env], ids=["tictactoe", "rps"])
def test_api_test_passes_on_role_permutation_classic_env(make_classic):
    api_test(RolePermutation(make_classic(), period=1, learners=["alice", "bob"]), num_cycles=20)


def test_role_permutation_on_tictactoe_swaps_who_plays_first():
    environment = RolePermutation(SharedReward(tictactoe_v3.env(), cooperation_matrix(2, 0.5)), period=1)
    # the same scripted moves: whoever plays player_1 wins; llm1 plays player_1 in games 1 and 3
    assert play_tictactoe(environment) == {"llm1": 0.5, "llm2": -0.5}
    assert play_tictactoe(environment) == {"llm2": 0.5, "llm1": -0.5}
    assert play_tictactoe(environment) == {"llm1": 0.5, "llm2": -0.5}


@pytest.mark.parametrize("period", [0, -1, 1.5, True, "2"])
def test_bad_period(period):
    with pytest.raises(ValueError, match=rf"period must be an int >= 1 .* or None, got {period!r}"):
        RolePermutation(text_env(), period)


def test_bad_learners():
    with pytest.raises(ValueError, match=r"one learner per role: 2 roles \['pioneer', 'observer'\], 3 learners"):
        RolePermutation(text_env(), 1, learners=["a", "b", "c"])
    with pytest.raises(ValueError, match=r"one learner per role: 2 roles .* 1 learners \['a'\]"):
        RolePermutation(text_env(), 1, learners=["a"])
    with pytest.raises(ValueError, match=r"learner ids must be unique, got \['a', 'a'\]"):
        RolePermutation(text_env(), 1, learners=["a", "a"])
    with pytest.raises(ValueError, match=r"learner ids \['pioneer'\] are also role names"):
        RolePermutation(text_env(), 1, learners=["pioneer", "x"])


# --- the CORY stack ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("period,llm1_roles", [(5, "pppppooooo"), (3, "pppooopppo"), (1, "popopopopo")])
def test_cory_stack_driven_by_the_plain_agent_loop(period, llm1_roles):
    environment = RolePermutation(SharedReward(text_env(batch_size=4)), period)
    # each learner answers in its own way whatever its role, so the rewards follow the learner
    answer = {"llm1": lambda prompt: "#" * (len(prompt) % 3 + 1), "llm2": lambda prompt: "*" * (len(prompt) % 5)}
    seen_roles = ""
    for episode in range(10):
        environment.reset(seed=episode)
        responses, finished = {}, {}
        for agent in environment.agent_iter():
            observation, reward, terminated, truncated, info = environment.last()
            if terminated or truncated:
                finished[agent] = (reward, info)
                environment.step(None)
                continue
            responses[agent] = tuple(answer[agent](p) for p in observation["prompt"])
            environment.step(responses[agent])
        seen_roles += finished["llm1"][1]["role"][0]
        assert {finished["llm1"][1]["role"], finished["llm2"][1]["role"]} == {"pioneer", "observer"}
        lengths = {agent: np.array([len(r) for r in texts], dtype=float) for agent, texts in responses.items()}
        total = lengths["llm1"] + lengths["llm2"]
        for agent in ("llm1", "llm2"):
            reward, info = finished[agent]
            np.testing.assert_array_equal(info["task_rewards"], lengths[agent])
            np.testing.assert_array_equal(info["batch_rewards"], total)
            assert reward == pytest.approx(total.mean())
    assert seen_roles == llm1_roles


def test_build_env_assembles_the_cory_stack():
    task = TaskParts(
        dataset=ROWS, templates={"pioneer": "{query}", "observer": "{query} {pioneer}"}, reward_fn=length_reward
    )
    cory = config_from_dict(
        {
            "env": {"roles": ["pioneer", "observer"], "batch_size": 2},
            "agents": {"reward_coefficients": 0.5, "role_period": 2},
            "ppo": {"batching": {"mini_batch_size": 2}},
        }
    )
    environment = build_env(cory, task)
    assert isinstance(environment, RolePermutation) and isinstance(environment.env, SharedReward)
    assert environment.period == 2 and environment.possible_agents == ["llm1", "llm2"]
    np.testing.assert_array_equal(environment.env.coefficients, [[1, 0.5], [0.5, 1]])
    final = play(environment, {"llm1": ("a", "bb"), "llm2": ("ccc", "")})
    np.testing.assert_allclose(final["llm1"][1]["batch_rewards"], [1 + 1.5, 2 + 0])
    np.testing.assert_allclose(final["llm2"][1]["batch_rewards"], [3 + 0.5, 0 + 1])

    ppo = config_from_dict(
        {"env": {"roles": ["pioneer"], "batch_size": 2}, "ppo": {"batching": {"mini_batch_size": 2}}}
    )
    environment = build_env(ppo, task)
    assert isinstance(environment, RolePermutation) and not isinstance(environment.env, SharedReward)
    assert environment.period is None and environment.possible_agents == ["llm1"]

    critic = config_from_dict(
        {"env": {"roles": ["pioneer", "critic"], "batch_size": 2}, "ppo": {"batching": {"mini_batch_size": 2}}}
    )
    with pytest.raises(ValueError, match=r"default templates for roles \['observer', 'pioneer'\] only.*\['critic'\]"):
        build_env(critic, task)


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), -float("inf")])
def test_cooperation_weight_must_be_finite(weight):
    with pytest.raises(ValueError, match="λ must be a finite number"):
        cooperation_matrix(2, weight)
