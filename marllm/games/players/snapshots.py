"""Frozen snapshots of a learner, and a pool of the last K of them to draw an opponent from each iteration.

A snapshot copies the learner's model (weights that never change afterwards) and samples with the learner's
generation settings; it learns nothing. It costs one model's memory: K snapshots cost K models.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from marllm.games.env.keys import PROMPT
from marllm.games.players.fixed import FixedPlayer
from marllm.models.generation import generate_responses
from marllm.models.policy import context_length
from marllm.models.state_dicts import check_tensors
from marllm.utils.errors import CheckpointError
from marllm.utils.generators import restore_generator

if TYPE_CHECKING:
    from marllm.games.opponents import SeatArguments


class FrozenSnapshot(FixedPlayer):
    """A copy of a learner's policy as it is now, that answers like the learner and never changes.

    Args:
        learner: a learner with ``model``, ``tokenizer`` and ``generation`` (a PPO or critic-free learner); a LoRA
            learner's ``adapter`` is the one activated in the copy. Sharded (FSDP) models are not supported.
        name: the snapshot's id; default ``<learner>-snapshot``.
        seed: seeds its response-length draws (sampling itself uses torch's generator, as the learner's does).
        generation: sampling settings; None: the learner's.
    """

    def __init__(self, learner: Any, name: str | None = None, seed: int = 0, generation: Any = None):
        super().__init__(name or f"{learner.name}-snapshot")
        self.model = copy.deepcopy(learner.model).eval()
        self.model.requires_grad_(False)
        self.adapter = getattr(learner, "adapter", None)
        if self.adapter is not None:
            self.model.set_adapter(self.adapter)
        self.tokenizer = learner.tokenizer
        self.generation = generation if generation is not None else learner.generation
        self._rng = np.random.default_rng(seed)

    def answer(self, observation: Mapping[str, Sequence[Any]]) -> tuple[str, ...]:
        prompts = tuple(observation[PROMPT])
        if not prompts:
            return ()
        budget = int(self._rng.integers(self.generation.min_new_tokens, self.generation.max_new_tokens + 1))
        with torch.no_grad():
            generated = generate_responses(
                self.model, self.tokenizer, prompts, budget, self.generation, context_length(self.model), self.name
            )
        return generated.texts

    def policy_tensors(self) -> dict[str, Any]:
        """Its weights as its learner trains them: the whole model's, or the adapter's alone (under peft's names)."""
        if self.adapter is not None:
            from peft import get_peft_model_state_dict  # a LoRA learner's snapshot only

            return get_peft_model_state_dict(self.model, adapter_name=self.adapter, save_embedding_layers=False)
        return {name: parameter.detach() for name, parameter in self.model.named_parameters()}

    def set_policy_tensors(self, tensors: Mapping[str, Any]) -> None:
        """Set the weights :meth:`policy_tensors` returned (of a snapshot of the same learner).

        Raises:
            CheckpointError: names, shapes or dtypes differ.
        """
        check_tensors(self.policy_tensors(), tensors, f"snapshot {self.name!r}")
        if self.adapter is not None:
            from peft import set_peft_model_state_dict  # a LoRA learner's snapshot only

            set_peft_model_state_dict(self.model, dict(tensors), adapter_name=self.adapter)
            return
        with torch.no_grad():
            for name, parameter in self.model.named_parameters():
                parameter.copy_(tensors[name])


class OpponentPool(FixedPlayer):
    """The last ``size`` snapshots of a learner; each iteration one of them, drawn uniformly, plays.

    It starts with one snapshot (the learner as it is when the pool is made). Its :meth:`update`, once per
    iteration, takes a new snapshot every ``every`` updates and draws the opponent of the next iteration. The loop
    updates learners in the order of its mapping: put the pool after the learner to snapshot the updated weights.

    Args:
        learner: the learner to take snapshots of.
        size: K, the snapshots kept (the oldest is dropped).
        every: updates between snapshots.
        name: the pool's id.
        seed: seeds the draws (and the snapshots' seeds).
    """

    def __init__(self, learner: Any, size: int = 5, every: int = 1, name: str = "pool", seed: int = 0):
        super().__init__(name)
        for key, value in (("size", size), ("every", every)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"OpponentPool {key} must be an int >= 1, got {value!r}")
        self.learner = learner
        self.every = every
        self.snapshots: deque[FrozenSnapshot] = deque(maxlen=size)
        self.iterations = 0
        self.taken = 0
        self._rng = np.random.default_rng(seed)
        self.take_snapshot()
        self.current = self._draw()

    @classmethod
    def from_seat(cls, seat: SeatArguments) -> OpponentPool:
        """A ``snapshot_pool`` seat's player: ``size`` snapshots of the seat's learner, one every ``every``
        iterations (its settings)."""
        settings = seat.settings
        return cls(seat.learner, settings.size, settings.every, name=seat.name, seed=seat.seed)

    def take_snapshot(self) -> FrozenSnapshot:
        """Add a snapshot of the learner as it is now (dropping the oldest beyond ``size``)."""
        snapshot = FrozenSnapshot(self.learner, f"{self.name}-{self.taken}", seed=int(self._rng.integers(2**31)))
        self.snapshots.append(snapshot)
        self.taken += 1
        return snapshot

    def _draw(self) -> FrozenSnapshot:
        return self.snapshots[int(self._rng.integers(len(self.snapshots)))]

    def answer(self, observation: Mapping[str, Sequence[Any]]) -> tuple[str, ...]:
        return self.current.answer(observation)

    def update(self) -> dict[str, float]:
        """Learn nothing; maybe take a snapshot, then draw the next opponent. Metrics: its credited payoff, the pool's
        size and the drawn snapshot's age (0: the newest)."""
        stats = super().update()
        self.iterations += 1
        if self.iterations % self.every == 0:
            self.take_snapshot()
        self.current = self._draw()
        stats["pool_size"] = float(len(self.snapshots))
        stats["opponent_age"] = float(len(self.snapshots) - 1 - list(self.snapshots).index(self.current))
        return stats

    def state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Its K snapshots' weights (``<k>/<parameter>``: the whole model's, or the learner's adapter's alone) and,
        as meta, their names and generators, the pool's counters, its generator and which snapshot plays next: a
        resumed run plays against the same pool."""
        tensors: dict[str, Any] = {}
        for k, snapshot in enumerate(self.snapshots):
            tensors.update({f"{k}/{name}": tensor for name, tensor in snapshot.policy_tensors().items()})
        meta = {
            "name": self.name,
            "size": self.snapshots.maxlen,
            "iterations": self.iterations,
            "taken": self.taken,
            "rng": self._rng.bit_generator.state,
            "current": list(self.snapshots).index(self.current),
            "snapshots": [{"name": s.name, "rng": s._rng.bit_generator.state} for s in self.snapshots],
        }
        return tensors, meta

    def load_state_dict(self, tensors: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
        """Rebuild the snapshots :meth:`state_dict` saved: copies of the learner's model carrying the saved weights.

        Raises:
            CheckpointError: the pool's size differs, or the weights do not fit the learner's model.
        """
        if meta.get("size") != self.snapshots.maxlen or not 1 <= len(meta.get("snapshots", ())) <= meta["size"]:
            raise CheckpointError(
                f"the checkpoint's opponent pool keeps {meta.get('size')} snapshots ({len(meta.get('snapshots', ()))} "
                f"saved), this pool {self.snapshots.maxlen}"
            )
        self.snapshots.clear()  # drop the old copies before making the new ones
        self.current = None  # type: ignore[assignment]
        for k, saved in enumerate(meta["snapshots"]):
            snapshot = FrozenSnapshot(self.learner, saved["name"])
            prefix = f"{k}/"
            snapshot.set_policy_tensors({n.removeprefix(prefix): t for n, t in tensors.items() if n.startswith(prefix)})
            restore_generator(snapshot._rng, saved["rng"], f"snapshot {saved['name']!r}")
            self.snapshots.append(snapshot)
        self.iterations, self.taken = int(meta["iterations"]), int(meta["taken"])
        restore_generator(self._rng, meta["rng"], f"opponent pool {self.name!r}")
        self.current = self.snapshots[int(meta["current"])]
