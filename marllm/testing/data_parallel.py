"""The conformance check that data parallelism changes nothing: two gloo ranks, each updating on its slice of every
turn, take the steps one process takes on the whole batch (:func:`check_two_ranks_equal_one_process`).

The learner is named by a reference to its factory (``package.module:function`` or ``file.py:function``), because
the ranks are other processes that build it again: ``factory(placement=..., **options)`` must build the same
learner, seeded alike, whether ``placement`` is None (whole models on one process) or a rank's
:class:`~marllm.parallel.placement.DataParallel`. The rollouts are played once, in this process, and each rank is
handed its equal, contiguous slice of each turn: the ranks compare updates, not samples.

The ranks are forked from this process on Linux (they start at once, with everything this process imported; a
process that has initialised CUDA spawns them instead, as other systems do, and a spawned rank imports the script
that runs the check anew: it needs the usual ``if __name__ == "__main__":`` guard). They meet in a gloo group
through a file store of their own, in a temporary directory where each reads ``job.pt`` and writes ``rank<r>.pt`` (or
``rank<r>.error``, its traceback). One rank that fails ends the others.
"""

from __future__ import annotations

import copy
import multiprocessing
import multiprocessing.connection
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from marllm.algorithms.rollout import Rollout
from marllm.parallel.distributed import WORLD_SIZE_VARIABLE, leave_ranks
from marllm.parallel.placement import DataParallel
from marllm.testing.conformance import Observation, _play
from marllm.utils.imports import load_reference

__all__ = ["check_two_ranks_equal_one_process", "run_ranks"]

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
    player = make(placement=None, **options)
    _play(player, observations, rewards)
    rollouts = player.rollouts
    # A fresh learner, as each rank's: playing advanced the player's generator, which also shuffles mini-batches.
    learner = make(placement=None, **options)
    single = _update(learner, copy.deepcopy(rollouts))
    with tempfile.TemporaryDirectory() as directory:
        torch.save({"factory": factory, "options": options, "rollouts": rollouts}, Path(directory) / "job.pt")
        run_ranks(_update_slice, directory, world_size, timeout)
        ranks = [torch.load(Path(directory) / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
    return _compare(learner.name, single, ranks)


def run_ranks(
    work: Callable[[str, DataParallel], None], directory: str | Path, world_size: int = 2, timeout: float = 600
) -> None:
    """``work(directory, placement)`` on ``world_size`` gloo ranks of this machine, each its own process (forked
    on Linux, see above), which meet through a file store in ``directory``; it returns once every rank has.
    ``placement`` is the rank's :class:`~marllm.parallel.placement.DataParallel`: its ``rank``, ``world_size`` and
    collectives. ``work`` must be a module-level function (a spawned rank imports it); ``directory`` is where the
    ranks read their job and write what they found.

    Raises:
        AssertionError: a rank failed (with its traceback; the other ranks are ended), or the ranks did not finish
            in ``timeout`` seconds (every rank is ended).
    """
    directory = str(directory)
    for rank in range(world_size):  # a failed launch's tracebacks would be read as this one's
        _error_file(directory, rank).unlink(missing_ok=True)
    # A store file of its own: a file store left by an earlier launch would hand this one its stale keys.
    store = Path(tempfile.mkdtemp(prefix="rendezvous-", dir=directory)) / "store"
    context = multiprocessing.get_context(_start_method())
    ranks = [context.Process(target=_rank, args=(work, directory, str(store), rank, world_size), name=f"rank{rank}")
             for rank in range(world_size)]  # fmt: skip
    for process in ranks:
        process.start()
    deadline = time.monotonic() + timeout
    try:
        running = list(ranks)
        while running:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the data-parallel ranks did not finish in {timeout} s")
            multiprocessing.connection.wait([process.sentinel for process in running], timeout=left)
            running = [process for process in ranks if process.exitcode is None]
            if any(process.exitcode not in (None, 0) for process in ranks):
                raise AssertionError(_failure(directory, [process.exitcode for process in ranks]))
    finally:
        for process in ranks:
            if process.exitcode is None:
                process.kill()
            process.join()
        shutil.rmtree(store.parent, ignore_errors=True)


def _start_method() -> str:
    """``fork`` on Linux unless CUDA is initialised here (a forked child cannot use it), else ``spawn``."""
    if sys.platform.startswith("linux") and not torch.cuda.is_initialized():
        return "fork"
    return "spawn"


def _failure(directory: str, exit_codes: list[int | None]) -> str:
    """The failure of the rank that failed first: the earliest traceback written (each rank writes its own before it
    leaves the group, whose peers then fail in their collectives, which says nothing of the cause), with the exit
    codes of the ranks that have ended."""
    errors = {rank: _error_file(directory, rank) for rank in range(len(exit_codes))}
    written = [rank for rank, error in errors.items() if error.is_file()]
    failed = [rank for rank, code in enumerate(exit_codes) if code not in (None, 0)]
    first = min(written, key=lambda rank: errors[rank].stat().st_mtime_ns) if written else failed[0]
    told = errors[first].read_text()[-4000:] if first in written else "(it left no traceback)"
    code = f" (exit code {exit_codes[first]})" if exit_codes[first] is not None else ""
    others = ", ".join(f"rank {rank} (exit code {exit_codes[rank]})" for rank in failed if rank != first)
    after = f"; after it {others}" if others else ""
    return f"the data-parallel ranks failed: rank {first} failed first{code}{after}:\n{told}"


def _error_file(directory: str, rank: int) -> Path:
    """Where rank ``rank`` writes the traceback of its failure."""
    return Path(directory) / f"rank{rank}.error"


def _rank(work: Callable[[str, DataParallel], None], directory: str, store: str, rank: int, world_size: int) -> None:
    """One rank's process: joins the group through the file store ``store``, does its work, leaves the group. A
    failure's traceback is written before the group is left, which fails the peers' collectives: the first traceback
    written is the cause."""
    os.environ.update({WORLD_SIZE_VARIABLE: str(world_size), "RANK": str(rank), "LOCAL_RANK": str(rank)})
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", store=dist.FileStore(store, world_size), rank=rank, world_size=world_size)
        work(directory, DataParallel.of_default_group())
    except BaseException:
        _error_file(directory, rank).write_text(traceback.format_exc())
        raise
    finally:
        leave_ranks()


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


def _update_slice(directory: str, placement: DataParallel) -> None:
    """One rank's work: its slice of every turn of ``DIR/job.pt``, one update, and what it did into
    ``DIR/rank<r>.pt``."""
    job = torch.load(Path(directory) / "job.pt", weights_only=False)
    learner = load_reference(job["factory"])(placement=placement, **job["options"])
    rank, world_size = placement.rank, placement.world_size
    result = _update(learner, [rank_slice(rollout, rank, world_size) for rollout in job["rollouts"]])
    torch.save(result, Path(directory) / f"rank{rank}.pt")
