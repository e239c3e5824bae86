"""How much one categorical variable tells of another, estimated from paired samples: the plug-in mutual information
and its shuffled baseline.

The plug-in estimate ``Î(X; Y) = Σ p̂(x, y) log2(p̂(x, y) / (p̂(x) p̂(y)))`` (bits, from the empirical frequencies) is
biased upward on few samples: for independent variables with ``|X|`` and ``|Y|`` values seen, its expectation is about
``(|X| - 1)(|Y| - 1) / (2 n ln 2)`` bits (Miller 1955), 0.2 bits for 4 × 4 values on 32 samples. The shuffled baseline
measures that bias on the data at hand: the mean estimate over random pairings of the same samples (X permuted), which
keep both marginals and break the dependence. What the samples carry beyond chance is the estimate minus its baseline.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np


def mutual_information(xs: Sequence[Hashable], ys: Sequence[Hashable]) -> float:
    """The plug-in mutual information of the paired samples ``xs``, ``ys``, in bits (0 for no samples).

    Raises:
        ValueError: the two have different lengths.
    """
    if len(xs) != len(ys):
        raise ValueError(f"mutual information needs paired samples, got {len(xs)} and {len(ys)}")
    if not xs:
        return 0.0
    _, x = np.unique(np.array(xs, dtype=object).astype(str), return_inverse=True)
    _, y = np.unique(np.array(ys, dtype=object).astype(str), return_inverse=True)
    joint = np.zeros((x.max() + 1, y.max() + 1))
    np.add.at(joint, (x, y), 1.0)
    joint /= len(xs)
    px, py = joint.sum(axis=1, keepdims=True), joint.sum(axis=0, keepdims=True)
    seen = joint > 0
    return float(np.sum(joint[seen] * np.log2(joint[seen] / (px @ py)[seen])))


def shuffled_mutual_information(
    xs: Sequence[Hashable], ys: Sequence[Hashable], permutations: int = 20, seed: int = 0
) -> float:
    """The mean plug-in mutual information over ``permutations`` random pairings of ``xs`` with ``ys`` (``xs``
    shuffled with a generator seeded by ``seed``): the estimate's bias at this sample size and these marginals."""
    rng = np.random.default_rng(seed)
    order = list(xs)
    estimates = []
    for _ in range(permutations):
        shuffled = [order[i] for i in rng.permutation(len(order))]
        estimates.append(mutual_information(shuffled, ys))
    return float(np.mean(estimates)) if estimates else 0.0
