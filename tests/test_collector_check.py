"""marllm.testing.check_collector on every built-in action mode's collector (tiny GPT-2 models built here, as a
learner builds its collector), and failing on collectors that break what it checks."""

from __future__ import annotations

import pytest
import torch

from marllm.testing import CheckNotApplicable, check_collector
from tests.test_learner_conformance import MOVES, RULES, tiny_learner

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# Moves of several tokens, two sharing their first tokens; prompts that share the rules, of different lengths.
OBSERVATION = {
    "prompt": [RULES + "a b", RULES + "what a terrible waste of time", RULES + "good"],
    "legal_moves": [MOVES[2], MOVES[0], MOVES[1]],
}
EXACT = ("constrained", "score")
# Free text is collected one answer per batch (its budget is drawn per batch): fewer samples.
SAMPLES = {"generate": 200, "think": 150, "constrained": 400, "score": 400}


def collector_of(actions: str):
    """A zero-argument factory of the collector a tiny learner of ``actions`` acts through."""
    return lambda: tiny_learner(None, "ppo", actions).collector


@pytest.mark.parametrize("actions", ["generate", "constrained", "think", "score"])
def test_every_built_in_collector_passes(actions):
    report = check_collector(collector_of(actions), OBSERVATION, samples=SAMPLES[actions])
    assert report["first_ratio_is_one"].startswith("largest log-prob difference")
    assert report["exact_is_played"].startswith("not run") == (actions not in EXACT)
    assert not report["play_is_collect"].startswith("not run")


def test_free_text_answers_without_legal_moves_are_checked_too():
    observation = {"prompt": OBSERVATION["prompt"]}
    report = check_collector(collector_of("generate"), observation, samples=SAMPLES["generate"])
    assert report["exact_is_played"] == "not run: the mode has no exact move probabilities"
    assert "kinds of answer as frequent" in report["play_is_collect"]


def broken(actions: str, part: str, replacement):
    """A factory of the collector of ``actions`` with ``part`` replaced by ``replacement(collector, original)``."""

    def make():
        collector = collector_of(actions)()
        setattr(collector, part, replacement(collector, getattr(collector, part)))
        return collector

    return make


def records_off_by_a_tenth(collector, collect):
    def shifted(observation, role=None):
        rollout = collect(observation, role)
        rollout.tensors.logprobs = rollout.tensors.logprobs + 0.1
        return rollout

    return shifted


def tabulates_one_move(collector, move_probabilities):
    return lambda prompts, moves: [[1.0] + [0.0] * (len(row) - 1) for row in moves]


def fails_to_tabulate(collector, move_probabilities):
    def failing(prompts, moves):
        raise ValueError("no probabilities here")

    return failing


def plays_the_first_move(collector, play):
    return lambda observation: tuple(moves[0] for moves in observation["legal_moves"])


def plays_colder(collector, play):
    """Free text played at a tenth of the temperature it is collected at."""

    def colder(observation):
        generation = collector.generation
        collector.generation = type(generation)(**{**vars(generation), "temperature": 0.1})
        try:
            return play(observation)
        finally:
            collector.generation = generation

    return colder


@pytest.mark.parametrize(
    ("actions", "part", "replacement", "complaint"),
    [
        ("score", "collect", records_off_by_a_tenth, r"differ from the recorded ones by up to 0\.1"),
        ("generate", "collect", records_off_by_a_tenth, r"an update's first ratio would not be 1"),
        ("constrained", "move_probabilities", tabulates_one_move, r"is collected .* not those of the policy"),
        ("score", "move_probabilities", fails_to_tabulate, r"says it has exact move probabilities .* failed"),
        ("score", "play", plays_the_first_move, r"is played outside training .* not those of the policy that plays"),
        ("generate", "play", plays_colder, r"the two do not sample one distribution"),
        ("think", "play", plays_colder, r"the two do not sample one distribution"),
    ],
    ids=["score ratio", "generate ratio", "constrained exact", "score no exact", "score play", "generate play",
         "think play"],  # fmt: skip
)
def test_the_check_fails_on_a_collector_that_breaks_an_invariant(actions, part, replacement, complaint):
    with pytest.raises(AssertionError, match=complaint):
        check_collector(broken(actions, part, replacement), OBSERVATION, samples=SAMPLES[actions])


def test_an_object_without_the_collector_methods_is_told_what_it_lacks():
    class Answers:
        def collect(self, observation, role=None):
            return None

    with pytest.raises(CheckNotApplicable, match=r"Answers lacks \['rescore', 'play', 'move_probabilities'\]"):
        check_collector(Answers, OBSERVATION)


def test_the_global_generator_is_what_the_check_seeds():
    first = check_collector(collector_of("score"), OBSERVATION, samples=200, seed=3)
    torch.manual_seed(12345)
    assert check_collector(collector_of("score"), OBSERVATION, samples=200, seed=3) == first
