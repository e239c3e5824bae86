"""A learner conformance suite: the invariants every learner × action mode × cost setting must keep, checked on a
learner the caller builds (PettingZoo's ``api_test`` is the model).

Each check takes ``make_learner``, a zero-argument callable that builds a fresh learner the same way every time (its
models seeded inside), and the observations of one iteration (dicts with ``prompt`` and, for move answers,
``legal_moves``) with the rewards of each. The checks:

- :func:`check_first_update_is_on_policy`: the first loss of the first update sees, at every token or move, the
  log-probs the rollout recorded (ratio 1), the update's ``ratio`` metric is 1, and the loss optimised reads the
  policy's log-probs against the rollout's (its gradient does not move when every log-prob does): what was sampled is
  what is re-scored, and what is optimised.
- :func:`check_move_probabilities_are_played`: a learner that gives exact move probabilities (``move_probabilities``)
  plays each move with that probability: its answers' frequencies over many samples are within a few standard errors,
  in training (``act``) and, where it acts through a collector, outside it (``collector.play``: what evaluation plays).
- :func:`check_resume_equals_uninterrupted`: two iterations in one go, and one iteration, ``state_dict`` through
  JSON, a new learner's ``load_state_dict`` and a second iteration, end at the same weights.

:func:`check_learner` runs every check that applies and says which it ran; a check whose parts the learner lacks (no
collector, no checkpoint) raises :class:`~marllm.testing.outcomes.CheckNotApplicable` naming them, which
:func:`check_learner` reports as not run, with the reason. The test suite runs it over the matrix of
algorithms × action modes × prefix sharing × micro-batches (``tests/test_learner_conformance.py``); a learner of one's
own runs it the same way. :func:`~marllm.testing.data_parallel.check_two_ranks_equal_one_process` checks that two
gloo ranks update as one process does; it builds the learner from a factory named by reference, as the ranks are
other processes.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from marllm.algorithms.actions.base import Rescored
from marllm.algorithms.learner import Learner
from marllm.testing.outcomes import CheckNotApplicable, check_frequencies

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
    shift: float = 1.0,
    gradient_tolerance: float = 1e-3,
) -> float:
    """Act, reward and update once, watching the loss the learner optimises through its collector's re-scoring
    (``learner.collector.rescore``, which every marllm learner's loss is computed from):

    - the first loss's log-probs equal the rollout's at every token or move (ratio 1), and the update's ``ratio``
      metric is 1: what was sampled is what is re-scored;
    - the first loss's gradient with respect to those log-probs is unchanged when every log-prob it reads (the
      re-scored ones and the rollout's ``logprobs`` and ``ref_logprobs``) moves by ``shift``, within
      ``gradient_tolerance`` of its largest entry: the loss reads the policy's log-probs against the rollout's (a
      ratio of 1 at the first step), not rescaled or otherwise altered on the way. A second learner from
      ``make_learner`` plays the same iteration to see it;
    - where the learner reports its first loss's monitors of the ratio (a policy-gradient learner's ``clipfrac`` and
      ``approx_kl``), no token is clipped and ½·E[(log ρ)²] ≈ 0; and on rewards that differ, the first loss gives
      the log-probs a gradient that is not 0.

    Returns the largest log-prob difference of the first loss.

    Raises:
        AssertionError: naming the difference and where.
        CheckNotApplicable: the learner has no collector whose ``rescore`` its loss is computed from.
    """
    torch.manual_seed(seed)
    learner = make_learner()
    watch = _watch_rescoring(learner, 0.0, stop=False)
    first_parts = _record_first_parts(learner)
    torch.manual_seed(seed + 1)
    _play(learner, observations, rewards)
    metrics = learner.update()
    if not watch.differences:
        raise AssertionError(f"{learner.name}: its update never re-scored its actions through its collector")
    first = watch.differences[0]
    if first > tolerance:
        raise AssertionError(
            f"{learner.name}: the first loss's log-probs differ from the rollout's by up to {first:.3g} "
            f"(> {tolerance}): the update re-scores another distribution than the one sampled"
        )
    ratio = metrics.get("ratio")
    if ratio is not None and math.isfinite(ratio) and abs(ratio - 1.0) > 10 * tolerance and len(watch.differences) <= 1:
        raise AssertionError(f"{learner.name}: the first update's ratio metric is {ratio}, not 1")
    _check_first_parts(learner.name, first_parts, tolerance)
    torch.manual_seed(seed)
    shifted = make_learner()
    moved = _watch_rescoring(shifted, shift, stop=True)
    torch.manual_seed(seed + 1)
    _play(shifted, observations, rewards)
    with contextlib.suppress(_FirstGradient):
        shifted.update()
    plain, moved_gradient = watch.gradients.get(0), moved.gradients.get(0)
    _compare_first_gradients(learner.name, plain, moved_gradient, shift, gradient_tolerance)
    varied = len({float(value) for batch in rewards for value in batch}) > 1
    if varied and plain is not None and float(plain.abs().max()) == 0.0:
        raise AssertionError(
            f"{learner.name}: the first loss's gradient with respect to the policy's log-probs is 0 on rewards that "
            "differ: what it optimises does not move the policy"
        )
    return first


def _record_first_parts(learner: Learner) -> list[dict[str, float]]:
    """The loss parts of the learner's first objective (a policy-gradient learner's ``_objective``), once known."""
    parts: list[dict[str, float]] = []
    objective = getattr(learner, "_objective", None)
    if callable(objective):

        def recording(*args: Any, **kwargs: Any) -> Any:
            loss, reported = objective(*args, **kwargs)
            if not parts:
                parts.append(dict(reported))
            return loss, reported

        learner._objective = recording  # type: ignore[attr-defined]
    return parts


def _check_first_parts(name: str, parts: list[dict[str, float]], tolerance: float) -> None:
    """The first loss's own monitors of its ratio, where it reports them: no clipped token, ½·E[(log ρ)²] ≈ 0."""
    if not parts:
        return
    clipfrac, approx_kl = parts[0].get("clipfrac", 0.0), parts[0].get("approx_kl", 0.0)
    if clipfrac > 0.0 or approx_kl > tolerance:
        raise AssertionError(
            f"{name}: the first loss reports clipfrac {clipfrac:.3g} and approx_kl {approx_kl:.3g}: the ratio it "
            "optimises is not 1 at the first step"
        )


