"""The public checks fail, or say why they cannot run, where a learner breaks what they check: a learner without a
collector (the custom-envs guide's ``WordBandit``), an objective that rescales the log-probs it is given, and a
checkpoint without its optimiser's state."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from marllm.testing import (
    CheckNotApplicable,
    check_first_update_is_on_policy,
    check_learner,
    check_resume_equals_uninterrupted,
)
from marllm.utils.errors import CheckpointError
from tests.test_learner_conformance import maker, observations, tiny_learner

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "custom-envs.md"


def word_bandit() -> type:
    """The guide's ``WordBandit``, as the guide writes it (its block up to the env it plays)."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)
    (block,) = [code for code in blocks if "class WordBandit" in code]
    namespace: dict = {}
    exec(block[: block.index("env = text_env(")], namespace)
    return namespace["WordBandit"]


def test_a_learner_without_a_collector_is_not_passed_but_told_what_each_check_needs():
    bandit = word_bandit()
    turns = [{"prompt": ["The film", "This movie is"]}]
    with pytest.raises(CheckNotApplicable, match=r"learner.collector with collect and rescore"):
        check_first_update_is_on_policy(lambda: bandit("llm", seed=1), turns, [[1.0, 0.0]])
    with pytest.raises(CheckNotApplicable, match=r"WordBandit has no state_dict and no load_state_dict"):
        check_resume_equals_uninterrupted(lambda: bandit("llm", seed=1), turns, [[1.0, 0.0]])
    report = check_learner(lambda: bandit("llm", seed=1), turns, [[1.0, 0.0]])
    assert report["first_update_on_policy"].startswith("not run: llm: the on-policy check watches")
    assert "marllm.algorithms.Learner protocol" in report["resume_equals_uninterrupted"]
    assert report["resume_equals_uninterrupted"].startswith("not run:")


ALTERED = {
    "rescaled": lambda logprobs: logprobs * 1.1,
    "offset": lambda logprobs: logprobs + 0.5,  # every ratio e^0.5 at the first step
    "detached": lambda logprobs: logprobs.detach() + 0.0 * logprobs,  # a loss that cannot move the policy
}


def rescaling(algorithm: str, actions: str, altered: str = "rescaled"):
    """A learner of ``algorithm`` whose objective is handed its log-probs altered as :data:`ALTERED` says."""

    def make():
        learner = tiny_learner(None, algorithm, actions)
        objective = learner._objective

        def scaled(mb, logprobs, *rest):
            return objective(mb, ALTERED[altered](logprobs), *rest)

        learner._objective = scaled
        return learner

    return make


@pytest.mark.parametrize(
    ("algorithm", "actions"),
    [("ppo", "generate"), ("ppo", "score"), ("grpo", "generate"), ("reinforce_pp", "constrained")],
)
def test_an_objective_that_rescales_the_log_probs_it_is_given_fails_the_on_policy_check(algorithm, actions):
    turns, rewards = observations(algorithm)
    assert check_first_update_is_on_policy(maker(algorithm, actions, None), turns, rewards) < 1e-5
    with pytest.raises(AssertionError, match=r"does not read the log-probs against|the ratio it optimises is not 1"):
        check_first_update_is_on_policy(rescaling(algorithm, actions), turns, rewards)


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
@pytest.mark.parametrize(
    ("altered", "message"),
    [("offset", "the ratio it optimises is not 1"), ("detached", "gradient .* is 0 on rewards that differ")],
)
def test_an_objective_off_policy_or_without_gradient_fails_the_on_policy_check(algorithm, altered, message):
    turns, rewards = observations(algorithm)
    with pytest.raises(AssertionError, match=message):
        check_first_update_is_on_policy(rescaling(algorithm, "generate", altered), turns, rewards)


@pytest.mark.parametrize("dropped", ["every optimiser entry", "one parameter's moments"])
def test_a_state_without_its_optimiser_entries_is_refused_naming_them(dropped):
    turns, rewards = observations("ppo")
    learner = maker("ppo", "score", None)()
    for observation, row in zip(turns, rewards, strict=True):
        learner.act(observation)
        learner.finish(row)
    learner.update()
    tensors, meta = learner.state_dict()
    optimiser = sorted(key for key in tensors if key.startswith("optimizer/"))
    first_layer = [key for key in optimiser if key.startswith("optimizer/policy/transformer.h.0.")]
    gone = optimiser if dropped == "every optimiser entry" else first_layer
    assert gone
    kept = {key: tensor for key, tensor in tensors.items() if key not in gone}
    fresh = maker("ppo", "score", None)()
    with pytest.raises(CheckpointError, match=re.escape(gone[0])):
        fresh.load_state_dict(kept, meta)
    legacy = {key: value for key, value in meta.items()}
    legacy["optimizer"] = {key: value for key, value in meta["optimizer"].items() if key != "tensors"}
    if dropped == "every optimiser entry":  # a checkpoint written before the optimiser's entries were listed
        with pytest.raises(CheckpointError, match=r"no optimiser state \(optimizer/\*\) though saved after 1 update"):
            fresh.load_state_dict(kept, legacy)
    fresh.load_state_dict(tensors, meta)  # the whole state still loads
    assert fresh.num_updates == 1
