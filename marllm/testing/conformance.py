"""A learner conformance suite: the invariants every learner × action mode × cost setting must keep, checked on a
learner the caller builds (PettingZoo's ``api_test`` is the model).

Each check takes ``make_learner``, a zero-argument callable that builds a fresh learner the same way every time (its
models seeded inside), and the observations of one iteration (dicts with ``prompt`` and, for move answers,
``legal_moves``) with the rewards of each. The checks:

- :func:`check_first_update_is_on_policy`: the first loss of the first update sees, at every token or move, the
  log-probs the rollout recorded (ratio 1), and the update's ``ratio`` metric is 1: what was sampled is what is
  re-scored.
- :func:`check_move_probabilities_are_played`: a learner that gives exact move probabilities (``move_probabilities``)
  plays each move with that probability: its answers' frequencies over many samples are within a few standard errors,
  in training (``act``) and, where it acts through a collector, outside it (``collector.play``: what evaluation plays).
- :func:`check_resume_equals_uninterrupted`: two iterations in one go, and one iteration, ``state_dict`` through
  JSON, a new learner's ``load_state_dict`` and a second iteration, end at the same weights.

:func:`check_learner` runs every check that applies and says which it ran. The test suite runs it over the matrix of
algorithms × action modes × prefix sharing × micro-batches (``tests/test_learner_conformance.py``); a learner of one's
own runs it the same way. :func:`~marllm.testing.data_parallel.check_two_ranks_equal_one_process` checks that two
gloo ranks update as one process does; it builds the learner from a factory named by reference, as the ranks are
other processes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from marllm.algorithms.learner import Learner

__all__ = [
    "check_first_update_is_on_policy",
    "check_learner",
    "check_move_probabilities_are_played",
    "check_resume_equals_uninterrupted",
]

Observation = Mapping[str, Sequence[Any]]


def _play(
    learner: Learner, observations: Sequence[Observation], rewards: Sequence[Sequence[float]]
) -> list[tuple[str, ...]]:
    """One iteration's acting and rewards (every rollout rewarded, oldest first), without the update; its answers."""
    if len(observations) != len(rewards):
        raise ValueError(f"{len(observations)} observations but rewards for {len(rewards)}")
    answers = [tuple(learner.act(observation)) for observation in observations]
    for row_rewards, observation in zip(rewards, observations, strict=True):
        if len(row_rewards) != len(observation["prompt"]):
            raise ValueError(f"{len(observation['prompt'])} prompts but {len(row_rewards)} rewards")
        learner.finish(list(row_rewards))
    return answers


def check_first_update_is_on_policy(
    make_learner: Callable[[], Learner],
    observations: Sequence[Observation],
    rewards: Sequence[Sequence[float]],
    seed: int = 0,
    tolerance: float = 1e-5,
) -> float:
    """Act, reward and update once: the first loss's log-probs equal the rollout's at every token or move (where the
    learner has an ``_objective(mini_batch, logprobs, values)`` to watch), and the update's ``ratio`` metric is 1.
    Returns the largest log-prob difference seen.

    Raises:
        AssertionError: naming the difference and where.
    """
    torch.manual_seed(seed)
    learner = make_learner()
    torch.manual_seed(seed + 1)
    _play(learner, observations, rewards)
    differences: list[float] = []
    objective = getattr(learner, "_objective", None)
    if callable(objective):

        def watched(mb: Any, logprobs: torch.Tensor, values: torch.Tensor | None) -> Any:
            mask = mb.mask if logprobs.shape == mb.mask.shape else torch.ones_like(logprobs)
            differences.append(float(((logprobs - mb.logprobs).abs() * mask).max()))
            return objective(mb, logprobs, values)

        learner._objective = watched  # type: ignore[attr-defined]
    metrics = learner.update()
    first = differences[0] if differences else 0.0
    if first > tolerance:
        raise AssertionError(
            f"{learner.name}: the first loss's log-probs differ from the rollout's by up to {first:.3g} "
            f"(> {tolerance}): the update re-scores another distribution than the one sampled"
        )
    ratio = metrics.get("ratio")
    if ratio is not None and math.isfinite(ratio) and abs(ratio - 1.0) > 10 * tolerance and len(differences) <= 1:
        raise AssertionError(f"{learner.name}: the first update's ratio metric is {ratio}, not 1")
    return first


