"""The PPO learner is composed of parts with explicit inputs, not mixins: its subclasses' constructors take their own
options and pass the rest on (:class:`LearnerArguments`), and each part holds what the learner gave it."""

from __future__ import annotations

import inspect
import typing

from marllm.algorithms.action_ppo import ActionPPOLearner, MoveScoreCollector
from marllm.algorithms.critic_free_learner import CriticFreeLearner
from marllm.algorithms.learner_arguments import LearnerArguments
from marllm.algorithms.learner_checkpoint import LearnerCheckpoint
from marllm.algorithms.ppo import PPOLearner
from marllm.algorithms.ppo_steps import PPOSteps
from marllm.algorithms.rollout import RolloutCollector
from tests.test_ppo_learner import make_learner


def keyword_parameters(cls: type) -> dict[str, inspect.Parameter]:
    return {
        name: parameter
        for name, parameter in inspect.signature(cls.__init__).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }


def test_learner_arguments_are_the_ppo_learners_shared_keywords():
    shared = set(keyword_parameters(PPOLearner)) - {"actions"}
    assert set(typing.get_type_hints(LearnerArguments)) == shared
    assert LearnerArguments.__required_keys__ == {
        name for name, p in keyword_parameters(PPOLearner).items() if p.default is inspect.Parameter.empty
    }


def test_subclasses_take_their_own_options_and_pass_the_rest_on():
    for cls, own in [
        (CriticFreeLearner, {"algorithm", "group_size", "settings", "actions"}),
        (ActionPPOLearner, {"normalization", "actions"}),
    ]:
        parameters = inspect.signature(cls.__init__).parameters
        assert set(keyword_parameters(cls)) == own, cls
        assert parameters["learner_kwargs"].kind is inspect.Parameter.VAR_KEYWORD, cls


def test_the_learner_inherits_no_part_and_its_parts_share_its_objects(tokenizer):
    assert PPOLearner.__mro__ == (PPOLearner, object)
    learner = make_learner(tokenizer)
    collector = learner.collector
    assert type(collector) is RolloutCollector
    assert collector.model is learner.model and collector.value_head is learner.value_head
    assert collector.rng is learner._rng and collector.config is learner.config
    steps = learner._optimisation()
    assert isinstance(steps, PPOSteps) and steps.rng is learner._rng and steps.optimizer is learner.optimizer
    assert steps.parameters == learner._trained_parameters()
    checkpoint = learner._checkpoint()
    assert isinstance(checkpoint, LearnerCheckpoint) and checkpoint.score_statistics is learner.score_statistics
    assert checkpoint.num_updates == learner.num_updates and checkpoint.pending == 0


def test_the_score_learner_acts_through_its_own_collector(tokenizer):
    learner = make_learner(tokenizer, learner_class=ActionPPOLearner, learner_kwargs={"normalization": "word"})
    assert type(learner.collector) is MoveScoreCollector and learner.collector.normalization == "word"
    assert learner.collector.actions == "score"
