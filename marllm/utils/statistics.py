"""Student-t statistics: the t distribution, a mean with its 95% interval, and a Welch difference of two means.

Intervals are two-sided 95% Student-t intervals:

- a sample: ``mean ± t_{0.975, n-1} · s / √n`` with the sample standard deviation ``s`` (ddof = 1); a paired
  comparison is the estimate of the per-pair differences;
- a difference of two independent samples (Welch): ``(m_a - m_b) ± t_{0.975, ν} · √(s_a²/n_a + s_b²/n_b)`` with the
  Welch–Satterthwaite degrees of freedom ``ν = (s_a²/n_a + s_b²/n_b)² / ((s_a²/n_a)²/(n_a-1) + (s_b²/n_b)²/(n_b-1))``.

An interval that needs a standard deviation from a single value is undefined: its bounds are ``None``. A Welch
difference whose samples have no spread at all has the zero-width interval ``[diff, diff]`` and no df.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95


# Gauss–Legendre nodes and weights on [-1, 1]: on pieces of length <= 2, 128 of them integrate the t density to
# float64 precision.
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(128)


def t_pdf(x: np.ndarray, df: float) -> np.ndarray:
    """The density of Student's t with ``df > 0`` (possibly fractional) degrees of freedom."""
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return np.exp(log_norm - (df + 1) / 2 * np.log1p(np.square(x) / df))


def t_cdf(t: float, df: float) -> float:
    """The cumulative distribution function of Student's t: 1/2 plus the density integrated from 0 to ``t``."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    edges = np.linspace(0.0, abs(t), max(1, math.ceil(abs(t) / 2)) + 1)
    area = 0.0
    for low, high in zip(edges[:-1], edges[1:], strict=True):
        half_width, middle = (high - low) / 2, (high + low) / 2
        area += half_width * float(_WEIGHTS @ t_pdf(half_width * _NODES + middle, df))
    return 0.5 + area if t >= 0 else 0.5 - area


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`t_cdf`)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)


@dataclass(frozen=True)
class Estimate:
    """Mean, sample std (ddof=1) and 95% t interval of a sample (seeds, or paired differences); ``std``, ``low``
    and ``high`` are None when fewer than two values are given (the interval is then undefined)."""

    mean: float
    std: float | None
    low: float | None
    high: float | None
    n: int

    def as_dict(self) -> dict[str, float | int | None]:
        return {"mean": self.mean, "std": self.std, "ci_low": self.low, "ci_high": self.high, "n": self.n}


@dataclass(frozen=True)
class Difference:
    """``mean_a - mean_b`` with its Welch 95% interval (None when either side has fewer than two seeds)."""

    diff: float
    low: float | None
    high: float | None
    df: float | None
    n_a: int
    n_b: int

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "diff": self.diff,
            "ci_low": self.low,
            "ci_high": self.high,
            "df": self.df,
            "n_a": self.n_a,
            "n_b": self.n_b,
        }


def estimate(values: Sequence[float] | np.ndarray) -> Estimate:
    """Mean, sample std and 95% Student-t interval for the mean of ``values`` (at least one)."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or len(x) == 0:
        raise ValueError("estimate needs a non-empty 1-d sequence of values")
    mean = float(x.mean())
    if len(x) < 2:
        return Estimate(mean, None, None, None, 1)
    std = float(x.std(ddof=1))
    half = t_quantile(0.5 + CONFIDENCE / 2, len(x) - 1) * std / math.sqrt(len(x))
    return Estimate(mean, std, mean - half, mean + half, len(x))


def welch_difference(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> Difference:
    """Difference of means ``a - b`` with a Welch–Satterthwaite 95% t interval (see the module docstring)."""
    xa, xb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(xa) == 0 or len(xb) == 0:
        raise ValueError("welch_difference needs at least one value on each side")
    diff = float(xa.mean() - xb.mean())
    if len(xa) < 2 or len(xb) < 2:
        return Difference(diff, None, None, None, len(xa), len(xb))
    va, vb = xa.var(ddof=1) / len(xa), xb.var(ddof=1) / len(xb)
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Difference(diff, diff, diff, None, len(xa), len(xb))
    df = (va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1))
    half = t_quantile(0.5 + CONFIDENCE / 2, df) * se
    return Difference(diff, diff - half, diff + half, float(df), len(xa), len(xb))
