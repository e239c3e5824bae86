"""Data-parallel training over torch.distributed: joining the ranks' process group, and where a rank's rows sit.

A run on N processes (``marllm train CONFIG --nproc N``, which runs torchrun, or ``torchrun -m marllm.cli train …``;
``accelerate launch --multi_gpu`` runs torchrun too) plays every batch of B dialogues as N slices of
B/N, one per rank. The learners of each rank keep their own rollouts and compute over the global batch what PPO
computes over a batch (score statistics, advantage whitening, the KL fed to the controller, the loss normalisers),
sum their gradients across ranks before each optimiser step, and so stay in step: N ranks train as one process with
the whole batch would. The run's placement (:class:`~marllm.parallel.placement.DataParallel`) is this process's
rank of the group joined here, and holds the collectives for that; on a single process nothing here runs. With
``model.fsdp`` the models themselves are sharded over the ranks as well (:mod:`marllm.parallel.sharding`).

Why not ``DistributedDataParallel``: DDP all-reduces in backward hooks on every backward pass, while a PPO optimiser
step sums several mini-batch backwards with weights that depend on the whole step, and learners sharing one LoRA base
would need the same module wrapped twice. One all-reduce of the accumulated gradients per optimiser step (as
CleanRL's multi-GPU PPO does) is both simpler and fewer collectives.
"""

from __future__ import annotations

import os
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT = timedelta(hours=1)
"""How long a rank waits in a collective for the others: longer than torch's default (10 minutes for NCCL), as the
other ranks wait in their next collective while rank 0 writes a checkpoint or an export, which for several 7B models
with their Adam state is hundreds of GB."""

WORLD_SIZE_VARIABLE = "WORLD_SIZE"
"""The environment variable by which torchrun (and accelerate) tell a process how many ranks the run has."""


def launched_world_size() -> int:
    """How many processes the launcher started for this run (1 when it was not started by torchrun/accelerate)."""
    value = os.environ.get(WORLD_SIZE_VARIABLE, "1")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{WORLD_SIZE_VARIABLE}={value!r} is not a number of processes") from None


def launched_rank() -> int:
    """This process's rank among those the launcher started (0 when it was not started by torchrun/accelerate)."""
    value = os.environ.get("RANK", "0")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"RANK={value!r} is not a process rank") from None


def join_ranks(device: str) -> bool:
    """Join the process group of a run started by torchrun, and say whether this process is one of several ranks
    (False for a single process, which joins nothing; the placement of the ranks is then
    :meth:`DataParallel.of_default_group <marllm.parallel.placement.DataParallel.of_default_group>`).

    The backend follows the model's device (``model.device``): gloo for ``cpu``, NCCL for ``auto`` or CUDA where
    CUDA is present, each rank then taking the GPU of its ``LOCAL_RANK``. The rendezvous (``MASTER_ADDR``,
    ``MASTER_PORT``, ``RANK``) is the launcher's.
    """
    if launched_world_size() <= 1:
        return False
    if not dist.is_initialized():
        cuda = device != "cpu" and torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
    return True


def leave_ranks() -> None:
    """Leave the process group that :func:`join_ranks` joined."""
    if dist.is_initialized():
        dist.destroy_process_group()


def segment_rows(sizes: np.ndarray, rank: int) -> np.ndarray:
    """The global index of each of ``rank``'s rows, from every rank's segment sizes ``sizes`` (R, S).

    Rank r holds rows ``sizes[r, 0]`` of segment 0, then ``sizes[r, 1]`` of segment 1, and so on. One process would
    hold segment 0 whole (rank 0's rows, then rank 1's, …), then segment 1 whole, …: the global batch. With one
    segment this is ``rank``'s contiguous slice.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    segment_starts = np.concatenate([[0], np.cumsum(sizes.sum(axis=0))[:-1]])  # (S,)
    rank_starts = segment_starts + sizes[:rank].sum(axis=0)  # (S,) where this rank's slice of each begins
    return np.concatenate([start + np.arange(size) for start, size in zip(rank_starts, sizes[rank], strict=True)])
