"""Turn orders: a role may speak several times; prompts read earlier turns; each turn is rewarded and trained."""

import json

import numpy as np
import pytest
from pettingzoo.test import api_test, seed_test

from marllm.config import config_from_dict
from marllm.envs import SequentialTextEnv, env
from marllm.loop import run_iteration
from marllm.wrappers import RolePermutation, SharedReward
from tests.test_learner_protocol import EchoLearner

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:pettingzoo.test.api_test")

ROWS = [{"query": "q0"}, {"query": "q1"}, {"query": "q2"}]
TURNS = ["proposer", "critic", "proposer"]
TEMPLATES = {
    "proposer": "propose for {query}",
    "critic": "critique {proposer}",
    "proposer_2": "revise {proposer_1} given {critic_1}",
}


def length_reward(samples, responses):
    return [float(len(r)) for r in responses]


def make(turns=TURNS, templates=TEMPLATES, **kwargs):
    roles = ["proposer", "critic"]
    return SequentialTextEnv(ROWS, roles, templates, length_reward, batch_size=2, turns=turns, **kwargs)


def play(environment, answers):
    """One episode answering turn k with ``answers[k]`` in every dialogue: the prompts seen and each agent's final
    info."""
    environment.reset(seed=0)
    seen, infos, turn = [], {}, 0
    batch_size = environment.unwrapped.batch_size
    for agent in environment.agent_iter():
        observation, reward, terminated, truncated, info = environment.last()
        if terminated or truncated:
            infos[agent] = {**info, "last_reward": reward}
            environment.step(None)
            continue
        seen.append((agent, observation["prompt"]))
        environment.step((answers[turn],) * batch_size)
        turn += 1
    return seen, infos


def test_a_role_speaks_in_every_turn_it_has_and_reads_earlier_turns_by_role_and_by_name():
    environment = make()
    assert environment.turn_names == ["proposer_1", "critic_1", "proposer_2"]
    seen, _ = play(environment, ["draft", "too short", "a longer draft"])
    queries = [s["query"] for s in environment.samples]
    assert [agent for agent, _ in seen] == TURNS
    assert seen[0][1] == tuple(f"propose for {q}" for q in queries)
    assert seen[1][1] == ("critique draft",) * 2
    assert seen[2][1] == ("revise draft given too short",) * 2  # its own turn template, reading turns by name
    assert environment.responses["proposer"] == ("a longer draft",) * 2  # a role's latest response
    assert "proposer (proposer_2): 'revise draft given too short' -> 'a longer draft'" in (
        SequentialTextEnv.render(_with_ansi(environment))
    )


def _with_ansi(environment):
    environment.render_mode = "ansi"
    return environment


@pytest.mark.parametrize(
    ("turn_rewards", "proposer_turns"),
    [("each", [[5.0, 5.0], [14.0, 14.0]]), ("last", [[14.0, 14.0], [14.0, 14.0]])],
)
def test_each_turn_is_credited_with_its_own_or_the_roles_last_reward(turn_rewards, proposer_turns):
    environment = make(turn_rewards=turn_rewards)
    _, infos = play(environment, ["draft", "too short", "a longer draft"])
    proposer, critic = infos["proposer"], infos["critic"]
    np.testing.assert_array_equal(proposer["turn_task_rewards"], proposer_turns)
    np.testing.assert_array_equal(proposer["task_rewards"], [14.0, 14.0])  # the role's reward: its last response
    np.testing.assert_array_equal(critic["turn_task_rewards"], [[9.0, 9.0]])
    assert proposer["last_reward"] == 14.0 and critic["last_reward"] == 9.0  # PettingZoo's scalar: the batch mean


def test_shared_reward_mixes_each_turn_as_its_own_reward_plus_the_partners_episode_rewards():
    wrapped = SharedReward(make(), [[1.0, 0.5], [0.25, 2.0]])
    _, infos = play(wrapped, ["draft", "too short", "a longer draft"])
    proposer, critic = infos["proposer"], infos["critic"]
    # proposer: own turns 5 and 14, partner (critic) 9 at 0.5; critic: own 9 at 2, partner's episode reward 14 at 0.25
    np.testing.assert_allclose(proposer["turn_batch_rewards"], [[5 + 4.5] * 2, [14 + 4.5] * 2])
    np.testing.assert_allclose(proposer["batch_rewards"], [18.5, 18.5])
    np.testing.assert_allclose(critic["turn_batch_rewards"], [[18 + 3.5] * 2])
    np.testing.assert_array_equal(proposer["turn_task_rewards"], [[5.0, 5.0], [14.0, 14.0]])  # never mixed


def test_one_turn_per_role_is_mixed_exactly_as_the_episode_reward():
    rows = [{"query": f"q{i}"} for i in range(4)]
    inner = SequentialTextEnv(rows, ["a", "b"], ["{query} 0.1", "{a} 0.3"], length_reward, batch_size=4)
    wrapped = SharedReward(inner, [[0.7, 0.3], [1 / 3, 1.1]])
    _, infos = play(wrapped, ["x" * 7, "y" * 11])
    for info in infos.values():
        assert np.array_equal(info["turn_batch_rewards"][0], info["batch_rewards"])  # bit for bit


