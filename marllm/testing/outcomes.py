"""What the checks of :mod:`marllm.testing` share: the exception of a check that does not apply to what it is given,
and the comparisons of sampled answers with exact probabilities and with each other."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

__all__ = ["CheckNotApplicable", "check_frequencies", "check_same_distribution"]


class CheckNotApplicable(ValueError):
    """A check cannot run on what it was given: the message names what the check needs (a protocol, a method, an
    attribute) and that the object lacks. :func:`~marllm.testing.check_learner` reports such a check as not run, with
    this reason, instead of passing it."""


def check_frequencies(
    name: str, how: str, answers: Sequence[str], legal_moves: Sequence[str], exact: Sequence[float], sigmas: float
) -> None:
    """Each answer a legal move, each move's frequency among ``answers`` within ``sigmas`` standard errors of its
    ``exact`` probability.

    Raises:
        AssertionError: an answer that is no legal move, or a frequency too far from its probability.
    """
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


def answer_kinds(answers: Sequence[str], pooled: Counter[str], least: int) -> list[str]:
    """Each answer's kind for comparing two samples of free text: the answer itself where it is frequent (at least
    ``least`` times in ``pooled``), else its first character where that is, else ``"(rare)"``."""
    firsts = Counter(text[:1] for text in pooled.elements())
    kinds = []
    for text in answers:
        if pooled[text] >= least:
            kinds.append(f"answer {text!r}")
        elif firsts[text[:1]] >= least:
            kinds.append(f"an answer beginning {text[:1]!r}")
        else:
            kinds.append("(rare)")
    return kinds


def check_same_distribution(
    name: str, first: tuple[str, Sequence[str]], second: tuple[str, Sequence[str]], sigmas: float, least: int = 10
) -> int:
    """Two samples of answers, each ``(how it was drawn, answers)``, drawn from one distribution: each kind of answer
    (:func:`answer_kinds`) as frequent in both, within ``sigmas`` standard errors of the two proportions' difference.
    Returns how many kinds were compared.

    Raises:
        AssertionError: naming the kind whose frequencies differ, and both frequencies.
    """
    (how_first, answers_first), (how_second, answers_second) = first, second
    pooled = Counter([*answers_first, *answers_second])
    kinds_first = Counter(answer_kinds(answers_first, pooled, least))
    kinds_second = Counter(answer_kinds(answers_second, pooled, least))
    n, m = len(answers_first), len(answers_second)
    for kind in sorted(set(kinds_first) | set(kinds_second)):
        p, q = kinds_first[kind] / n, kinds_second[kind] / m
        both = (kinds_first[kind] + kinds_second[kind]) / (n + m)
        error = math.sqrt(max(both * (1 - both), 1e-12) * (1 / n + 1 / m))
        if abs(p - q) > sigmas * error + 1e-9:
            raise AssertionError(
                f"{name}: {kind} is {p:.4f} of {n} answers {how_first} but {q:.4f} of {m} {how_second} (more than "
                f"{sigmas} standard errors of {error:.4f} apart): the two do not sample one distribution"
            )
    return len(set(kinds_first) | set(kinds_second))
