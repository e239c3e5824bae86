"""Exact-match reward for math word problems (GSM8K and the synthetic arithmetic task).

The reward follows the CORY paper: 1.0 when the last number in a response equals the ground-truth answer,
else 0.0. Numbers are compared by value, so "1,234", "$1234" and "1234.00" all equal 1234.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation

__all__ = ["ExactMatchReward", "extract_last_number", "numbers_match", "parse_gsm8k_answer"]

# A number as written in prose: optional sign, optional "$", digits with optional comma thousands groups,
# optional decimal part. The sign only counts when it does not follow a word character or a closing
# bracket, so the "-" in a range like "3-5" or in "10-3" is read as an operator, not as a sign.
# The lookbehind on the digits keeps the "3" of "1.2.3" from being read as a number of its own.
_NUMBER_RE = re.compile(
    r"(?P<sign>(?<![\w)\]])[-\u2212])?"
    r"\$?"
    r"(?<![\d.])"
    r"(?P<digits>\d{1,3}(?:,\d{3})+(?![\d,])|\d+)"
    r"(?P<fraction>\.\d+)?"
)
_GSM8K_MARKER = "####"


def _canonical(sign: str | None, digits: str, fraction: str | None) -> str:
    text = digits.replace(",", "") + (fraction or "")
    return ("-" if sign else "") + text


def extract_last_number(text: str) -> str | None:
    """Return the last number written in ``text``, or ``None`` when there is none.

    Commas used as thousands separators and a leading ``$`` are dropped, a Unicode minus becomes ``-``, and a
    sentence-final period is not part of the number: ``"It costs $1,234.50."`` gives ``"1234.50"``.
    The result is the number's text, not a canonical form; compare values with :func:`numbers_match`.
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_last_number expects a str, got {type(text).__name__}")
    matches = _NUMBER_RE.findall(text)
    if not matches:
        return None
    sign, digits, fraction = matches[-1]
    return _canonical(sign, digits, fraction)


def parse_gsm8k_answer(answer: str) -> str:
    """Return the final number of a GSM8K-style solution, the text after its last ``####``.

    ``"... so she has 18 left.\\n#### 1,018"`` gives ``"1018"`` (thousands commas and ``$`` removed).

    Raises:
        ValueError: when ``####`` is missing or is not followed by exactly one number.
    """
    if not isinstance(answer, str):
        raise TypeError(f"a GSM8K answer must be a str, got {type(answer).__name__}: {answer!r}")
    head, marker, tail = answer.rpartition(_GSM8K_MARKER)
    if not marker:
        raise ValueError(f"GSM8K answer has no '####' final-answer marker: {_shorten(answer)!r}")
    match = _NUMBER_RE.fullmatch(tail.strip())
    if match is None:
        raise ValueError(
            f"GSM8K answer must end with '#### <number>', but '####' is followed by {tail.strip()!r} "
            f"in {_shorten(answer)!r}"
        )
    return _canonical(match["sign"], match["digits"], match["fraction"])


def _to_decimal(number: str) -> Decimal:
    cleaned = number.strip().replace(",", "").replace("$", "").replace("\u2212", "-")
    if cleaned.endswith("."):
        cleaned = cleaned[:-1]
    value = Decimal(cleaned)  # raises InvalidOperation on junk
    if not value.is_finite():
        raise InvalidOperation(number)
    return value


def numbers_match(predicted: str | None, truth: str) -> bool:
    """Whether ``predicted`` and ``truth`` denote the same number (``"42.00"`` matches ``"42"``).

    ``predicted`` of ``None`` (no number found) or text that is not a number never matches.

    Raises:
        ValueError: when ``truth`` is not a number, since that is a broken dataset rather than a wrong answer.
    """
    try:
        truth_value = _to_decimal(truth)
    except (InvalidOperation, AttributeError) as error:
        raise ValueError(f"ground-truth answer is not a number: {truth!r}") from error
    if predicted is None:
        return False
    try:
        return _to_decimal(predicted) == truth_value
    except (InvalidOperation, AttributeError):
        return False


class ExactMatchReward:
    """Task reward: 1.0 if the last number in a response equals the sample's ground truth, else 0.0.

    Call it as ``reward_fn(samples, responses)``. The ground truth is parsed with :func:`parse_gsm8k_answer`
    from ``sample[answer_key]``. An empty response or one without a number scores 0.0.

    Args:
        answer_key: the sample field holding the GSM8K-style solution ending in ``#### <number>``.
        stop_strings: the response is cut at the first occurrence of any of these before the last number is
            taken. Empty by default, as in the paper; ``("\\nQuestion:",)`` stops a model that keeps inventing
            new questions after its answer from being graded on the invented ones.
    """

    def __init__(self, answer_key: str = "answer", stop_strings: Sequence[str] = ()) -> None:
        if isinstance(stop_strings, str):
            raise TypeError(f"stop_strings must be a sequence of strings, not a single str: {stop_strings!r}")
        if any(not isinstance(s, str) or not s for s in stop_strings):
            raise ValueError(f"stop_strings must be non-empty strings, got {list(stop_strings)!r}")
        self.answer_key = answer_key
        self.stop_strings = tuple(stop_strings)

    def _truncate(self, response: str) -> str:
        cut = len(response)
        for stop in self.stop_strings:
            index = response.find(stop)
            if index != -1:
                cut = min(cut, index)
        return response[:cut]

    def __call__(self, samples: Sequence[Mapping], responses: Sequence[str]) -> list[float]:
        if len(samples) != len(responses):
            raise ValueError(
                f"ExactMatchReward got {len(samples)} samples but {len(responses)} responses; "
                "they must pair one to one"
            )
        rewards = []
        for index, (sample, response) in enumerate(zip(samples, responses, strict=True)):
            if self.answer_key not in sample:
                raise KeyError(
                    f"sample {index} has no {self.answer_key!r} field; its keys are {sorted(sample)}"
                )
            try:
                truth = parse_gsm8k_answer(sample[self.answer_key])
            except (TypeError, ValueError) as error:
                raise ValueError(f"sample {index}: {error}") from error
            if not isinstance(response, str):
                raise TypeError(f"response {index} must be a str, got {type(response).__name__}")
            predicted = extract_last_number(self._truncate(response))
            rewards.append(1.0 if numbers_match(predicted, truth) else 0.0)
        return rewards


def _shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]