def test_run_iteration_rewards_every_turn_of_a_learner_in_order_under_role_exchange():
    inner = make(turn_rewards="each")
    wrapped = RolePermutation(inner, period=1, learners=["alice", "bob"])
    learners = {"alice": EchoLearner("alice"), "bob": EchoLearner("bob")}
    _, dialogues = run_iteration(wrapped, learners, seed=0)
    assert [turn["responses"][0] for turn in dialogues["alice"]["turns"]] == ["alice", "alice"]
    assert [r[0] for r in learners["alice"].rewarded] == ["proposer", "proposer"]
    assert [r[1].tolist() for r in learners["alice"].rewarded] == [[5.0, 5.0], [5.0, 5.0]]  # len("alice") each turn
    assert len(learners["bob"].rewarded) == 1
    run_iteration(wrapped, learners)  # roles swap: bob proposes twice
    assert [r[0] for r in learners["bob"].rewarded[1:]] == ["proposer", "proposer"]


@pytest.mark.parametrize("wrapping", ["factory", "raw"])
@pytest.mark.parametrize("turns", [TURNS, ["critic", "proposer", "critic", "proposer"]])
def test_pettingzoo_api_with_turn_orders(wrapping, turns):
    templates = {"proposer": "{query}", "critic": "{query}!"}
    kwargs = dict(dataset=ROWS, roles=["proposer", "critic"], templates=templates, reward_fn=length_reward,
                  batch_size=2, turns=turns)
    api_test((env if wrapping == "factory" else SequentialTextEnv)(**kwargs), num_cycles=5)
    seed_test(lambda: env(**kwargs), num_cycles=5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"turns": ["proposer", "judge"]}, r"turns name\(s\) \['judge'\] that are not roles"),
        ({"turns": ["proposer", "proposer"]}, r"never let role\(s\) \['critic'\] speak"),
        ({"turns": "proposer"}, "turns must be a list of role names"),
        ({"turn_rewards": "first"}, r"turn_rewards must be one of \['each', 'last'\]"),
        ({"templates": {"critic": "{proposer}", "proposer_2": "{critic}"}}, r"missing \['proposer'\]"),
        ({"templates": {**TEMPLATES, "critic_2": "{query}"}}, r"unknown \['critic_2'\]"),
        ({"templates": {**TEMPLATES, "proposer": "{critic}"}}, r"role 'proposer' \(turn proposer_1\) uses unknown"),
        ({"templates": {**TEMPLATES, "critic": "{proposer_2}"}}, r"unknown field\(s\) \['proposer_2'\]"),
    ],
)
def test_bad_turn_orders_and_templates_are_refused_when_the_env_is_built(kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        make(**kwargs)


def test_the_config_takes_a_turn_order_and_refuses_a_bad_one():
    data = {"env": {"roles": ["proposer", "critic"], "turns": TURNS, "turn_rewards": "last", "templates": TEMPLATES}}
    config = config_from_dict(data)
    assert config.speaking_order == TURNS and config.role_templates() == TEMPLATES
    with pytest.raises(ValueError, match="never let role"):
        config_from_dict({"env": {**data["env"], "turns": ["proposer"]}})
    with pytest.raises(ValueError, match=r"unknown \['critic_3'\]"):
        config_from_dict({"env": {**data["env"], "templates": {**TEMPLATES, "critic_3": "x"}}})


def test_a_propose_critique_revise_run_trains_and_logs_each_turn(tmp_path, tiny_lm_dir, tiny_classifier_dir,
                                                                     reviews_file):
    from marllm.run.train import train
    from tests.test_critic_free_learner import tiny_cory_data

    env_settings = {
        "roles": ["proposer", "critic"],
        "turns": TURNS,
        "templates": {"proposer": "{query}", "critic": "{proposer}", "proposer_2": "{critic} {proposer_1}"},
    }
    data = tiny_cory_data(tiny_lm_dir, tiny_classifier_dir, reviews_file, {"role_period": 1}, env_settings)
    result = train(config_from_dict({**data, "iterations": 2}), tmp_path / "run")
    assert [m["llm1/role"] for m in result.history] == ["proposer", "critic"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    proposer_rows = [r for r in rows if r["iteration"] == 0 and r["learner"] == "llm1"]
    assert {r["turn"] for r in proposer_rows} == {1, 2} and all("turn" not in r for r in rows if r["role"] == "critic")


def test_cross_play_refuses_a_config_whose_roles_speak_more_than_once():
    from marllm.evaluation.cross_play import cross_play_of_checkpoints

    config = config_from_dict({"env": {"roles": ["proposer", "critic"], "turns": TURNS, "templates": TEMPLATES}})
    with pytest.raises(ValueError, match="lets a role speak several times"):
        cross_play_of_checkpoints(config, ["base"])
