"""Fully sharded models (FSDP2, ``torch.distributed.fsdp.fully_shard``) for a data-parallel run with ``model.fsdp``.

Each rank then holds 1/N of every policy's parameters, gradients and Adam state, and of the shared reference's
parameters, and all-gathers one transformer block at a time for a forward or backward. Every parameter of a sharded
module is a ``DTensor`` whose global shape and name are those of the unsharded model, so shapes check and
checkpoints name as before; :func:`gathered` makes the full tensors (a collective) and :func:`local_part` takes a
rank's part of one again.

FSDP's collectives put two rules on the learners, which they follow when their model is sharded:

- every rank runs every forward and backward, in the same order: a rank with no row in a mini-batch runs a stand-in
  row with weight 0, and a rank whose loss is not finite still runs its backward (the step is then dropped on all);
- generation goes on until every rank's batch has finished (``generate`` does this, ``synced_gpus``, for a model
  FSDP manages).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

if TYPE_CHECKING:  # placement.py builds on this module
    from marllm.parallel.placement import DataParallel

_ONE_UNIT_WARNING = 10_000_000  # parameters: below, a model is small enough to gather whole (a value head, a test's)


def shard_module(module: nn.Module, placement: DataParallel, compute_dtype: torch.dtype | None = None) -> nn.Module:
    """Shard ``module`` over the ranks of ``placement`` in place (FSDP2) and return it.

    The parameters must be equal on every rank (:meth:`~marllm.parallel.placement.Sharded.prepare` broadcasts rank
    0's first). Each block the model names unsplittable (transformers' ``_no_split_modules``: GPT-2's ``GPT2Block``,
    Llama's ``LlamaDecoderLayer``, …) is sharded as one unit, and the rest (embeddings, final norm, LM head, or a
    value head) as the root. The shards move to the rank's device (``placement.device``), so a model may be loaded on
    the CPU and reach its GPU a shard at a time.
    ``compute_dtype`` (e.g. bfloat16): the weights are gathered in it for forwards and backwards, while the shards
    keep their dtype and gradients are summed in float32 (FSDP's ``MixedPrecisionPolicy``); None computes in the
    shards' dtype.
    """
    mesh = init_device_mesh(placement.device.type, (placement.world_size,))
    blocks = set(getattr(module, "_no_split_modules", None) or ())
    if not blocks and sum(p.numel() for p in module.parameters()) > _ONE_UNIT_WARNING:
        warnings.warn(
            f"{type(module).__name__} names no _no_split_modules: it is sharded as one unit, so every forward "
            "gathers the whole model",
            RuntimeWarning,
            stacklevel=2,
        )
    precision = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32 if compute_dtype else None)
    # Resharding after forward, root included (FSDP's default keeps the root's parameters whole after a forward),
    # so that between calls every parameter is its DTensor shard: what the optimiser and checkpoints hold.
    for child in module.modules():
        if child is not module and type(child).__name__ in blocks:
            fully_shard(child, mesh=mesh, reshard_after_forward=True, mp_policy=precision)
    fully_shard(module, mesh=mesh, reshard_after_forward=True, mp_policy=precision)
    # A learner's loss weights already sum to the global batch's normaliser over the ranks: gradients are summed,
    # not averaged. Sum-reduction also keeps gloo working (a divide factor would ask for PREMUL_SUM, NCCL only).
    # Both settings are per sharded unit, not inherited.
    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
    return module


@contextlib.contextmanager
def whole_for_generation(module: nn.Module) -> Iterator[None]:
    """Within the block, keep a sharded model's weights gathered: each unit all-gathers once for the block, not at
    every forward of it (one per generated token), and its shards come back at the end. The rank then holds the
    whole model in its compute dtype for that time. (Without it, generation runs sharded: an all-gather per unit per
    token, for a model whose weights do not fit one device whole.)"""
    units = [unit for unit in module.modules() if isinstance(unit, FSDPModule)]
    if not units:
        yield
        return
    changed: list[FSDPModule] = []
    try:
        for unit in units:
            changed.append(unit)
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
        yield
    finally:  # also after a failed gather (out of memory): every unit changed goes back to its shards
        for unit in changed:
            unit.reshard()
            unit.set_reshard_after_forward(True, recurse=False)


def is_sharded(module: nn.Module | None) -> bool:
    """Whether ``module`` was sharded by :func:`shard_module` (FSDP2)."""
    return isinstance(module, FSDPModule)


@torch.no_grad()
def gathered(tensors: Mapping[str, torch.Tensor], keep: bool = True) -> dict[str, torch.Tensor]:
    """``tensors`` with every sharded one (``DTensor``) replaced by its full tensor on the CPU; the others as they
    are.

    The sharded tensors are gathered one at a time and moved off the device at once, so that a device holds one
    whole tensor at most. A ``DTensor`` given under several names (tied weights, from ``state_dict(keep_vars=True)``)
    is gathered once and shared by its names, as the unsharded model shares it. ``keep=False``: take part in the
    gathers and keep none (a rank that does not write); the result then holds the unsharded tensors alone. A
    collective for sharded tensors: every rank must call it with the same names in the same order.
    """
    wholes: dict[int, torch.Tensor | None] = {}  # by the identity of the sharded tensor: one gather each, on all ranks
    result = {}
    for name, tensor in tensors.items():
        if not isinstance(tensor, DTensor):
            result[name] = tensor
            continue
        if id(tensor) not in wholes:
            whole = tensor.full_tensor()
            wholes[id(tensor)] = whole.cpu() if keep else None
            del whole
        if keep:
            result[name] = wholes[id(tensor)]
    return result


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The full value of a sharded tensor (a collective), or ``tensor`` itself."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def local_part(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``full`` laid out as ``like``: this rank's shard of it where ``like`` is sharded (every rank holds ``full``,
    so nothing is sent), else ``full``; on ``like``'s device and dtype."""
    if not isinstance(like, DTensor):
        return full.to(like.device, like.dtype)
    full = full.to(like.device_mesh.device_type, like.dtype)
    return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)


@torch.no_grad()
def load_full_state_(module: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy the full tensors of ``state`` (names as ``module.state_dict()``) into ``module``'s parameters and
    buffers, sharded or not. Names must match; shapes are the caller's to check."""
    for name, tensor in module.state_dict().items():
        tensor.copy_(local_part(state[name], tensor))
