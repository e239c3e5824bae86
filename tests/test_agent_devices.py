"""One agent per device (agents.devices): config checks, placement, and the loop's concurrent updates."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from marllm.config import config_from_dict
from marllm.config.loading import ConfigError
from marllm.envs.text_env import env as text_env
from marllm.loop import run_iteration
from marllm.run.setup import build
from tests.test_train import tiny_config


def cory(**agents):
    agents = {"reward_coefficients": 1.0, **agents}
    return config_from_dict({"env": {"roles": ["pioneer", "observer"]}, "agents": agents})


def test_devices_per_learner_from_a_list_or_a_mapping():
    assert cory(devices=["cuda:0", "cuda:1"]).learner_devices() == {"llm1": "cuda:0", "llm2": "cuda:1"}
    config = config_from_dict({"model": {"device": "cpu"}, "agents": {"devices": {"llm2": "cuda:1"}}})
    assert config.learner_devices() == {"llm1": "cpu", "llm2": "cuda:1"}


@pytest.mark.parametrize(
    ("agents", "message"),
    [
        ({"devices": ["cuda:0"]}, "lists 1 device"),
        ({"devices": {"llm3": "cpu"}}, "unknown learner"),
        ({"devices": ["cpu", "gpu7"]}, "'gpu7' is not a device name"),
        ({"reference_device": "tpu"}, "'tpu' is not a device name"),
    ],
)
def test_bad_devices_are_refused_when_the_config_loads(agents, message):
    with pytest.raises(ValueError, match=message):
        cory(**agents)


def test_lora_learners_of_one_base_share_its_device():
    with pytest.raises(ValueError, match="share one base model"):
        config_from_dict({"model": {"lora": {"r": 4}}, "agents": {"devices": ["cpu", "cuda:1"]}})


def test_a_device_this_machine_lacks_is_named_before_anything_loads(tiny_lm_dir, tiny_classifier_dir, reviews_file):
    config = tiny_config("cory_imdb.yaml", tiny_lm_dir, tiny_classifier_dir, reviews_file)
    config.agents.devices = {"llm2": "cuda:7"}
    with pytest.raises(ConfigError, match=r"agents\.devices\.llm2: 'cuda:7'"):
        config.check_references()


def test_devices_and_data_parallel_exclude_each_other():
    with pytest.raises(ConfigError, match="leave them unset with --nproc"):
        cory(devices=["cpu", "cpu"]).check_placement(2)
    cory(devices=["cpu", "cpu"]).check_placement(1)  # one process: fine


def test_placed_learners_and_reference(tiny_lm_dir, tiny_classifier_dir, reviews_file):
    config = tiny_config("cory_imdb.yaml", tiny_lm_dir, tiny_classifier_dir, reviews_file)
    config.agents.devices, config.agents.reference_device = ["cpu", "cpu"], "cpu"
    setup = build(config)
    assert {str(next(learner.model.parameters()).device) for learner in setup.learners.values()} == {"cpu"}
    assert str(next(setup.reference.parameters()).device) == "cpu"
    assert not setup.concurrent_updates  # both on one device: nothing to overlap


class SlowLearner:
    """A learner whose update takes a while and records when it ran."""

    def __init__(self, name: str):
        self.name, self.model, self.tokenizer = name, None, None
        self.spans: list[tuple[float, float, str]] = []
        self.rewards: list[float] = []

    def act(self, observation, role=None):
        return tuple(f"{self.name} says {prompt}" for prompt in observation["prompt"])

    def finish(self, rewards, task_rewards=None):
        self.rewards.append(float(np.mean(rewards)))

    def update(self):
        started = time.perf_counter()
        time.sleep(0.3)
        self.spans.append((started, time.perf_counter(), threading.current_thread().name))
        return {"task_reward": self.rewards[-1], "time/update_s": 0.3}


def test_concurrent_updates_overlap_and_report_what_sequential_updates_report():
    def play(concurrent):
        env = text_env(
            dataset=[{"query": f"q{i}"} for i in range(4)],
            roles=["pioneer", "observer"],
            templates={"pioneer": "{query}", "observer": "{query} {pioneer}"},
            reward_fn=lambda samples, responses: [float(len(r)) for r in responses],
            batch_size=2,
            seed=0,
        )
        learners = {"pioneer": SlowLearner("pioneer"), "observer": SlowLearner("observer")}
        metrics, _ = run_iteration(env, learners, seed=0, concurrent_updates=concurrent)
        return metrics, [learner.spans[0] for learner in learners.values()]

    sequential, (first, second) = play(False)
    assert first[1] <= second[0]  # one after the other
    concurrent, (first, second) = play(True)
    assert first[0] < second[1] and second[0] < first[1]  # each started before the other ended
    assert first[2] != second[2]
    assert concurrent["time/iteration_s"] < sequential["time/iteration_s"] - 0.2
    same = {key: value for key, value in concurrent.items() if not key.startswith("time/")}
    assert same == {key: value for key, value in sequential.items() if not key.startswith("time/")}