def check_move_probabilities_are_played(
    make_learner: Callable[[], Learner],
    prompt: str,
    legal_moves: Sequence[str],
    samples: int = 2000,
    sigmas: float = 4.0,
    seed: int = 0,
) -> list[float]:
    """The learner's exact ``move_probabilities`` of ``legal_moves`` after ``prompt`` are the frequencies with which it
    plays them: ``samples`` answers of one act, each a legal move's name, each move's frequency within ``sigmas``
    standard errors of its probability; the same of ``samples`` answers its collector plays outside training, where the
    learner has one that does (``learner.collector.play``, as evaluation plays it). Returns the probabilities.

    Raises:
        AssertionError: an answer that is no legal move, or a frequency too far from its probability.
    """
    torch.manual_seed(seed)
    learner = make_learner()
    exact = learner.move_probabilities([prompt], [list(legal_moves)])[0]  # type: ignore[attr-defined]
    if abs(sum(exact) - 1.0) > 1e-5:
        raise AssertionError(f"{learner.name}: the move probabilities sum to {sum(exact)}, not 1")
    observation = {"prompt": [prompt] * samples, "legal_moves": [list(legal_moves)] * samples}
    torch.manual_seed(seed + 1)
    _check_frequencies(learner.name, "played", learner.act(observation), legal_moves, exact, sigmas)
    play = getattr(getattr(learner, "collector", None), "play", None)
    if callable(play):
        torch.manual_seed(seed + 2)
        try:
            answers = play(observation)
        except NotImplementedError:  # a collector of one's own that does not play outside training
            return list(exact)
        _check_frequencies(learner.name, "played outside training", answers, legal_moves, exact, sigmas)
    return list(exact)


def _check_frequencies(
    name: str, how: str, answers: Sequence[str], legal_moves: Sequence[str], exact: Sequence[float], sigmas: float
) -> None:
    """Each answer a legal move, each move's frequency among ``answers`` within ``sigmas`` standard errors of its
    ``exact`` probability."""
    illegal = sorted({answer for answer in answers if answer not in legal_moves})
    if illegal:
        raise AssertionError(f"{name}: answers {illegal[:5]} are no legal move of {list(legal_moves)}")
    samples = len(answers)
    for move, probability in zip(legal_moves, exact, strict=True):
        frequency = sum(answer == move for answer in answers) / samples
        error = math.sqrt(max(probability * (1 - probability), 1e-12) / samples)
        if abs(frequency - probability) > sigmas * error + 1e-9:
            raise AssertionError(
                f"{name}: {move!r} is {how} {frequency:.4f} of {samples} times but its exact probability is "
                f"{probability:.4f} (more than {sigmas} standard errors of {error:.4f} apart): the probabilities a "
                "run tabulates are not those of the policy that plays"
            )


def check_resume_equals_uninterrupted(
    make_learner: Callable[[], Learner],
    observations: Sequence[Observation],
    rewards: Sequence[Sequence[float]],
    seed: int = 0,
    tolerance: float = 1e-6,
) -> float:
    """Two iterations in one learner, against one iteration, a checkpoint (``state_dict``, its meta through JSON), a
    new learner restored from it and the second iteration: the same answers and the same trainable weights within
    ``tolerance``. The global torch generator is seeded alike before each iteration in both. Returns the largest
    weight difference.

    Raises:
        AssertionError: naming the answers or the weights that differ.
    """

    def iteration(learner: Learner, k: int) -> list[tuple[str, ...]]:
        torch.manual_seed(seed + 100 + k)
        answers = _play(learner, observations, rewards)
        learner.update()
        return answers

    torch.manual_seed(seed)
    whole = make_learner()
    iteration(whole, 0)
    expected = iteration(whole, 1)
    torch.manual_seed(seed)
    first = make_learner()
    iteration(first, 0)
    tensors, meta = first.state_dict()
    torch.manual_seed(seed)
    resumed = make_learner()
    resumed.load_state_dict(tensors, json.loads(json.dumps(meta)))
    if iteration(resumed, 1) != expected:
        raise AssertionError(f"{whole.name}: the resumed learner answers otherwise than the uninterrupted one")
    largest = 0.0
    trained = dict(whole.model.named_parameters())
    for name, parameter in resumed.model.named_parameters():
        if parameter.requires_grad:
            largest = max(largest, float((parameter.detach() - trained[name].detach()).abs().max()))
    if largest > tolerance:
        raise AssertionError(
            f"{whole.name}: after a resume the weights differ from the uninterrupted learner's by up to {largest:.3g}"
        )
    return largest


def check_learner(
    make_learner: Callable[[], Learner],
    observations: Sequence[Observation],
    rewards: Sequence[Sequence[float]],
    moves: tuple[str, Sequence[str]] | None = None,
    samples: int = 2000,
) -> dict[str, str]:
    """Every check that applies to the learner ``make_learner`` builds: on-policy first update and resume, and, where
    ``moves`` (a prompt and its legal moves) is given because the learner claims exact move probabilities, that they
    are the ones it plays. Returns each check's name and what it found, or why it did not run."""
    on_policy = check_first_update_is_on_policy(make_learner, observations, rewards)
    resumed = check_resume_equals_uninterrupted(make_learner, observations, rewards)
    report = {
        "first_update_on_policy": f"largest log-prob difference {on_policy:.2g}",
        "resume_equals_uninterrupted": f"largest weight difference {resumed:.2g}",
        "move_probabilities_are_played": "not run: no exact move probabilities claimed (moves not given)",
    }
    if moves is not None:
        played = check_move_probabilities_are_played(make_learner, moves[0], moves[1], samples)
        report["move_probabilities_are_played"] = f"probabilities {[round(p, 3) for p in played]}"
    return report
