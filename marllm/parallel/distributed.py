"""Data-parallel training over torch.distributed: the rank a process plays and the collectives its learners need.

A run on N processes (``marllm train CONFIG --nproc N``, which runs torchrun, or ``torchrun -m marllm.cli train …``;
``accelerate launch --multi_gpu`` runs torchrun too) plays every batch of B dialogues as N slices of
B/N, one per rank. The learners of each rank keep their own rollouts and compute over the global batch what PPO
computes over a batch (score statistics, advantage whitening, the KL fed to the controller, the loss normalisers),
sum their gradients across ranks before each optimiser step, and so stay in step: N ranks train as one process with
the whole batch would. :class:`Ranks` holds the collectives for that, which the run's placement
(:class:`~marllm.parallel.placement.DataParallel`) uses; on a single process nothing here runs. With ``model.fsdp``
the models themselves are sharded over the ranks as well (:mod:`marllm.parallel.sharding`).

Why not ``DistributedDataParallel``: DDP all-reduces in backward hooks on every backward pass, while a PPO optimiser
step sums several mini-batch backwards with weights that depend on the whole step, and learners sharing one LoRA base
would need the same module wrapped twice. One all-reduce of the accumulated gradients per optimiser step (as
CleanRL's multi-GPU PPO does) is both simpler and fewer collectives.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
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


def join_ranks(device: str) -> Ranks | None:
    """Join the process group of a run started by torchrun (None for a single process).

    The backend follows the model's device (``model.device``): gloo for ``cpu``, NCCL for ``auto`` or CUDA where
    CUDA is present, each rank then taking the GPU of its ``LOCAL_RANK``. The rendezvous (``MASTER_ADDR``,
    ``MASTER_PORT``, ``RANK``) is the launcher's.
    """
    if launched_world_size() <= 1:
        return None
    if not dist.is_initialized():
        cuda = device != "cpu" and torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
    return Ranks.of_default_group()


def leave_ranks() -> None:
    """Leave the process group that :func:`join_ranks` joined."""
    if dist.is_initialized():
        dist.destroy_process_group()


@dataclass(frozen=True)
class Ranks:
    """This process's place among the ranks of a data-parallel run, and the collectives over their process group.

    Every method is a collective: each rank must call it, in the same order, with tensors of the same shape.

    Attributes:
        rank: this process's index, 0 … world_size − 1; rank 0 alone writes the run directory.
        world_size: the number of processes.
        device: where collective buffers live (CPU for gloo, this rank's GPU for NCCL).
    """

    rank: int
    world_size: int
    device: torch.device = torch.device("cpu")

    @classmethod
    def of_default_group(cls) -> Ranks:
        """The rank and size of torch.distributed's initialised default process group."""
        nccl = dist.get_backend() == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        return cls(dist.get_rank(), dist.get_world_size(), device)

    @property
    def is_main(self) -> bool:
        """Rank 0, the one that writes logs and checkpoints."""
        return self.rank == 0

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        dist.barrier()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``tensor`` over the ranks (a new tensor on ``tensor``'s device and dtype)."""
        buffer = tensor.detach().to(self.device, copy=True)
        dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
        return buffer.to(tensor.device)

    def mean(self, value: float) -> float:
        """The mean of a number over the ranks."""
        total = self.all_reduce_sum(torch.tensor([value], dtype=torch.float64))
        return float(total[0]) / self.world_size

    def weighted_mean(self, value: float, weight: float) -> float:
        """Σ value·weight / Σ weight over the ranks (0 when every weight is 0)."""
        totals = self.all_reduce_sum(torch.tensor([value * weight, weight], dtype=torch.float64))
        return float(totals[0] / totals[1]) if totals[1] > 0 else 0.0

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on at least one rank."""
        return bool(self.all_reduce_sum(torch.tensor([float(flag)]))[0] > 0)

    def gather(self, values: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """Every rank's ``values`` (same shape on every rank) concatenated along the first axis in rank order: the
        global batch, in the order one process would hold it. Returns the type it was given."""
        tensor = torch.as_tensor(values)
        parts = [torch.empty_like(tensor, device=self.device) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.to(self.device))
        joined = torch.cat(parts).to(tensor.device)
        return joined.numpy() if isinstance(values, np.ndarray) else joined

    def global_rows(self, segments: Sequence[int]) -> np.ndarray:
        """Where each of this rank's rows sits in the global batch one process would hold, for a batch made of
        segments (a learner's turns of an iteration, merged): this rank's slice of each segment, in order.

        One process holds the segments one after another, each in rank order; see :func:`segment_rows`. Every rank
        must hold the same number of segments.
        """
        sizes = self.gather(np.asarray(segments, dtype=np.int64)).reshape(self.world_size, len(segments))
        return segment_rows(sizes, self.rank)

    def gather_rows(self, values: np.ndarray | torch.Tensor, rows: np.ndarray) -> np.ndarray | torch.Tensor:
        """Every rank's ``values`` (one per local row) in global order: value ``i`` of a rank goes to its
        ``rows[i]`` (:meth:`global_rows`). Returns the type it was given."""
        gathered = self.gather(values)
        everywhere = self.gather(np.asarray(rows, dtype=np.int64))
        ordered = gathered.copy() if isinstance(gathered, np.ndarray) else gathered.clone()
        ordered[everywhere] = gathered
        return ordered

    def mean_metrics(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Each metric's mean over the ranks that report it (on equal slices, a batch mean's global value)."""
        everyone: list[dict[str, float] | None] = [None] * self.world_size
        dist.all_gather_object(everyone, dict(metrics))
        keys = dict.fromkeys(key for reported in everyone if reported for key in reported)
        return {
            key: float(np.mean([reported[key] for reported in everyone if reported and key in reported]))
            for key in keys
        }

    def broadcast_(self, tensors: Iterable[torch.Tensor]) -> None:
        """Overwrite ``tensors`` in place with rank 0's values (parameters that must start equal on every rank)."""
        for tensor in tensors:
            buffer = tensor.detach().to(self.device, copy=True)
            dist.broadcast(buffer, src=0)
            with torch.no_grad():
                tensor.copy_(buffer.to(tensor.device))

    def sum_gradients_(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Replace each parameter's gradient by its sum over the ranks, in one all-reduce of a flat buffer.

        A rank whose mini-batches had no sample of this step contributes zeros. A parameter with no gradient on any
        rank keeps none, so that the optimiser skips it as it would in one process.
        """
        parameters = list(parameters)
        if not parameters:
            return
        flat = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), device=p.device, dtype=p.dtype)
                for p in parameters]
        has_gradient = torch.tensor([float(p.grad is not None) for p in parameters], device=parameters[0].device)
        dtype = torch.promote_types(torch.float32, flat[0].dtype)
        buffer = torch.cat([part.to(dtype) for part in flat] + [has_gradient.to(dtype)])
        summed = self.all_reduce_sum(buffer)
        counts = summed[-len(parameters) :]
        offset = 0
        for parameter, count in zip(parameters, counts, strict=True):
            size = parameter.numel()
            if count > 0:
                parameter.grad = summed[offset : offset + size].view_as(parameter).to(parameter.dtype)
            offset += size


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