class _FirstGradient(Exception):
    """Ends the shifted learner's update once its first loss's gradient is known."""


@dataclass
class _Watched:
    """What :func:`_watch_rescoring` saw: each re-scoring's largest log-prob difference, and gradients by call."""

    differences: list[float] = field(default_factory=list)
    gradients: dict[int, torch.Tensor] = field(default_factory=dict)


def _watch_rescoring(learner: Learner, shift: float, stop: bool) -> _Watched:
    """Wrap the learner's collector: every log-prob a rollout records and every re-scored one moved by ``shift``;
    each re-scoring's log-prob difference and the gradient its loss gives its log-probs kept; with ``stop``, the
    update ended at the first gradient."""
    collector = getattr(learner, "collector", None)
    if not (callable(getattr(collector, "collect", None)) and callable(getattr(collector, "rescore", None))):
        raise CheckNotApplicable(
            f"{getattr(learner, 'name', type(learner).__name__)}: the on-policy check watches the loss a learner "
            "optimises through its collector (learner.collector with collect and rescore, a "
            f"marllm.algorithms.actions.Collector); {type(learner).__name__} has none"
        )
    watched, collect, rescore = _Watched(), collector.collect, collector.rescore

    def shifted(rollout: Any) -> Any:
        for key in ("logprobs", "ref_logprobs"):
            if key in rollout.tensors:
                rollout.tensors[key] = rollout.tensors[key] + shift
        return rollout

    def shifted_collect(observation: Observation, role: str | None = None) -> Any:
        return shifted(collect(observation, role))

    def watched_rescore(mb: Any, prompt_length: int) -> Rescored:
        rescored = rescore(mb, prompt_length)
        index = len(watched.differences)
        logprobs = rescored.logprobs + shift if shift else rescored.logprobs
        mask = mb.mask if logprobs.shape == mb.mask.shape else torch.ones_like(logprobs)
        watched.differences.append(float(((logprobs.detach() - mb.logprobs).abs() * mask).max()))
        if logprobs.requires_grad:

            def keep(gradient: torch.Tensor) -> None:
                watched.gradients.setdefault(index, gradient.detach().clone())
                if stop and index == 0:
                    raise _FirstGradient

            logprobs.register_hook(keep)
        return Rescored(logprobs, rescored.values, rescored.stats)

    if shift:
        collector.collect = shifted_collect
        lay_out = getattr(collector, "sequence_rollout", None)
        if lay_out is not None:  # one token sequence per seat: the log-probs are recorded when the update lays them out
            collector.sequence_rollout = lambda turns: shifted(lay_out(turns))
    collector.rescore = watched_rescore
    return watched


def _compare_first_gradients(
    name: str, plain: torch.Tensor | None, shifted: torch.Tensor | None, shift: float, tolerance: float
) -> None:
    """The first loss's gradients with respect to its log-probs, as played and with every log-prob moved: equal."""
    if plain is None or shifted is None:
        raise AssertionError(
            f"{name}: the first update's loss gives its re-scored log-probs no gradient: what it optimises does not "
            "depend on the policy's log-probs"
        )
    scale = float(plain.abs().max())
    gap = float((plain - shifted).abs().max())
    if gap > tolerance * max(scale, 1e-12) + 1e-12:
        raise AssertionError(
            f"{name}: the first loss's gradient with respect to the policy's log-probs changes by up to {gap:.3g} "
            f"(of {scale:.3g}) when every log-prob it reads moves by {shift}: the loss optimised does not read the "
            "log-probs against the rollout's (its ratio is not 1 at the first step)"
        )


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
    check_frequencies(learner.name, "played", learner.act(observation), legal_moves, exact, sigmas)
    play = getattr(getattr(learner, "collector", None), "play", None)
    if callable(play):
        torch.manual_seed(seed + 2)
        try:
            answers = play(observation)
        except NotImplementedError:  # a collector of one's own that does not play outside training
            return list(exact)
        check_frequencies(learner.name, "played outside training", answers, legal_moves, exact, sigmas)
    return list(exact)


