"""One learner in several seats (self-play with shared weights), behind the loop's agent id -> learner mapping.

:func:`marllm.loop.run_iteration` treats each mapping entry as a learner of its own: it calls ``finish`` per agent,
oldest turn first, when the agent's episode ends, and ``update`` once per entry. One learner object in two seats
would then be updated twice, and rewarded out of order: its rollouts interleave the seats (seat A, seat B, seat A,
...) while the loop finishes all of seat A's turns first, and a learner gives each reward to its oldest unrewarded
rollout. :func:`share_learner` gives each seat a proxy that passes moves on at once, holds the rewards, and on the
first ``update`` of the iteration hands them to the learner in the order it acted, then updates it once; the other
seats' ``update`` returns no metrics.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any


class _Shared:
    """What the seats of one learner share: the order it acted in and the rewards each seat has received."""

    def __init__(self, learner: Any, seats: Sequence[str]):
        self.learner = learner
        self.order: list[str] = []  # the seat of each act, oldest first
        self.rewards: dict[str, list[tuple[Any, Any]]] = {seat: [] for seat in seats}
        self.lock = threading.Lock()

    def update(self) -> dict[str, float]:
        with self.lock:
            if not self.order:  # updated already this iteration (or it never moved)
                return {}
            self._replay()
            self.order = []
            return self.learner.update()

    def _replay(self) -> None:
        acted, rewarded = Counter(self.order), {seat: len(r) for seat, r in self.rewards.items()}
        missing = {seat: (acted[seat], rewarded[seat]) for seat in self.rewards if acted[seat] != rewarded[seat]}
        if missing:
            raise RuntimeError(
                f"learner {self.learner.name!r}: seats {sorted(missing)} acted and were rewarded (acts, rewards) "
                f"{missing} times; every act needs its reward before update()"
            )
        queues = {seat: iter(rewards) for seat, rewards in self.rewards.items()}
        for seat in self.order:
            rewards, task_rewards = next(queues[seat])
            self.learner.finish(rewards, task_rewards)
        self.rewards = {seat: [] for seat in self.rewards}


class SharedSeat:
    """One seat of a shared learner: the Learner protocol, forwarding to the learner (see the module docstring)."""

    def __init__(self, shared: _Shared, seat: str):
        self._shared = shared
        self.seat = seat

    @property
    def learner(self) -> Any:
        return self._shared.learner

    @property
    def name(self) -> str:
        return self.learner.name

    @property
    def model(self) -> Any:
        return self.learner.model

    @property
    def tokenizer(self) -> Any:
        return self.learner.tokenizer

    def act(self, observation: Mapping[str, Sequence[Any]], role: str | None = None) -> tuple[str, ...]:
        """The learner's answers; the act is remembered as this seat's."""
        self._shared.order.append(self.seat)
        return self.learner.act(observation, role=role)

    def finish(self, rewards: Sequence[float], task_rewards: Sequence[float] | None = None) -> None:
        """Hold the rewards of this seat's oldest unrewarded act until the update."""
        self._shared.rewards[self.seat].append((rewards, task_rewards))

    def update(self) -> dict[str, float]:
        """The first seat to call it this iteration rewards the learner in act order and updates it; the others get
        no metrics."""
        return self._shared.update()

    def activate(self) -> None:
        self.learner.activate()

    def reference_model(self) -> AbstractContextManager[Any]:
        return self.learner.reference_model()

    def state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.learner.state_dict()

    def load_state_dict(self, tensors: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
        self.learner.load_state_dict(tensors, meta)

    def save(self, directory: str | Path) -> None:
        self.learner.save(directory)


def share_learner(learner: Any, seats: Sequence[str]) -> dict[str, SharedSeat]:
    """One proxy per seat for ``learner``, to put in the loop's mapping (``{**share_learner(ppo, env.agents)}``).

    Args:
        learner: any Learner; it acts in every seat and is updated once per iteration.
        seats: the agent ids it plays (the env's seats, or the learner ids of a ``RolePermutation``).

    SPIRAL's role-conditioned baselines are the env's business: wrap it in :class:`~marllm.wrappers.RoleBaselines`.
    """
    seats = list(seats)
    if len(set(seats)) != len(seats) or not seats:
        raise ValueError(f"seats must be distinct agent ids, at least one, got {seats}")
    shared = _Shared(learner, seats)
    return {seat: SharedSeat(shared, seat) for seat in seats}
