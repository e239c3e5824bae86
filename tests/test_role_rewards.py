"""Role-aware task rewards of the text env (issue 22): a reward that takes a ``context`` sees who answered and the
dialogue, a mapping gives each role its own reward, and a two-argument reward is called exactly as before."""

import numpy as np
import pytest

from marllm.envs import RewardContext, SequentialTextEnv
from marllm.envs.reward_context import check_reward, rewards_by_role, score, wants_context
from marllm.loop import ActOnly, play_episode, run_iteration, turn_metrics

ROWS = [{"query": "a bike", "list_price": 100}, {"query": "a sofa", "list_price": 200}]
TEMPLATES = {"seller": "Sell {query}: $", "buyer": "Buy {query}, asked {seller}: $"}


def price(text):
    return float(text.strip().split()[0])


def haggle(samples, responses, context):
    """The deal is the price named last; the seller wants it high, the buyer low."""
    deals = [price(text) / sample["list_price"] for sample, text in zip(samples, context.dialogue[-1], strict=True)]
    return [d - 1 if context.role == "seller" else 1 - d for d in deals]


def make(reward_fn, turns=None, **kwargs):
    return SequentialTextEnv(
        ROWS, ["seller", "buyer"], TEMPLATES, reward_fn, batch_size=2, seed=0, turns=turns, **kwargs
    )


def play(env, answers):
    """Play one episode with fixed answers per role (a list of answers per turn for a role that speaks again)."""
    queues = {role: list(texts) if isinstance(texts, list) else [texts] for role, texts in answers.items()}
    players = {role: ActOnly(lambda prompts, role=role: queues[role].pop(0)) for role in answers}
    return play_episode(env, players, seed=0)


def test_a_reward_with_a_context_scores_opposed_roles():
    episode = play(make(haggle), {"seller": ("150", "250"), "buyer": ("80", "100")})
    # the deal is the buyer's (the last turn): 80 of 100 and 100 of 200
    np.testing.assert_allclose(episode.task_rewards("seller"), [-0.2, -0.5])
    np.testing.assert_allclose(episode.task_rewards("buyer"), [0.2, 0.5])


def test_the_context_names_the_role_the_turn_and_holds_the_dialogue():
    seen = []

    def record(samples, responses, context):
        seen.append(context)
        return [0.0] * len(responses)

    env = make(record, turns=["seller", "buyer", "seller"])
    play(env, {"seller": [("100", "200"), ("90", "180")], "buyer": ("70", "150")})
    by_turn = {context.turn_name: context for context in seen}
    assert sorted(by_turn) == ["buyer_1", "seller_1", "seller_2"]
    second = by_turn["seller_2"]
    assert isinstance(second, RewardContext)
    assert (second.role, second.turn, second.turns, second.is_last_turn) == ("seller", 2, ("seller", "buyer", "seller"),
                                                                            True)
    assert second.samples == tuple(ROWS)
    assert second.responses == ("90", "180") and second.dialogue[1] == ("70", "150")
    assert second.responses_of("seller") == [("100", "200"), ("90", "180")] and second.last("buyer") == ("70", "150")
    assert second.earlier[0] == {"seller": "100", "seller_1": "100", "buyer": "70", "buyer_1": "70"}
    first = by_turn["seller_1"]
    assert first.earlier == [{}, {}] and first.dialogue == second.dialogue  # scored at the end: every turn is there


def test_a_reward_per_role():
    low = lambda samples, responses: [-price(r) for r in responses]  # noqa: E731
    high = lambda samples, responses: [price(r) for r in responses]  # noqa: E731
    episode = play(make({"seller": high, "buyer": low}), {"seller": ("150", "250"), "buyer": ("80", "100")})
    np.testing.assert_allclose(episode.task_rewards("seller"), [150, 250])
    np.testing.assert_allclose(episode.task_rewards("buyer"), [-80, -100])
    with pytest.raises(ValueError, match=r"must name each of the roles \['seller', 'buyer'\] once.*no reward for "
                                         r"\['buyer'\]"):
        make({"seller": high})
    with pytest.raises(ValueError, match=r"\['critic'\] are not roles"):
        make({"seller": high, "buyer": low, "critic": low})


def test_two_argument_rewards_are_called_as_before():
    calls = []

    def plain(samples, responses):
        calls.append((samples, responses))
        return [len(r) for r in responses]

    env = make(plain)
    episode = play(env, {"seller": ("150", "25"), "buyer": ("8", "100")})
    assert not wants_context(plain)
    assert [responses for _, responses in calls] == [["150", "25"], ["8", "100"]]
    assert all(samples is env.samples for samples, _ in calls)  # the env's own rows, no context added
    np.testing.assert_allclose(episode.task_rewards("buyer"), [1, 3])


@pytest.mark.parametrize(
    "reward",
    [lambda samples: [0.0], lambda samples, responses, extra: [0.0], lambda: [0.0], 3.0, dict],
    ids=["one-argument", "third-not-context", "no-argument", "a-number", "a-class"],
)
def test_rewards_of_the_wrong_shape_are_refused_naming_the_signature(reward):
    with pytest.raises(TypeError, match="reward_fn"):
        make(reward)


def test_check_reward_accepts_both_forms_and_callable_objects():
    class Scorer:
        def __call__(self, samples, responses, context=None):
            return [1.0] * len(responses)

    for reward in (haggle, lambda samples, responses: [], Scorer()):
        check_reward(reward)
    assert wants_context(Scorer()) and wants_context(haggle)
    context = RewardContext("buyer", 1, ("seller", "buyer"), tuple(ROWS), (("100", "200"), ("50", "100")))
    assert score(haggle, ROWS, ["50", "100"], context) == pytest.approx([0.5, 0.5])
    assert score({"seller": haggle, "buyer": Scorer()}, ROWS, ["50", "100"], context) == [1.0, 1.0]
    assert rewards_by_role(haggle, ["a", "b"]) == {"a": haggle, "b": haggle}


class Fixed:
    """A player that learns nothing and reports no metrics: the loop's own metrics are what is tested."""

    def __init__(self, answers):
        self.answers = list(answers)

    def act(self, observation, role=None):
        return self.answers.pop(0)

    def finish(self, rewards, task_rewards=None):
        pass

    def update(self):
        return {}


def test_a_role_that_speaks_several_times_logs_its_role_reward_and_each_turn():
    def own(samples, responses):
        return [price(r) for r in responses]

    env = make(own, turns=["seller", "buyer", "seller"])
    learners = {"seller": Fixed([("10", "20"), ("30", "50")]), "buyer": Fixed([("1", "3")])}
    metrics, _ = run_iteration(env, learners, seed=0)
    assert metrics["seller/role_task_reward"] == 40.0  # its last response's, as the env's task_rewards
    assert metrics["seller/turn_task_reward/seller_1"] == 15.0
    assert metrics["seller/turn_task_reward/seller_2"] == 40.0
    assert not any(key.startswith("buyer/") and "task_reward" in key for key in metrics)  # one turn: nothing added


def test_one_turn_per_role_adds_no_metric():
    episode = play(make(haggle), {"seller": ("150", "250"), "buyer": ("80", "100")})
    assert turn_metrics(episode) == {}
