"""Where a run's models live across processes, chosen once at setup: the object that learners, collectors and
checkpoints ask instead of carrying flags.

- :class:`Placement`: whole models on one process. Every method is trivial (a collective of one).
- :class:`DataParallel`: whole models on each of several ranks, each rank playing a slice of every batch; batch
  statistics and gradients are summed over the ranks, whose collectives it holds.
- :class:`Sharded`: data-parallel with every model sharded over the ranks (FSDP2, :mod:`marllm.parallel.sharding`):
  every rank then runs every forward and backward, and a checkpoint gathers the full tensors.

A learner settles what depends on the placement when it is built (the rows per update pass and whether the rollout
is taken from ``generate``'s forwards: :meth:`Placement.rows_per_pass`, :meth:`Placement.rollout_from_generate`), not
at each call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Self, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from marllm.parallel.distributed import leave_ranks, segment_rows
from marllm.parallel.sharding import full_tensor, gathered, is_sharded, shard_module, whole_for_generation

__all__ = ["DataParallel", "Placement", "Sharded"]

Values = TypeVar("Values", np.ndarray, torch.Tensor)
Module = TypeVar("Module", bound=nn.Module)


class Placement:
    """Whole models on one process: what a learner asks of its placement, each answer the trivial one.

    Attributes (class-level, the facts a strategy states):
        whole_models: each process holds whole models (settings that need them, such as ``autocast_dtype``, apply).
        lockstep: every rank must run every forward and backward, in the same order (a rank with no row of a
            mini-batch stands in; every rank joins an export and the end-of-run evaluation).
        shares_prefix: forwards may run the prompts' common beginning once over a shared cache (a process choosing
            its own forwards).
        fused_optimizer: Adam may run fused (``ppo.compute.fused_kernels``).
        stochastic_rounding: a full bfloat16 model may be trained with stochastic rounding.
        rank: this process's rank (0 alone).
        world_size: the number of processes that share each batch.
    """

    whole_models = True
    lockstep = False
    shares_prefix = True
    fused_optimizer = True
    stochastic_rounding = True
    rank = 0
    world_size = 1

    @property
    def writes(self) -> bool:
        """Whether this process writes files (logs, checkpoints, exports): one process, or rank 0."""
        return self.rank == 0

    # ----------------------------------------------------------------------------- settled when a learner is built
    @classmethod
    def rows_per_pass(cls, setting: int | Literal["auto"] | None, auto: int) -> int | None:
        """The rows per update pass for ``ppo.compute.micro_batch_size`` ``setting``: ``auto`` rows for ``"auto"``."""
        return auto if setting == "auto" else setting

    @classmethod
    def rollout_from_generate(cls, setting: bool | Literal["auto"]) -> bool:
        """Whether the rollout is taken from ``generate``'s forwards for ``ppo.compute.rollout_from_generate``
        ``setting``: yes for ``"auto"``."""
        return True if setting == "auto" else bool(setting)

    # ------------------------------------------------------------------------------------------------ models
    def load_device(self, device: str) -> str:
        """Where a model placed on ``device`` is loaded before :meth:`prepare`: ``device`` itself."""
        return device

    def prepare(self, module: Module) -> Module:
        """``module`` made ready to train or act under this placement (as it is)."""
        return module

    def start_equal(self, parameters: Iterable[nn.Parameter]) -> None:
        """Make ``parameters`` start equal on every rank (nothing to do on one process)."""

    def generating(self, model: nn.Module) -> AbstractContextManager[None]:
        """A block around ``generate`` calls of ``model`` (nothing on one process)."""
        return contextlib.nullcontext()

    # ------------------------------------------------------------------------------------------ update steps
    def sum_gradients_(self, parameters: Iterable[nn.Parameter]) -> None:
        """Sum the parameters' gradients over the ranks before an optimiser step (nothing on one process)."""

    def gradient_norm(self, parameters: Sequence[nn.Parameter], max_norm: float | None) -> torch.Tensor:
        """The global norm of the parameters' gradients, having clipped them to ``max_norm`` where it is set."""
        if max_norm is not None:
            return nn.utils.clip_grad_norm_(parameters, max_norm)
        grads = [p.grad.norm() for p in parameters if p.grad is not None]
        return torch.linalg.vector_norm(torch.stack(grads)) if grads else torch.tensor(0.0)

    # ----------------------------------------------------------------------------- statistics of the batch
    @property
    def sum_over_ranks(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The element-wise sum of a tensor over the ranks, for statistics of the global batch (advantage
        whitening); None where this process's batch is the whole batch (the statistics are then computed locally)."""
        return None

    def mean(self, value: float) -> float:
        """The mean of a number over the ranks."""
        return value

    def weighted_mean(self, value: float, weight: float) -> float:
        """Σ value·weight / Σ weight over the ranks (``value`` on one process)."""
        return value

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on at least one rank."""
        return flag

    def mean_metrics(self, metrics: Mapping[str, float]) -> Mapping[str, float]:
        """Each metric's mean over the ranks that report it."""
        return metrics

    def global_rows(self, segments: Sequence[int]) -> np.ndarray:
        """Where each of this process's rows sits in the global batch, for a batch made of ``segments`` (a learner's
        turns of an iteration, merged): here, where it is."""
        return np.arange(sum(segments))

    def gather_rows(self, values: Values, rows: np.ndarray) -> Values:
        """Every rank's ``values`` (one per local row) in global order (:meth:`global_rows`): ``values``."""
        return values

    # ------------------------------------------------------------------------------------------- checkpoints
    def full_state(self, tensors: Mapping[str, torch.Tensor], keep: bool = True) -> dict[str, torch.Tensor]:
        """``tensors`` as full tensors to save (``keep=False``: take part in the gathering and keep none)."""
        return dict(tensors) if keep else {}

    def exported_state(
        self, model: nn.Module, tensors: Mapping[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor] | None, dict[str, torch.Tensor]] | None:
        """What an export writes: the model's weights (None: the model saves its own) and ``tensors``, full; None on
        a rank that writes nothing."""
        return None, dict(tensors)

    # ------------------------------------------------------------------------------------------------- a run
    def env_shard(self) -> tuple[int, int]:
        """The slice of each batch this process plays: (rank, world size)."""
        return self.rank, self.world_size

    def barrier(self) -> None:
        """Wait until every rank gets here."""

    def reseed_sampling(self, seed: int, iteration: int = 0) -> None:
        """Give this rank its own stream of torch's generator, which samples the responses (rank 0 keeps one
        process's)."""

    def close(self) -> None:
        """Leave the ranks' process group (nothing on one process)."""


@dataclass(frozen=True)
class DataParallel(Placement):
    """Whole models on each of the ranks of a torch.distributed process group, each rank playing its slice of every
    batch: the learners compute over the global batch what one process computes over a batch, and sum their gradients
    over the ranks before each optimiser step (once per step, not in backward hooks as ``DistributedDataParallel``
    does: :mod:`marllm.parallel.distributed`).

    The placement is this process's place among the ranks, and the collectives over their process group: every
    collective must be called by each rank, in the same order, with tensors of the same shape.

    Attributes:
        rank: this process's index, 0 … world_size − 1; rank 0 alone writes the run directory.
        world_size: the number of processes.
        device: where collective buffers live (CPU for gloo, this rank's GPU for NCCL).
    """

    # field(): required, not defaulting to the class attributes Placement states for one process.
    rank: int = field()
    world_size: int = field()
    device: torch.device = torch.device("cpu")

    @classmethod
    def of_default_group(cls, **options: Any) -> Self:
        """This placement over torch.distributed's initialised default process group
        (:func:`~marllm.parallel.distributed.join_ranks`), with ``options`` (a subclass's fields)."""
        nccl = dist.get_backend() == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        return cls(dist.get_rank(), dist.get_world_size(), device, **options)

    def start_equal(self, parameters: Iterable[nn.Parameter]) -> None:
        """Overwrite ``parameters`` in place with rank 0's values."""
        for tensor in parameters:
            buffer = tensor.detach().to(self.device, copy=True)
            dist.broadcast(buffer, src=0)
            with torch.no_grad():
                tensor.copy_(buffer.to(tensor.device))

    def sum_gradients_(self, parameters: Iterable[nn.Parameter]) -> None:
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
        summed = self._sum(buffer)
        counts = summed[-len(parameters) :]
        offset = 0
        for parameter, count in zip(parameters, counts, strict=True):
            size = parameter.numel()
            if count > 0:
                parameter.grad = summed[offset : offset + size].view_as(parameter).to(parameter.dtype)
            offset += size

    @property
    def sum_over_ranks(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The element-wise sum of a tensor over the ranks (a new tensor on the tensor's device and dtype)."""
        return self._sum

    def _sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``tensor`` over the ranks (:attr:`sum_over_ranks`)."""
        buffer = tensor.detach().to(self.device, copy=True)
        dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
        return buffer.to(tensor.device)

    def mean(self, value: float) -> float:
        """The mean of a number over the ranks."""
        total = self._sum(torch.tensor([value], dtype=torch.float64))
        return float(total[0]) / self.world_size

    def weighted_mean(self, value: float, weight: float) -> float:
        """Σ value·weight / Σ weight over the ranks (0 when every weight is 0)."""
        totals = self._sum(torch.tensor([value * weight, weight], dtype=torch.float64))
        return float(totals[0] / totals[1]) if totals[1] > 0 else 0.0

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on at least one rank."""
        return bool(self._sum(torch.tensor([float(flag)]))[0] > 0)

    def mean_metrics(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Each metric's mean over the ranks that report it (on equal slices, a batch mean's global value)."""
        everyone: list[dict[str, float] | None] = [None] * self.world_size
        dist.all_gather_object(everyone, dict(metrics))
        keys = dict.fromkeys(key for reported in everyone if reported for key in reported)
        return {
            key: float(np.mean([reported[key] for reported in everyone if reported and key in reported]))
            for key in keys
        }

    def global_rows(self, segments: Sequence[int]) -> np.ndarray:
        """Where each of this rank's rows sits in the global batch one process would hold, for a batch made of
        segments (a learner's turns of an iteration, merged): this rank's slice of each segment, in order.

        One process holds the segments one after another, each in rank order; see
        :func:`~marllm.parallel.distributed.segment_rows`. Every rank must hold the same number of segments.
        """
        sizes = self._gather(np.asarray(segments, dtype=np.int64)).reshape(self.world_size, len(segments))
        return segment_rows(sizes, self.rank)

    def gather_rows(self, values: Values, rows: np.ndarray) -> Values:
        """Every rank's ``values`` (one per local row) in global order: value ``i`` of a rank goes to its
        ``rows[i]`` (:meth:`global_rows`). Returns the type it was given."""
        gathered = self._gather(values)
        everywhere = self._gather(np.asarray(rows, dtype=np.int64))
        ordered = gathered.copy() if isinstance(gathered, np.ndarray) else gathered.clone()
        ordered[everywhere] = gathered
        return ordered

    def _gather(self, values: Values) -> Values:
        """Every rank's ``values`` (same shape on every rank) concatenated along the first axis in rank order: the
        global batch, in the order one process would hold it. Returns the type it was given."""
        tensor = torch.as_tensor(values)
        parts = [torch.empty_like(tensor, device=self.device) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.to(self.device))
        joined = torch.cat(parts).to(tensor.device)
        return joined.numpy() if isinstance(values, np.ndarray) else joined

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        dist.barrier()

    def reseed_sampling(self, seed: int, iteration: int = 0) -> None:
        """Each rank but 0 samples from a stream of its own: a function of the seed, the rank and the iteration it
        starts from. Checkpoints hold rank 0's generator only, so a resumed run's other ranks sample anew."""
        if self.rank > 0:
            torch.manual_seed(int(np.random.SeedSequence([seed, self.rank, iteration]).generate_state(1)[0]))

    def close(self) -> None:
        """Leave the ranks' process group."""
        leave_ranks()


@dataclass(frozen=True)
class Sharded(DataParallel):
    """Data-parallel with every model sharded over the ranks (``model.fsdp``; :mod:`marllm.parallel.sharding`): each
    rank holds 1/N of every policy's and reference's parameters, gradients and Adam state. FSDP reduces the gradients
    itself, and its collectives ask every rank to run every forward and backward.

    Attributes:
        compute_dtype: the dtype the sharded models compute in (None: their own).
        gather_for_generation: gather each model whole for a ``generate`` call (else layer by layer at every token).
    """

    compute_dtype: torch.dtype | None = None
    gather_for_generation: bool = True

    whole_models = False
    lockstep = True
    shares_prefix = False
    fused_optimizer = False
    stochastic_rounding = False

    @classmethod
    def rows_per_pass(cls, setting: int | Literal["auto"] | None, auto: int) -> int | None:
        """The whole mini-batch in one pass for ``"auto"`` (every rank must run every pass)."""
        return None if setting == "auto" else setting

    @classmethod
    def rollout_from_generate(cls, setting: bool | Literal["auto"]) -> bool:
        """No for ``"auto"``: a sharded ``generate`` keeps stepping ranks that are done."""
        return False if setting == "auto" else bool(setting)

    def load_device(self, device: str) -> str:
        """The CPU: the shards reach the rank's device one at a time."""
        return "cpu"

    def prepare(self, module: Module) -> Module:
        """``module`` sharded over the ranks (once: a shared reference may be sharded already)."""
        if is_sharded(module):
            return module
        super().start_equal(module.parameters())  # before sharding: whole parameters, rank 0's everywhere
        return shard_module(module, self, self.compute_dtype)  # type: ignore[return-value]

    def start_equal(self, parameters: Iterable[nn.Parameter]) -> None:
        """Nothing: :meth:`prepare` started the shards from rank 0's parameters."""

    def generating(self, model: nn.Module) -> AbstractContextManager[None]:
        """``model``'s weights gathered whole for the block (with ``gather_for_generation``)."""
        return whole_for_generation(model) if self.gather_for_generation else contextlib.nullcontext()

    def sum_gradients_(self, parameters: Iterable[nn.Parameter]) -> None:
        """Nothing: FSDP has summed the sharded gradients in the backward."""

    def gradient_norm(self, parameters: Sequence[nn.Parameter], max_norm: float | None) -> torch.Tensor:
        """The global norm over the sharded gradients (a collective), made whole."""
        if max_norm is not None:
            norm = nn.utils.clip_grad_norm_(parameters, max_norm)
        else:
            norm = nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])
        return full_tensor(norm)

    def full_state(self, tensors: Mapping[str, torch.Tensor], keep: bool = True) -> dict[str, torch.Tensor]:
        """The sharded tensors gathered whole onto the CPU (:func:`~marllm.parallel.sharding.gathered`): a
        collective, every rank calling it with the same names in the same order."""
        return gathered(tensors, keep)

    def exported_state(
        self, model: nn.Module, tensors: Mapping[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor] | None, dict[str, torch.Tensor]] | None:
        """Gathered by every rank, kept by rank 0 alone; parameters as themselves (``keep_vars``), so that tied
        weights stay one tensor and are saved once."""
        weights = gathered(model.state_dict(keep_vars=True), self.writes)
        full = gathered(tensors, self.writes)
        return (weights, full) if self.writes else None
