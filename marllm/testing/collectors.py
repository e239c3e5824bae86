"""A check of an action mode's collector (:mod:`marllm.algorithms.actions`), marllm's or one's own, without a learner
around it: :func:`check_collector`.

A collector plays a batch and records it (``collect``), re-scores what it recorded under the policy (``rescore``),
plays outside training (``play``: evaluation, a best response's target) and, where its mode has them, gives the
exact probability of every legal move (``move_probabilities``). What a learner's update and a run's measurements
take for granted of it:

- **ratio 1**: re-scoring its own rollout gives back the log-probs the rollout recorded, at every token or move (the
  first ratio of an update is 1), and its ``ratio`` statistic is 1;
- **exact = played**: where the mode has exact move probabilities, the moves it collects are drawn with them (each
  move's frequency over many samples within a few standard errors);
- **play = collect**: what it plays outside training is drawn from the distribution it collects from: with exact
  move probabilities, each move's frequency in ``play`` is its probability too; in free text, each kind of answer
  (:func:`~marllm.testing.outcomes.answer_kinds`) is as frequent in both samples. Free text draws its length budget
  once per batch in ``collect`` and once per answer in ``play`` (a collector whose ``draws_budget`` is not False):
  its answers are then collected one per batch, so that both samples draw as many budgets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from marllm.algorithms.actions.base import Collector
from marllm.testing.outcomes import CheckNotApplicable, check_frequencies, check_same_distribution

__all__ = ["check_collector"]

COLLECTOR_PARTS = ("collect", "rescore", "play", "move_probabilities")
"""The methods of :class:`~marllm.algorithms.actions.base.Collector` that :func:`check_collector` calls."""


def check_collector(
    make_collector: Callable[[], Collector],
    observation: Mapping[str, Sequence[Any]],
    samples: int = 1000,
    sigmas: float = 4.0,
    seed: int = 0,
    tolerance: float = 1e-5,
) -> dict[str, str]:
    """Check what every action mode's collector must keep (see the module docstring) on the collector
    ``make_collector`` builds (a zero-argument callable, its model seeded inside).

    Args:
        make_collector: builds the collector afresh, the same way every time.
        observation: one batch to play: ``prompt`` (a list of prompts) and, for a game's moves, ``legal_moves`` (the
            names of each prompt's legal moves). The distributions are sampled at its first prompt.
        samples: answers drawn from ``collect`` and from ``play`` each.
        sigmas: how many standard errors a frequency may be off.
        seed: seeds the global torch generator before each sample.
        tolerance: the largest log-prob difference of a re-scoring from the rollout's.

    Returns:
        Each check's name and what it found, or why it did not run.

    Raises:
        AssertionError: naming the check that failed and by how much.
        CheckNotApplicable: the object lacks a method of the collector interface (naming it).
    """
    torch.manual_seed(seed)
    collector = make_collector()
    name = getattr(collector, "owner", type(collector).__name__)
    missing = [part for part in COLLECTOR_PARTS if not callable(getattr(collector, part, None))]
    if missing:
        raise CheckNotApplicable(
            f"{name}: a collector has the methods {list(COLLECTOR_PARTS)} of marllm.algorithms.actions.Collector; "
            f"{type(collector).__name__} lacks {missing}"
        )
    report = {"first_ratio_is_one": _check_ratio_one(collector, name, observation, seed, tolerance)}
    prompt = observation["prompt"][0]
    moves = list(observation["legal_moves"][0]) if "legal_moves" in observation else None
    rows: dict[str, list[Any]] = {"prompt": [prompt] * samples}
    if moves is not None:
        rows["legal_moves"] = [moves] * samples
    exact = _exact(collector, prompt, moves)
    # Free text draws its budget once per collected batch but once per answer in play: one answer per batch then.
    one_by_one = exact is None and getattr(collector, "draws_budget", True)
    collected = _collected(collector, rows, seed + 1, samples if one_by_one else 8)
    torch.manual_seed(seed + 2)
    try:
        played = list(collector.play(rows))
    except NotImplementedError:
        played = None
    if exact is None:
        report["exact_is_played"] = "not run: the mode has no exact move probabilities"
        if played is None:
            report["play_is_collect"] = "not run: the collector does not play outside training (play)"
        else:
            kinds = check_same_distribution(name, ("collected", collected), ("played", played), sigmas)
            report["play_is_collect"] = f"{kinds} kinds of answer as frequent in {samples} collected and played"
        return report
    assert moves is not None
    check_frequencies(name, "collected", collected, moves, exact, sigmas)
    report["exact_is_played"] = f"move probabilities {[round(p, 3) for p in exact]} are collect's frequencies"
    if played is None:
        report["play_is_collect"] = "not run: the collector does not play outside training (play)"
    else:
        check_frequencies(name, "played outside training", played, moves, exact, sigmas)
        report["play_is_collect"] = f"play's frequencies of {samples} answers are the move probabilities too"
    return report


def _check_ratio_one(
    collector: Collector, name: str, observation: Mapping[str, Sequence[Any]], seed: int, tolerance: float
) -> str:
    """Collect one batch and re-score it whole: the log-probs recorded at every token or move, and a ratio of 1."""
    torch.manual_seed(seed)
    rollout = collector.collect(observation)
    rows = len(observation["prompt"])
    if len(rollout.responses) != rows:
        raise AssertionError(f"{name}: collect answered {len(rollout.responses)} of {rows} prompts")
    recorded = rollout.tensors
    rescored = collector.rescore(recorded, rollout.prompt_length)
    logprobs = rescored.logprobs.detach()
    if logprobs.shape != recorded.logprobs.shape:
        raise AssertionError(
            f"{name}: rescore gives log-probs of shape {tuple(logprobs.shape)}, the rollout recorded "
            f"{tuple(recorded.logprobs.shape)}"
        )
    mask = recorded.mask if "mask" in recorded else torch.ones_like(logprobs)
    difference = float(((logprobs - recorded.logprobs).abs() * mask).max())
    if not difference <= tolerance:
        raise AssertionError(
            f"{name}: re-scoring its own rollout gives log-probs that differ from the recorded ones by up to "
            f"{difference:.3g} (> {tolerance}): an update's first ratio would not be 1"
        )
    ratio = rescored.stats.get("ratio")
    if ratio is not None and abs(ratio - 1.0) > 10 * tolerance:
        raise AssertionError(f"{name}: re-scoring its own rollout reports a ratio of {ratio}, not 1")
    return f"largest log-prob difference {difference:.2g} over {rows} answers"


def _exact(collector: Collector, prompt: str, moves: list[str] | None) -> list[float] | None:
    """The mode's exact probabilities of ``moves`` after ``prompt``; None where it has none (a mode whose facts say
    it has them, ``exact_policy``, must give them: a run tabulates its policy with them)."""
    if moves is None:
        return None
    try:
        (exact,) = collector.move_probabilities([prompt], [moves])
    except (ValueError, NotImplementedError) as error:
        if getattr(collector, "exact_policy", None) is not None:
            raise AssertionError(
                f"{type(collector).__name__} says it has exact move probabilities ({collector.exact_policy}), and "
                f"move_probabilities failed: {error}"
            ) from error
        return None
    if abs(sum(exact) - 1.0) > 1e-5:
        raise AssertionError(f"the move probabilities {list(exact)} sum to {sum(exact)}, not 1")
    return list(exact)


def _collected(collector: Collector, rows: Mapping[str, list[Any]], seed: int, batches: int) -> list[str]:
    """The answers of ``collect`` to ``rows``, in ``batches`` batches."""
    count = len(rows["prompt"])
    size = max(1, -(-count // batches))
    answers: list[str] = []
    for k, start in enumerate(range(0, count, size)):
        torch.manual_seed(seed + 1000 * k)
        batch = {key: values[start : start + size] for key, values in rows.items()}
        answers += list(collector.collect(batch).responses)
    return answers
