"""The conformance check that data parallelism changes nothing: two gloo ranks, each updating on its slice of every
turn, take the steps one process takes on the whole batch (:func:`check_two_ranks_equal_one_process`).

The learner is named by a reference to its factory (``package.module:function`` or ``file.py:function``), because
the ranks are other processes (started by torchrun) that build it again: ``factory(data_parallel=..., **options)``
must build the same learner, seeded alike, whether ``data_parallel`` is None (one process) or a rank's
:class:`~marllm.parallel.distributed.DataParallel`. The rollouts are played once, in this process, and each rank is
handed its equal, contiguous slice of each turn: the ranks compare updates, not samples.

Run as ``python -m torch.distributed.run --nproc-per-node N -m marllm.testing.data_parallel DIR`` by the check itself;
each rank reads ``DIR/job.pt`` and writes ``DIR/rank<r>.pt``.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from marllm.algorithms.rollout import Rollout
from marllm.parallel.distributed import init_data_parallel
from marllm.testing.conformance import Observation, _play
from marllm.utils.imports import load_reference

__all__ = ["check_two_ranks_equal_one_process"]

ZERO_GRADIENT = 1e-9
"""A gradient element below this at every step is zero up to rounding; Adam turns its rounding noise into steps of
lr·g/ε, so its parameter is compared through its gradient only."""


def check_two_ranks_equal_one_process(
    factory: str,
    observations: Sequence[Observation],
    rewards: Sequence[Sequence[float]],
    options: Mapping[str, Any] | None = None,
    world_size: int = 2,
    timeout: float = 600,
) -> float:
    """One update on one process, and on ``world_size`` gloo ranks each holding its slice of every turn of
    ``observations`` (each turn's prompts must split evenly, and a learner that compares groups needs whole groups
    in each slice): every optimiser step is handed the same gradient (within 1e-4 of its largest component; 1e-6
    between the ranks), and the trained parameters end the same (rtol 1e-4, atol 2e-5). Returns the largest
    parameter difference from one process.

    Raises:
        AssertionError: naming the step or parameter that differs, or the ranks' own error (or their timeout).
        ValueError: a turn whose prompts do not split into ``world_size`` equal slices.
    """
    options = dict(options or {})
    for observation in observations:
        if len(observation["prompt"]) % world_size:
            raise ValueError(f"a turn of {len(observation['prompt'])} prompts does not split over {world_size} ranks")
    make = load_reference(factory)
    player = make(data_parallel=None, **options)
    _play(player, observations, rewards)
    rollouts = player.rollouts
    # A fresh learner, as each rank's: playing advanced the player's generator, which also shuffles mini-batches.
    learner = make(data_parallel=None, **options)
    single = _update(learner, copy.deepcopy(rollouts))
    with tempfile.TemporaryDirectory() as directory:
        torch.save({"factory": factory, "options": options, "rollouts": rollouts}, Path(directory) / "job.pt")
        _launch(directory, world_size, timeout)
        ranks = [torch.load(Path(directory) / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
    return _compare(learner.name, single, ranks)


def _launch(directory: str, world_size: int, timeout: float) -> None:
    """The ranks, started by torchrun on this machine; the factory's module found from the working directory."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
               "-m", "marllm.testing.data_parallel", directory]  # fmt: skip
    path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as error:
        raise AssertionError(f"the data-parallel ranks did not finish in {timeout} s") from error
    if done.returncode != 0:
        raise AssertionError(f"the data-parallel ranks failed (exit {done.returncode}):\n{done.stderr[-4000:]}")


def _update(learner: Any, rollouts: list[Rollout]) -> dict[str, list[torch.Tensor]]:
    """One update on ``rollouts``: the gradient handed to each optimiser step (flattened) and the trained parameters
    after it."""
    recorded: list[torch.Tensor] = []
    parameters = learner._trained_parameters()
    step = learner.optimizer.step

    def recording_step(*args: Any, **kwargs: Any) -> Any:
        grads = [torch.zeros_like(p).flatten() if p.grad is None else p.grad.flatten() for p in parameters]
        recorded.append(torch.cat(grads).detach().clone())
        return step(*args, **kwargs)

    learner.optimizer.step = recording_step
    learner.rollouts = rollouts
    learner.update()
    return {"gradients": recorded, "parameters": [p.detach().clone() for p in parameters]}


def _compare(name: str, single: dict[str, list[torch.Tensor]], ranks: list[dict[str, list[torch.Tensor]]]) -> float:
    steps = single["gradients"]
    for rank, found in enumerate(ranks):
        if len(found["gradients"]) != len(steps):
            raise AssertionError(f"{name}: rank {rank} took {len(found['gradients'])} steps, one process {len(steps)}")
        for index, (expected, got) in enumerate(zip(steps, found["gradients"], strict=True)):
            scale = float(expected.abs().max()) or 1.0
            off = float((got - expected).abs().max())
            between = float((got - ranks[0]["gradients"][index]).abs().max())
            if off > 1e-4 * scale or between > 1e-6 * scale:
                raise AssertionError(
                    f"{name}: step {index}'s gradient on rank {rank} is {off:.3g} from one process's (largest "
                    f"component {scale:.3g}) and {between:.3g} from rank 0's: the ranks do not sum to one process"
                )
    used = torch.stack(steps).abs().amax(0) >= ZERO_GRADIENT if steps else None
    largest, offset = 0.0, 0
    for index, expected in enumerate(single["parameters"]):
        size = expected.numel()
        mask = torch.ones_like(expected, dtype=torch.bool) if used is None else used[offset : offset + size]
        offset += size
        for rank, found in enumerate(ranks):
            got = found["parameters"][index]
            try:
                torch.testing.assert_close(got[mask.reshape(got.shape)], expected[mask.reshape(got.shape)],
                                           rtol=1e-4, atol=2e-5)  # fmt: skip
            except AssertionError as error:
                raise AssertionError(f"{name}: parameter {index} on rank {rank} after the update: {error}") from None
            compared = (got - expected)[mask.reshape(got.shape)].abs()
            largest = max(largest, float(compared.max()) if compared.numel() else 0.0)
    return largest


def rank_slice(rollout: Rollout, rank: int, world_size: int) -> Rollout:
    """The ``rank``-th of ``world_size`` equal, contiguous slices of a rewarded rollout."""
    size = len(rollout.responses) // world_size
    rows = slice(rank * size, (rank + 1) * size)
    part = copy.copy(rollout)
    part.prompts, part.responses = rollout.prompts[rows], rollout.responses[rows]
    part.tensors = rollout.tensors[rows]
    part.received_rewards = rollout.received_rewards[rows]  # type: ignore[index]
    part.task_rewards = rollout.task_rewards[rows]  # type: ignore[index]
    return part


def main(directory: str) -> None:
    """One rank: its slice of every turn of ``DIR/job.pt``, one update, and what it did into ``DIR/rank<r>.pt``."""
    torch.set_num_threads(1)
    data_parallel = init_data_parallel("cpu")
    if data_parallel is None:
        raise SystemExit("run me under torchrun with 2 or more processes")
    job = torch.load(Path(directory) / "job.pt", weights_only=False)
    learner = load_reference(job["factory"])(data_parallel=data_parallel, **job["options"])
    rank, world_size = data_parallel.rank, data_parallel.world_size
    result = _update(learner, [rank_slice(rollout, rank, world_size) for rollout in job["rollouts"]])
    torch.save(result, Path(directory) / f"rank{rank}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:])