def check_resume_equals_uninterrupted(
    make_learner: Callable[[], Learner],
    observations: Sequence[Observation],
    rewards: Sequence[Sequence[float]],
    seed: int = 0,
    tolerance: float = 1e-6,
) -> float:
    """Two iterations in one learner, against one iteration, a checkpoint (``state_dict``, its meta through JSON), a
    new learner restored from it and the second iteration: the same answers and the same trainable weights within
    ``tolerance`` (a learner without a torch model: the same state, ``state_dict`` again). The global torch generator
    is seeded alike before each iteration in both. Returns the largest weight difference.

    Raises:
        AssertionError: naming the answers or the weights that differ.
        CheckNotApplicable: the learner has no ``state_dict`` and ``load_state_dict`` (the checkpoint part of the
            :class:`~marllm.algorithms.learner.Learner` protocol).
    """

    def iteration(learner: Learner, k: int) -> list[tuple[str, ...]]:
        torch.manual_seed(seed + 100 + k)
        answers = _play(learner, observations, rewards)
        learner.update()
        return answers

    torch.manual_seed(seed)
    whole = make_learner()
    _require_checkpoints(whole)
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
    largest = _largest_difference(whole, resumed)
    if largest > tolerance:
        raise AssertionError(
            f"{whole.name}: after a resume the weights differ from the uninterrupted learner's by up to {largest:.3g}"
        )
    return largest


def _require_checkpoints(learner: Learner) -> None:
    """Raise :class:`CheckNotApplicable` unless ``learner`` has the Learner protocol's checkpoint methods."""
    missing = [name for name in ("state_dict", "load_state_dict") if not callable(getattr(learner, name, None))]
    if missing:
        raise CheckNotApplicable(
            f"{getattr(learner, 'name', type(learner).__name__)}: the resume check needs a checkpoint of the learner, "
            f"the state_dict and load_state_dict of the marllm.algorithms.Learner protocol; {type(learner).__name__} "
            f"has no {' and no '.join(missing)}"
        )


def _largest_difference(whole: Learner, resumed: Learner) -> float:
    """The largest difference of the two learners' trainable weights; without a torch model, of their states (their
    meta must be equal)."""
    parameters = getattr(whole.model, "named_parameters", None)
    if callable(parameters):
        trained = dict(parameters())
        return max(
            (
                float((parameter.detach() - trained[name].detach()).abs().max())
                for name, parameter in resumed.model.named_parameters()
                if parameter.requires_grad
            ),
            default=0.0,
        )
    (tensors, meta), (resumed_tensors, resumed_meta) = whole.state_dict(), resumed.state_dict()
    if json.loads(json.dumps(meta)) != json.loads(json.dumps(resumed_meta)) or set(tensors) != set(resumed_tensors):
        raise AssertionError(f"{whole.name}: after a resume its state differs from the uninterrupted learner's")
    return max((float((torch.as_tensor(tensors[k]) - torch.as_tensor(resumed_tensors[k])).abs().max())
                for k in tensors), default=0.0)  # fmt: skip


def check_learner(
    make_learner: Callable[[], Learner],
    observations: Sequence[Observation],
    rewards: Sequence[Sequence[float]],
    moves: tuple[str, Sequence[str]] | None = None,
    samples: int = 2000,
) -> dict[str, str]:
    """Every check that applies to the learner ``make_learner`` builds: on-policy first update and resume, and, where
    ``moves`` (a prompt and its legal moves) is given because the learner claims exact move probabilities, that they
    are the ones it plays. Returns each check's name and what it found, or why it did not run (a check the learner
    lacks the parts of: :class:`CheckNotApplicable`'s reason, naming them).

    Raises:
        AssertionError: a check that ran failed.
    """
    report: dict[str, str] = {}
    try:
        on_policy = check_first_update_is_on_policy(make_learner, observations, rewards)
        report["first_update_on_policy"] = f"largest log-prob difference {on_policy:.2g}"
    except CheckNotApplicable as reason:
        report["first_update_on_policy"] = f"not run: {reason}"
    try:
        resumed = check_resume_equals_uninterrupted(make_learner, observations, rewards)
        report["resume_equals_uninterrupted"] = f"largest weight difference {resumed:.2g}"
    except CheckNotApplicable as reason:
        report["resume_equals_uninterrupted"] = f"not run: {reason}"
    report["move_probabilities_are_played"] = "not run: no exact move probabilities claimed (moves not given)"
    if moves is not None:
        played = check_move_probabilities_are_played(make_learner, moves[0], moves[1], samples)
        report["move_probabilities_are_played"] = f"probabilities {[round(p, 3) for p in played]}"
    return report
