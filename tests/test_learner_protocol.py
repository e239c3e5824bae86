"""The loop is written against the Learner interface: the built-in learners satisfy it, and so does a new one."""

import numpy as np

from marllm.algorithms import CriticFreeLearner, GenerationConfig, Learner, PPOConfig, PPOLearner
from marllm.envs import SequentialTextEnv
from marllm.loop import IterationResult, run_iteration
from marllm.wrappers import RolePermutation, SharedReward
from tests.conftest import make_tiny_gpt2


class EchoLearner:
    """A learner with no model: it answers every prompt with its own name and records what it was told."""

    def __init__(self, name):
        self.name, self.model, self.tokenizer = name, None, None
        self.pending, self.rewarded, self.updates = [], [], 0

    def act(self, observation, role=None):
        self.pending.append(role)
        return tuple(self.name for _ in observation["prompt"])

    def finish(self, rewards, task_rewards=None):
        self.rewarded.append((self.pending.pop(0), np.asarray(rewards), np.asarray(task_rewards)))

    def update(self):
        self.updates += 1
        return {"task_reward": float(np.mean(self.rewarded[-1][2]))}

    def activate(self):
        pass

    def reference_model(self):
        raise NotImplementedError

    def state_dict(self):
        return {}, {"updates": self.updates}

    def load_state_dict(self, tensors, meta):
        self.updates = meta["updates"]

    def save(self, directory):
        pass


def test_built_in_learners_satisfy_the_interface(tokenizer):
    model = make_tiny_gpt2(tokenizer)
    ppo = PPOLearner(
        "llm1",
        model=model,
        tokenizer=tokenizer,
        reference=model,
        config=PPOConfig.from_flat(mini_batch_size=4),
        generation=GenerationConfig(4, 6),
    )
    grpo = CriticFreeLearner(
        "llm2",
        model=model,
        tokenizer=tokenizer,
        reference=model,
        config=PPOConfig.from_flat(mini_batch_size=4),
        group_size=2,
    )
    assert isinstance(ppo, Learner) and isinstance(grpo, Learner) and isinstance(EchoLearner("x"), Learner)


def test_run_iteration_drives_any_learner_through_the_wrapped_env():
    def reward(samples, responses):
        return [float(response == "alice") for response in responses]

    env = SequentialTextEnv([{"query": "q"}], ["pioneer", "observer"], ["{query}", "{pioneer}"], reward, batch_size=3)
    env = RolePermutation(SharedReward(env, [[1.0, 0.5], [0.5, 1.0]]), period=1, learners=["alice", "bob"])
    learners = {"alice": EchoLearner("alice"), "bob": EchoLearner("bob")}
    for iteration in range(2):
        metrics, dialogues = run_iteration(env, learners, seed=iteration)
        assert dialogues["alice"]["turns"][0]["responses"] == ("alice",) * 3
    # iteration 0: alice is the pioneer; iteration 1 the roles swap. alice scores 1, bob 0, so with C = [[1, .5],
    # [.5, 1]] alice always receives 1 and bob 0.5, whichever role each plays.
    assert [r[0] for r in learners["alice"].rewarded] == ["pioneer", "observer"]
    assert all(np.allclose(r[1], 1.0) and np.allclose(r[2], 1.0) for r in learners["alice"].rewarded)
    assert all(np.allclose(r[1], 0.5) and np.allclose(r[2], 0.0) for r in learners["bob"].rewarded)
    assert metrics["alice/task_reward"] == 1.0 and metrics["bob/role"] == "pioneer"
    assert learners["alice"].updates == learners["bob"].updates == 2


class Sealed(RolePermutation):
    """A wrapped env whose inner env cannot be reached: the loop must get by with the AEC API."""

    @property
    def unwrapped(self):
        raise AssertionError("the loop reached into env.unwrapped")


def test_run_iteration_records_the_queries_from_the_infos_and_returns_a_named_result():
    rows = [{"query": f"q{i}"} for i in range(4)]
    env = SequentialTextEnv(rows, ["pioneer", "observer"], ["{query}", "{pioneer}"], lambda s, r: [0.0] * len(r), 4)
    env = Sealed(SharedReward(env), period=1, learners=["alice", "bob"])
    learners = {"alice": EchoLearner("alice"), "bob": EchoLearner("bob")}
    result = run_iteration(env, learners, seed=0)
    assert isinstance(result, IterationResult) and result.metrics["alice/role"] == "pioneer"
    queries = result.dialogues["alice"]["queries"]
    assert sorted(queries) == [row["query"] for row in rows] and result.dialogues["bob"]["queries"] == queries
    # the pioneer's prompt is its query: the recorded queries line up with the dialogues
    assert result.dialogues["alice"]["turns"][0]["prompts"] == queries
    metrics, dialogues = result
    assert metrics is result.metrics and dialogues is result.dialogues
