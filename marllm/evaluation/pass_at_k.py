"""The unbiased pass@k estimator (Chen et al., 2021, "Evaluating Large Language Models Trained on Code").

With n samples per problem of which c are correct, pass@k = 1 - C(n - c, k) / C(n, k): the chance that at
least one of k samples drawn without replacement from the n is correct. The binomial ratio is evaluated as
the product prod_{i = n - c + 1}^{n} (1 - k / i), which never forms the huge binomials themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["mean_pass_at_k", "pass_at_k"]


def _check_int(value: int, name: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k for one problem from ``n`` samples of which ``c`` are correct.

    Raises:
        ValueError: ``n < 1``, ``c < 0``, ``k < 1``, ``c > n`` or ``k > n``.
    """
    _check_int(n, "n", 1)
    _check_int(c, "c", 0)
    _check_int(k, "k", 1)
    if c > n:
        raise ValueError(f"c (correct samples) = {c} cannot exceed n (samples) = {n}")
    if k > n:
        raise ValueError(f"k = {k} cannot exceed n (samples per problem) = {n}; pass@k needs n >= k")
    if n - c < k:
        return 1.0  # every draw of k samples contains a correct one
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def mean_pass_at_k(correct_counts: Sequence[int], n: int, ks: Sequence[int]) -> dict[int, float]:
    """Mean pass@k over problems, for each k in ``ks``.

    Args:
        correct_counts: per problem, how many of its ``n`` samples were correct.
        n: samples drawn per problem (the same for every problem).
        ks: the k values to report; each must satisfy 1 <= k <= n.

    Returns:
        ``{k: mean pass@k}`` in the order of ``ks``.
    """
    if len(correct_counts) == 0:
        raise ValueError("mean_pass_at_k needs at least one problem; correct_counts is empty")
    if len(ks) == 0:
        raise ValueError("mean_pass_at_k needs at least one k; ks is empty")
    _check_int(n, "n", 1)
    for k in ks:
        _check_int(k, "k", 1)
        if k > n:
            raise ValueError(f"k = {k} in ks cannot exceed n (samples per problem) = {n}")
    result = {}
    for k in ks:
        total = 0.0
        for index, c in enumerate(correct_counts):
            try:
                total += pass_at_k(n, c, k)
            except (TypeError, ValueError) as error:
                raise type(error)(f"problem {index}: {error}") from error
        result[k] = total / len(correct_counts)
    return result
