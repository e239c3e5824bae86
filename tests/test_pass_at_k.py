"""pass@k: hand-computed values, brute-force enumeration, numerical stability and input errors."""

from fractions import Fraction
from itertools import combinations
from math import comb

import pytest

from marllm.evaluation import mean_pass_at_k, pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 1, 1, 0.2),  # c / n
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 1, 2, 0.4),  # 1 - C(4,2)/C(5,2) = 1 - 6/10
        (10, 0, 3, 0.0),
        (10, 10, 1, 1.0),
        (4, 3, 2, 1.0),  # only one wrong sample: any pair holds a correct one
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def brute_force(n: int, c: int, k: int) -> float:
    """Fraction of k-subsets of n samples (the first c correct) that contain a correct sample."""
    subsets = list(combinations(range(n), k))
    hits = sum(any(i < c for i in subset) for subset in subsets)
    return hits / len(subsets)


def test_pass_at_k_matches_enumeration():
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_k1_is_accuracy():
    assert pass_at_k(200, 37, 1) == pytest.approx(37 / 200, rel=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(2000, 500, 100), (5000, 3, 1000), (1319, 1, 1), (3000, 2990, 5)])
def test_pass_at_k_stable_for_large_n(n, c, k):
    exact = 1 - Fraction(comb(n - c, k), comb(n, k))  # the binomials here overflow a float
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize(
    ("n", "c", "k", "error", "message"),
    [
        (5, 1, 6, ValueError, "k = 6 cannot exceed n"),
        (5, 6, 1, ValueError, "c .* = 6 cannot exceed n"),
        (5, -1, 1, ValueError, "c must be >= 0"),
        (-5, 0, 1, ValueError, "n must be >= 1"),
        (5, 0, 0, ValueError, "k must be >= 1"),
        (5, 0, -2, ValueError, "k must be >= 1"),
        (5.0, 1, 1, TypeError, "n must be an int"),
        (5, True, 1, TypeError, "c must be an int"),
    ],
)
def test_pass_at_k_errors(n, c, k, error, message):
    with pytest.raises(error, match=message):
        pass_at_k(n, c, k)


def test_mean_pass_at_k():
    result = mean_pass_at_k([0, 1, 5], n=5, ks=[1, 2])
    assert list(result) == [1, 2]
    assert result[1] == pytest.approx((0.0 + 0.2 + 1.0) / 3)
    assert result[2] == pytest.approx((0.0 + 0.4 + 1.0) / 3)


def test_mean_pass_at_k_errors():
    with pytest.raises(ValueError, match="correct_counts is empty"):
        mean_pass_at_k([], n=5, ks=[1])
    with pytest.raises(ValueError, match="ks is empty"):
        mean_pass_at_k([1], n=5, ks=[])
    with pytest.raises(ValueError, match="k = 8 in ks cannot exceed n"):
        mean_pass_at_k([1, 2], n=5, ks=[1, 8])
    with pytest.raises(ValueError, match="problem 1: c .* = 9 cannot exceed n"):
        mean_pass_at_k([1, 9], n=5, ks=[1])
