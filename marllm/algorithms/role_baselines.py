"""SPIRAL's role-conditioned advantage estimation (RAE): a running baseline per game and role.

Liu et al. (2025), "SPIRAL: Self-Play on Zero-Sum Games Incentivizes Reasoning via Multi-Agent Multi-Turn
Reinforcement Learning", §3: in self-play one policy plays every role, and roles differ in expected return (the first
mover's advantage); a baseline per (game, role) keeps one role's better odds from reading as a better policy. The
baseline is an exponential moving average of the role's returns; each return is compared with the baseline from
before it (SPIRAL's code reads the baseline, then updates it), so a return never lowers its own advantage.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any


def role_conditioned_advantages(
    returns: Any, keys: Sequence[Hashable], baselines: Mapping[Hashable, float], decay: float = 0.95
) -> tuple[Any, dict[Hashable, float]]:
    """A_i = R_i − b_{k_i}, then b_k ← decay · b_k + (1 − decay) · mean(R_i : k_i = k) for each key in the batch.

    Args:
        returns: (n,) torch tensor of returns (a move's return: its game's payoff for the mover).
        keys: (n,) the (game, role) of each return.
        baselines: the running baselines before this batch; a key not in it starts at 0.
        decay: the EMA's weight on the old baseline, in [0, 1) (SPIRAL: 0.95).

    Returns:
        The (n,) advantages, and the baselines after the batch (a new dict; ``baselines`` is not changed). One EMA
        step per key and batch, with the batch mean (SPIRAL steps once per trajectory; with one return per key per
        batch the two agree).
    """
    if not 0 <= decay < 1:
        raise ValueError(f"the baseline decay must be in [0, 1), got {decay!r}")
    if len(keys) != len(returns):
        raise ValueError(f"got {len(returns)} returns but {len(keys)} keys; one (game, role) key per return")
    before = returns.new_tensor([float(baselines.get(key, 0.0)) for key in keys])  # (n,)
    advantages = returns - before
    updated = dict(baselines)
    for key in dict.fromkeys(keys):
        rows = [i for i, k in enumerate(keys) if k == key]
        batch_mean = float(returns[rows].mean())
        updated[key] = decay * float(baselines.get(key, 0.0)) + (1 - decay) * batch_mean
    return advantages, updated


class RoleBaselines:
    """The running baselines of :func:`role_conditioned_advantages`, kept between batches.

    Args:
        decay: the EMA's weight on the old baseline (SPIRAL: 0.95).
    """

    def __init__(self, decay: float = 0.95):
        if not 0 <= decay < 1:
            raise ValueError(f"the baseline decay must be in [0, 1), got {decay!r}")
        self.decay = decay
        self.values: dict[Hashable, float] = {}

    def advantages(self, returns: Any, keys: Sequence[Hashable]) -> Any:
        """The advantages of a batch against the current baselines, which then take the batch in."""
        advantages, self.values = role_conditioned_advantages(returns, keys, self.values, self.decay)
        return advantages
