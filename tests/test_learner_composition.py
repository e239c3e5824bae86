"""The PPO learner is composed of parts with explicit inputs, not mixins: its subclasses' constructors take their own
options and pass the rest on (:class:`LearnerArguments`), and each part holds what the learner gave it."""

from __future__ import annotations

import inspect
import typing

import pytest

from marllm.algorithms.actions import COLLECTORS, ConstrainedCollector, ScoreCollector, ThinkCollector, TokenCollector
from marllm.algorithms.critic_free_learner import CriticFreeLearner
from marllm.algorithms.learner_arguments import LearnerArguments
from marllm.algorithms.learner_checkpoint import LearnerCheckpoint
from marllm.algorithms.policy_gradient import PolicyGradientLearner
from marllm.algorithms.ppo import PPOLearner
from marllm.algorithms.ppo_steps import PPOSteps
from tests.test_ppo_learner import make_learner


def keyword_parameters(cls: type) -> dict[str, inspect.Parameter]:
    return {
        name: parameter
        for name, parameter in inspect.signature(cls.__init__).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }


def test_learner_arguments_are_the_ppo_learners_shared_keywords():
    shared = set(keyword_parameters(PPOLearner)) - {"actions", "normalization"}
    assert set(typing.get_type_hints(LearnerArguments)) == shared
    assert LearnerArguments.__required_keys__ == {
        name for name, p in keyword_parameters(PPOLearner).items() if p.default is inspect.Parameter.empty
    }


def test_subclasses_take_their_own_options_and_pass_the_rest_on():
    for cls, own in [
        (CriticFreeLearner, {"algorithm", "group_size", "settings", "actions", "normalization"}),
    ]:
        parameters = inspect.signature(cls.__init__).parameters
        assert set(keyword_parameters(cls)) == own, cls
        assert parameters["learner_kwargs"].kind is inspect.Parameter.VAR_KEYWORD, cls


def test_the_family_adds_downwards_and_the_learner_inherits_no_part(tokenizer):
    """PPO and the critic-free learners each add to the clipped policy gradient; neither takes a part away from the
    other, and the parts (collector, steps, checkpoint) are owned, not inherited."""
    assert PPOLearner.__mro__ == (PPOLearner, PolicyGradientLearner, object)
    assert CriticFreeLearner.__mro__ == (CriticFreeLearner, PolicyGradientLearner, object)
    assert PolicyGradientLearner._critic is not PPOLearner._critic and "_critic" not in vars(CriticFreeLearner)
    learner = make_learner(tokenizer)
    collector = learner.collector
    assert type(collector) is TokenCollector
    assert collector.model is learner.model and collector.value_head is learner.value_head
    assert collector.rng is learner._rng and collector.compute is learner.config.compute
    steps = learner._optimisation()
    assert isinstance(steps, PPOSteps) and steps.rng is learner._rng and steps.optimizer is learner.optimizer
    assert steps.parameters == learner._trained_parameters()
    checkpoint = learner._checkpoint()
    assert isinstance(checkpoint, LearnerCheckpoint) and checkpoint.score_statistics is learner.score_statistics
    assert checkpoint.num_updates == learner.num_updates and checkpoint.pending == 0


@pytest.mark.parametrize("actions", sorted(COLLECTORS))
def test_every_action_mode_is_a_collector_the_learner_owns(tokenizer, actions):
    learner = make_learner(tokenizer, learner_kwargs={"actions": actions})
    expected = {"generate": TokenCollector, "constrained": ConstrainedCollector, "think": ThinkCollector}
    assert type(learner.collector) is expected.get(actions, ScoreCollector)
    assert learner.collector.actions == actions and learner.collector.model is learner.model


def test_the_normalization_is_scores_and_refused_with_another_mode(tokenizer):
    learner = make_learner(tokenizer, learner_kwargs={"actions": "score", "normalization": "word"})
    assert learner.collector.normalization == "word"
    with pytest.raises(ValueError, match=r"normalization applies to actions \['score'\] only, not 'constrained'"):
        make_learner(tokenizer, learner_kwargs={"actions": "constrained", "normalization": "word"})
    with pytest.raises(ValueError, match="normalization must be one of"):
        make_learner(tokenizer, learner_kwargs={"actions": "score", "normalization": "chars"})
